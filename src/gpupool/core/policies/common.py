"""GPU choice inside a node, shared by the policies."""

from __future__ import annotations

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.state import BoolArray, ClusterState


def first_gpus(pod: PodRequest, gpu_fit: BoolArray) -> tuple[int, ...]:
    """The first `count` fitting GPUs in device order (how the trace's whole-GPU pods are placed)."""
    return tuple(int(j) for j in np.flatnonzero(gpu_fit)[: pod.gpu.count])


def tightest_gpus(state: ClusterState, pod: PodRequest, node: int, gpu_fit: BoolArray) -> tuple[int, ...]:
    """Best-fit GPU choice: a share goes to the fitting GPU with the least free compute (ties to the
    lower index); whole GPUs are the first free ones in device order."""
    if pod.gpu.whole or pod.gpu.count > 1:
        return first_gpus(pod, gpu_fit)
    candidates = np.flatnonzero(gpu_fit)
    free = state.gpu_milli_free[node, candidates]
    return (int(candidates[int(np.argmin(free))]),)
