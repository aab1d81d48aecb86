"""The contract every placement policy follows, and the context it is given."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from gpupool.core.model import PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class TaskShape:
    """One kind of pod in the expected workload (FGD's "typical task"), with its popularity."""

    cpu_milli: int
    gpu_milli: int  # per GPU
    gpu_count: int
    models: frozenset[str] = frozenset()
    weight: float = 1.0


@dataclass(slots=True)
class PolicyContext:
    """What a policy may use besides the cluster state. `rank` orders nodes for tie-breaking (lower
    wins); `workload` is the expected mix of pods; `cache` lets a policy keep per-node derived data,
    keyed on `ClusterState.node_version`."""

    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    workload: tuple[TaskShape, ...] = ()
    rank: IntArray | None = None
    cache: dict[str, Any] = field(default_factory=dict)


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def score(
        self, state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> FloatArray:
        """Score feasible `nodes` (higher is better). `gpu_fit[k, j]`: GPU j of nodes[k] takes the share."""
        ...

    def choose(
        self, state: ClusterState, pod: PodRequest, node: int, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> tuple[int, ...]:
        """Pick `pod.gpu.count` GPU indices on `node` among those where `gpu_fit` is True."""
        ...
