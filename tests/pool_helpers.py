"""A small pool for tests: ClusterState builders shared by the snapshot, exporter and dashboard tests
(importable, unlike conftest)."""

from __future__ import annotations

from gpupool.core.model import GPU, Allocation, GPUGrant, GPURequest, Node, PodRequest
from gpupool.core.state import ClusterState

MEM = 40960  # MiB per GPU


def make_cluster(nodes: int = 2, gpus: int = 2) -> ClusterState:
    return ClusterState(
        Node(f"n{i}", 64000, 256000, tuple(GPU(f"GPU-{i}-{j}", j, "A100", MEM) for j in range(gpus)))
        for i in range(nodes)
    )


def give(state: ClusterState, key: str, node: str, gpu: int, milli: int, mem: int) -> None:
    i = state.index[node]
    grant = GPUGrant(state.nodes[i].gpus[gpu].uuid, gpu, milli, mem)
    assert state.allocate(PodRequest(key, gpu=GPURequest(1, milli, mem)), Allocation(key, node, (grant,))) is None
