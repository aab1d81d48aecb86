"""GPU Clustering baseline: keep pods of the same GPU class (share, 1, 2, 4, 8 GPUs) together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gpupool.core.model import MILLI_PER_GPU, PodRequest
from gpupool.core.policies.common import tightest_gpus
from gpupool.core.policy import FloatArray, PolicyContext
from gpupool.core.state import BoolArray, ClusterState, IntArray

MAX_SPEC_GPU = 8_000


def gpu_class(count: int, milli: int) -> str | None:
    if count == 0:
        return None
    return "share" if count == 1 and milli < MILLI_PER_GPU else str(count)


_BITS: dict[str, int] = {}


def _bit(cls: str) -> int:
    return 1 << _BITS.setdefault(cls, len(_BITS))


def _class_masks(state: ClusterState, nodes: IntArray, ctx: PolicyContext) -> IntArray:
    """Bit set of the GPU classes hosted by each node, recomputed only for nodes that changed."""
    cached = ctx.cache.get("clustering")
    if cached is None or cached[0] is not state:
        cached = (state, np.zeros(len(state), dtype=np.int64), np.full(len(state), -1, dtype=np.int64))
        ctx.cache["clustering"] = cached
    _, masks, versions = cached
    for i in nodes[versions[nodes] != state.node_version[nodes]]:
        mask = 0
        for key in state.node_pods[i]:
            grants = state.held[key].allocation.grants
            cls = gpu_class(len(grants), grants[0].milli if grants else 0)
            mask |= _bit(cls) if cls is not None else 0
        masks[i] = mask
        versions[i] = state.node_version[i]
    result: IntArray = masks[nodes]
    return result


@dataclass(frozen=True, slots=True)
class Clustering:
    """Bands of 25: only the pod's class on the node (75-100), a mix including it (50-75), an idle node
    (25-50), only other classes (0-25); fuller nodes score higher within a band."""

    name: str = "clustering"
    node_local: ClassVar[bool] = True  # a node's score depends on it and the pod only

    def score(
        self, state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> FloatArray:
        cls = gpu_class(pod.gpu.count, pod.gpu.milli)
        if cls is None:
            return np.zeros(len(nodes))
        left = np.where(state.gpu_present[nodes], state.gpu_milli_free[nodes], 0).sum(axis=1)
        fill = 25 * (MAX_SPEC_GPU - left) // MAX_SPEC_GPU
        masks = _class_masks(state, nodes, ctx)
        bit = _bit(cls)
        band = np.where(
            masks & bit, np.where(masks == bit, 75, 50), np.where(masks == 0, 25, 0)
        )
        result: FloatArray = (fill + band).astype(np.float64)
        return result

    def choose(
        self, state: ClusterState, pod: PodRequest, node: int, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> tuple[int, ...]:
        return tightest_gpus(state, pod, node, gpu_fit)
