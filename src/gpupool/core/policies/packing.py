"""The packing family of baselines, as the FGD artifact scores them (integer node scores, 0-100):
BestFit, DotProd (Tetris-style dot product) and GPU Packing. Each places a share on the tightest GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gpupool.core.model import MILLI_PER_GPU, PodRequest
from gpupool.core.policies.common import tightest_gpus
from gpupool.core.policy import FloatArray, PolicyContext
from gpupool.core.state import BoolArray, ClusterState, IntArray

MAX_SPEC_CPU = 128_000.0  # the largest node of the trace: 128 cores ...
MAX_SPEC_GPU = 8_000.0  # ... and 8 GPUs, in milli


def _free_gpu_milli(state: ClusterState, nodes: IntArray) -> IntArray:
    ok = state.gpu_present[nodes] & state.gpu_healthy[nodes]
    result: IntArray = np.where(ok, state.gpu_milli_free[nodes], 0).sum(axis=1)
    return result


class _TightestGPU:
    def choose(
        self, state: ClusterState, pod: PodRequest, node: int, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> tuple[int, ...]:
        return tightest_gpus(state, pod, node, gpu_fit)


@dataclass(frozen=True, slots=True)
class BestFit(_TightestGPU):
    """Least leftover wins: 1 − (½·CPU left / 128 cores + ½·GPU left / 8 GPUs), as an integer percent."""

    name: str = "bestfit"
    node_local: ClassVar[bool] = True  # a node's score depends on it and the pod only

    def score(
        self, state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> FloatArray:
        left_cpu = (state.cpu_free[nodes] - pod.cpu_milli) / MAX_SPEC_CPU * 0.5
        left_gpu = (_free_gpu_milli(state, nodes) - pod.gpu.total_milli) / MAX_SPEC_GPU * 0.5
        result: FloatArray = np.trunc((1.0 - (left_cpu + left_gpu)) * 100.0)
        return result


@dataclass(frozen=True, slots=True)
class DotProd(_TightestGPU):
    """Tetris-style: the node whose free (CPU, GPU) vector aligns least with the request wins."""

    name: str = "dotprod"
    node_local: ClassVar[bool] = True  # a node's score depends on it and the pod only

    def score(
        self, state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> FloatArray:
        dot = (state.cpu_free[nodes] / MAX_SPEC_CPU) * (pod.cpu_milli / MAX_SPEC_CPU) + (
            _free_gpu_milli(state, nodes) / MAX_SPEC_GPU
        ) * (pod.gpu.total_milli / MAX_SPEC_GPU)
        result: FloatArray = np.trunc(100.0 * (1.0 - dot / 2.0))
        return result


@dataclass(frozen=True, slots=True)
class Packing(_TightestGPU):
    """GPU packing: (1) a partly used GPU, fuller first (50-100); (2) free GPUs of a used node (33-50);
    (3) an idle node (0-33). Pods without GPUs score 0 everywhere (node order decides)."""

    name: str = "packing"
    node_local: ClassVar[bool] = True  # a node's score depends on it and the pod only

    def score(
        self, state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> FloatArray:
        if pod.gpu.count == 0:
            return np.zeros(len(nodes))
        free = state.gpu_milli_free[nodes]
        present = state.gpu_present[nodes]
        n_gpus = present.sum(axis=1)
        fully_free = ((free == MILLI_PER_GPU) & present).sum(axis=1)
        idle_node = fully_free == n_gpus
        score = np.maximum(33 - fully_free, fully_free).astype(np.float64)  # case 3
        if pod.gpu.count == 1 and not pod.gpu.whole:
            tight = np.where(gpu_fit, free, MILLI_PER_GPU + 1).min(axis=1)  # the GPU a share goes to
            case1 = np.maximum(100 - (tight * 100 // MILLI_PER_GPU) // 10, 50)
            case2 = np.full(len(nodes), max(50 - 1, 33))
            used = np.where(tight == MILLI_PER_GPU, case2, case1)
        else:
            used = np.full(len(nodes), max(50 - pod.gpu.count, 33))
        result: FloatArray = np.where(idle_node, score, used).astype(np.float64)
        return result
