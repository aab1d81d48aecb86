"""First-fit and random placement: the two policies with no opinion about fragmentation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.policies.common import first_gpus
from gpupool.core.policy import FloatArray, PolicyContext
from gpupool.core.state import BoolArray, ClusterState, IntArray


@dataclass(frozen=True, slots=True)
class FirstFit:
    """Every feasible node scores the same; the tie-break order (node rank) decides."""

    name: str = "firstfit"
    node_local: ClassVar[bool] = True  # a node's score depends on it and the pod only

    def score(
        self, state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> FloatArray:
        return np.zeros(len(nodes))

    def choose(
        self, state: ClusterState, pod: PodRequest, node: int, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> tuple[int, ...]:
        return first_gpus(pod, gpu_fit)


@dataclass(frozen=True, slots=True)
class RandomFit:
    """A uniformly random feasible node and random fitting GPUs (the paper's Random-fit baseline)."""

    name: str = "random"

    def score(
        self, state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> FloatArray:
        return ctx.rng.random(len(nodes))

    def choose(
        self, state: ClusterState, pod: PodRequest, node: int, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> tuple[int, ...]:
        candidates = np.flatnonzero(gpu_fit)
        picked = ctx.rng.choice(candidates, size=pod.gpu.count, replace=False)
        return tuple(sorted(int(j) for j in picked))
