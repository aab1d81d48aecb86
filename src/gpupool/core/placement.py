"""Deciding where a pod goes: feasibility, then the policy's score, then the GPUs inside the node."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.fit import Fit, check
from gpupool.core.model import Allocation, PodRequest
from gpupool.core.policy import FloatArray, Policy, PolicyContext
from gpupool.core.state import ClusterState, IntArray


@dataclass(frozen=True, slots=True)
class Placement:
    allocation: Allocation
    score: float


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """The pod fits nowhere; `reasons` maps node name to why (one entry per checked node)."""

    reasons: dict[str, str]

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for r in self.reasons.values():
            counts[r] = counts.get(r, 0) + 1
        parts = [f"{n} node(s): {r}" for r, n in sorted(counts.items(), key=lambda kv: -kv[1])]
        return "; ".join(parts) if parts else "no nodes"


@dataclass(frozen=True, slots=True)
class Scored:
    fit: Fit
    feasible: IntArray  # node indices that fit
    scores: FloatArray  # policy score per feasible node (higher is better)


def reasons(state: ClusterState, pod: PodRequest, fit: Fit) -> dict[str, str]:
    problems = pod.problems()
    return {
        state.nodes[int(i)].name: fit.reason(k, pod, problems)
        for k, i in enumerate(fit.nodes)
        if fit.code[k] != 0
    }


def score_nodes(
    state: ClusterState, pod: PodRequest, policy: Policy, ctx: PolicyContext, nodes: IntArray | None = None
) -> Scored:
    fit = check(state, pod, nodes)
    ok = fit.code == 0
    feasible = fit.nodes[ok]
    if len(feasible) == 0:
        return Scored(fit, feasible, np.zeros(0))
    scores = policy.score(state, pod, feasible, fit.gpu_fit[ok], ctx)
    return Scored(fit, feasible, scores)


def best(scored: Scored, ctx: PolicyContext) -> int:
    """Position (in `scored.feasible`) of the winner: highest score, ties to the lowest rank."""
    top = scored.scores.max()
    tied = np.flatnonzero(scored.scores >= top)
    if len(tied) == 1 or ctx.rank is None:
        return int(tied[0])
    ranks = ctx.rank[scored.feasible[tied]]
    return int(tied[int(np.argmin(ranks))])


def place(
    state: ClusterState, pod: PodRequest, policy: Policy, ctx: PolicyContext, nodes: IntArray | None = None
) -> Placement | Unschedulable:
    """Decide a node and GPUs for `pod` without taking the capacity (the caller allocates)."""
    scored = score_nodes(state, pod, policy, ctx, nodes)
    if len(scored.feasible) == 0:
        return Unschedulable(reasons(state, pod, scored.fit))
    k = best(scored, ctx)
    node = int(scored.feasible[k])
    ok_rows = np.flatnonzero(scored.fit.code == 0)
    gpus = policy.choose(state, pod, node, scored.fit.gpu_fit[ok_rows[k]], ctx) if pod.gpu.count else ()
    allocation = Allocation(
        pod=pod.key,
        node=state.nodes[node].name,
        grants=state.grants_for(node, pod, gpus),
        policy=policy.name,
    )
    return Placement(allocation, float(scored.scores[k]))
