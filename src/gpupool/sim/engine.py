"""The simulator's placement step: `gpupool.core.placement.place` without what a replay never reads.

Same decisions as `place` (feasible nodes, the policy's score, ties to the lowest rank, the policy's GPU
choice), but no per-node reasons for pods that fit nowhere (two thirds of a replay's time went into
those strings), feasibility and node-local scores cached per pod shape (gpupool.core.fit_cache), and no
Allocation object until a pod is actually placed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.fit_cache import FitCache, LocalScores, is_node_local
from gpupool.core.model import Allocation, PodRequest
from gpupool.core.policy import FloatArray, Policy, PolicyContext
from gpupool.core.state import ClusterState, IntArray


@dataclass(frozen=True, slots=True)
class Choice:
    node: int
    gpus: tuple[int, ...]


def winner(scores: FloatArray, feasible: IntArray, rank: IntArray | None) -> int:
    """Position of the highest score, ties to the lowest rank (gpupool.core.placement.best)."""
    top = scores.max()
    tied = np.flatnonzero(scores >= top)
    if len(tied) == 1 or rank is None:
        return int(tied[0])
    return int(tied[int(np.argmin(rank[feasible[tied]]))])


class Placer:
    """One policy placing pods on one cluster state."""

    def __init__(self, state: ClusterState, policy: Policy, ctx: PolicyContext) -> None:
        self.state, self.policy, self.ctx = state, policy, ctx
        self.fit = FitCache(state)
        self.local = LocalScores(state, policy, ctx) if is_node_local(policy) else None

    def decide(self, pod: PodRequest) -> Choice | None:
        feasible, gpu_fit = self.fit.feasible(pod)
        if len(feasible) == 0:
            return None
        if self.local is not None:
            scores = self.local.scores(pod, feasible, gpu_fit)
        else:
            scores = self.policy.score(self.state, pod, feasible, gpu_fit, self.ctx)
        k = winner(scores, feasible, self.ctx.rank)
        node = int(feasible[k])
        gpus = self.policy.choose(self.state, pod, node, gpu_fit[k], self.ctx) if pod.gpu.count else ()
        return Choice(node, gpus)

    def take(self, pod: PodRequest, choice: Choice) -> int:
        """Allocate the choice; returns the compute (milli) it took."""
        st = self.state
        grants = st.grants_for(choice.node, pod, choice.gpus)
        reason = st.allocate(pod, Allocation(pod.key, st.nodes[choice.node].name, grants, self.policy.name))
        if reason is not None:  # cannot happen unless a policy is wrong: fail loudly
            raise RuntimeError(f"policy {self.policy.name} chose an infeasible placement: {reason}")
        return sum(g.milli for g in grants)
