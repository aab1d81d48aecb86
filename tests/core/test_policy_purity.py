"""A policy's answers are a function of (cluster state, pod, context workload) only: interleaving calls for
other pods and other clusters through one shared context changes nothing (issue 12: the gpupool policy
used to remember the last pod it scored and centre `choose` on it)."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.fit import check
from gpupool.core.frag import typical_workload
from gpupool.core.model import GPU, Allocation, GPURequest, Node, PodRequest
from gpupool.core.policies import get_policy
from gpupool.core.policy import PolicyContext, TaskShape
from gpupool.core.state import ClusterState

SIZES = (110, 230, 320, 470, 650, 810)


def cluster(seed: int) -> ClusterState:
    """Six nodes of four GPUs, partly filled at random with trace-like shares."""
    rng = np.random.default_rng(seed)
    nodes = [Node(f"n{i}", 24_000, 256_000, tuple(GPU(f"n{i}-{j}", j, "T4", 16_384) for j in range(4)))
             for i in range(6)]
    state = ClusterState(nodes)
    for k in range(14):
        i, j, milli = int(rng.integers(6)), int(rng.integers(4)), int(rng.choice(SIZES))
        pod = PodRequest(f"fill{k}", int(rng.integers(1, 5)) * 1000, 0, GPURequest(1, milli))
        if state.gpu_milli_free[i, j] >= milli and state.cpu_free[i] >= pod.cpu_milli:
            err = state.allocate(pod, Allocation(pod.key, f"n{i}", state.grants_for(i, pod, (j,))))
            assert err is None
    return state


PODS = [PodRequest(f"p{m}", 2000 * (1 + m % 3), 0, GPURequest(1, m)) for m in SIZES] + [
    PodRequest("whole", 4000, 0, GPURequest(1)), PodRequest("two", 4000, 0, GPURequest(2))]
WORKLOAD: tuple[TaskShape, ...] = typical_workload(PODS * 3)


def context() -> PolicyContext:
    return PolicyContext(workload=WORKLOAD, rank=np.arange(6, dtype=np.int64))


def answers(policy: str, state: ClusterState, pod: PodRequest, ctx: PolicyContext) -> list[object]:
    """Scores of every feasible node, then the GPUs `choose` picks on each of them."""
    p = get_policy(policy)
    fit = check(state, pod)
    ok = fit.code == 0
    nodes, rows = fit.nodes[ok], fit.gpu_fit[ok]
    out: list[object] = [p.score(state, pod, nodes, rows, ctx).tolist()]
    out += [p.choose(state, pod, int(i), rows[k], ctx) for k, i in enumerate(nodes)]
    return out


@pytest.mark.parametrize("policy", ["gpupool", "fgd", "bestfit", "clustering"])
def test_interleaved_calls_answer_as_isolated_ones(policy: str) -> None:
    states = [cluster(s) for s in range(4)]
    p = get_policy(policy)
    isolated = {(s, q.key): answers(policy, st, q, context()) for s, st in enumerate(states) for q in PODS}
    # Isolated chooses, each in a fresh context with no score before it, as a scheduler binding on one node.
    for (s, key), got in isolated.items():
        pod = next(q for q in PODS if q.key == key)
        fit = check(states[s], pod)
        ok = np.flatnonzero(fit.code == 0)
        alone = [p.choose(states[s], pod, int(fit.nodes[k]), fit.gpu_fit[k], context()) for k in ok]
        assert alone == got[1:], (s, key)
    shared = context()
    order = np.random.default_rng(7).permutation([(s, k) for s in range(4) for k in range(len(PODS))])
    for s, k in order.tolist():  # every pod on every cluster, shuffled, through one context
        assert answers(policy, states[s], PODS[k], shared) == isolated[(s, PODS[k].key)], (s, PODS[k].key)


def test_a_gpupool_node_score_does_not_depend_on_the_other_nodes_asked() -> None:
    state, ctx = cluster(3), context()
    p = get_policy("gpupool")
    for pod in PODS:
        fit = check(state, pod)
        ok = np.flatnonzero(fit.code == 0)
        together = p.score(state, pod, fit.nodes[ok], fit.gpu_fit[ok], ctx).tolist()
        alone = [p.score(state, pod, fit.nodes[[k]], fit.gpu_fit[[k]], ctx)[0] for k in ok]
        assert together == alone, pod.key
