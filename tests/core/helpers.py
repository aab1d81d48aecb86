"""Small builders for core tests."""

from __future__ import annotations

import numpy as np

from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.core.state import ClusterState


def node(name: str, gpus: int = 2, cpu: int = 64_000, mem: int = 256_000, model: str = "A100",
         gpu_mem: int = 40_960) -> Node:
    return Node(name, cpu, mem, tuple(GPU(f"{name}-g{j}", j, model, gpu_mem) for j in range(gpus)))


def share(key: str, milli: int, cpu: int = 1000, mem: int = 1000, models: frozenset[str] = frozenset()) -> PodRequest:
    return PodRequest(key, cpu, mem, GPURequest(count=1, milli=milli, models=models))


def whole(key: str, count: int, cpu: int = 1000) -> PodRequest:
    return PodRequest(key, cpu, 1000, GPURequest(count=count))


def set_free(state: ClusterState, node_name: str, frees: list[int]) -> None:
    """Consume compute so that the node's GPUs have exactly `frees` milli left (test set-up only)."""
    from gpupool.core.model import Allocation, GPUGrant

    i = state.index[node_name]
    for j, f in enumerate(frees):
        used = 1000 - f
        if used:
            g = state.nodes[i].gpus[j]
            pod = PodRequest(f"filler-{node_name}-{j}", 0, 0, GPURequest(1, used))
            err = state.allocate(pod, Allocation(pod.key, node_name, (GPUGrant(g.uuid, j, used, 0),)))
            assert err is None, err
    assert list(np.asarray(state.gpu_milli_free[i][: len(frees)])) == frees
