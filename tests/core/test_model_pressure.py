from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.frag import WorkloadArrays
from gpupool.core.placement import Placement, place, score_nodes
from gpupool.core.policies import get_policy
from gpupool.core.policies.model_pressure import MAX_PRESSURE, confined_demand, pressure
from gpupool.core.policy import PolicyContext, TaskShape
from gpupool.core.state import ClusterState

from .helpers import node, set_free, share

# Half the demand may run on T4 only, half anywhere (whole GPUs, no CPU).
T4_HALF = (TaskShape(0, 1000, 1, models=frozenset({"T4"}), weight=0.5), TaskShape(0, 1000, 1, weight=0.5))


def _cluster() -> ClusterState:
    return ClusterState([node("t", gpus=2, model="T4"), node("g", gpus=2, model="G2")])


def _by_model(state: ClusterState, values: np.ndarray) -> dict[str, float]:
    return {m: round(float(values[state.model_id(m)]), 6) for m in state.models}


def test_pressure_is_the_confined_share_over_the_free_share() -> None:
    state = _cluster()
    confined = confined_demand(state, WorkloadArrays.build(state, T4_HALF))
    assert _by_model(state, confined) == {"T4": 0.5, "G2": 0.0}
    # Empty: T4 has 2000 of 4000 free (f = 0.5), so pressure(T4) = 0.5 / 0.5 = 1.
    assert _by_model(state, pressure(state, confined)) == {"T4": 1.0, "G2": 0.0}
    # One T4 taken: 1000 of 3000 free (f = 1/3): 0.5 / (1/3) = 1.5.
    set_free(state, "t", [0, 1000])
    assert _by_model(state, pressure(state, confined)) == {"T4": 1.5, "G2": 0.0}
    # Both T4s taken: nothing left for T4-only pods; bounded rather than infinite.
    state = _cluster()
    set_free(state, "t", [0, 0])
    assert _by_model(state, pressure(state, confined)) == {"T4": MAX_PRESSURE, "G2": 0.0}


def test_a_task_naming_two_models_counts_half_on_each() -> None:
    state = ClusterState([node("t", model="T4"), node("g", model="G2"), node("v", model="V100")])
    wl = (TaskShape(0, 500, 1, models=frozenset({"T4", "G2"})),)
    assert _by_model(state, confined_demand(state, WorkloadArrays.build(state, wl))) == {
        "T4": 0.5, "G2": 0.5, "V100": 0.0}


def test_gpupool_sends_a_pod_that_could_go_anywhere_to_the_pool_nobody_else_needs() -> None:
    # Workload: whole T4 GPUs for T4-only pods and 500 shares for anyone, half each. t (T4) has GPUs
    # [500, 1000] free, g (G2) [1000, 1000]; the pod: a 500 share naming no model.
    # FGD, t: the 500 free is a fragment for the whole-T4 task: 0.5 x 500 = 250; the share on GPU 0 leaves
    #   [0, 1000], fragment 0: dF = 250, floor(100 sigmoid(0.25)) = 56.
    # FGD, g: every free G2 GPU is a fragment for the T4-only task: 0.5 x 2000 = 1000, after 0.5 x 1500 =
    #   750: dF = 250, 56 too. The tie goes to the first node: t, spending a T4 that T4-only pods need.
    # gpupool (waste 0 here): demand is 0.5 x 1000 (T4 only) + 0.5 x 500 (anywhere), so c(T4) = 2/3; T4
    #   has 1500 of 3500 free (f = 3/7): pressure(T4) = 14/9 = 1.556, pressure(G2) = 0, least over both
    #   nodes 0. t's value drops by LAMBDA (1) x 500 milli x 1.556 = 778: floor(100 sigmoid(-0.528)) = 37.
    state = _cluster()
    set_free(state, "t", [500, 1000])
    wl = (TaskShape(0, 1000, 1, models=frozenset({"T4"}), weight=0.5), TaskShape(0, 500, 1, weight=0.5))
    pod = share("p", 500, cpu=0)
    fgd = place(state, pod, get_policy("fgd"), PolicyContext(workload=wl))
    assert isinstance(fgd, Placement) and fgd.score == 56 and fgd.allocation.node == "t"
    assert score_nodes(state, pod, get_policy("gpupool"), PolicyContext(workload=wl)).scores.tolist() == [37, 56]
    ours = place(state, pod, get_policy("gpupool"), PolicyContext(workload=wl))
    assert isinstance(ours, Placement) and ours.allocation.node == "g"


def test_a_pod_confined_to_one_model_is_scored_as_before() -> None:
    # Only t can take it: the least pressure it can find is t's own, so nothing is subtracted (score 50).
    state = _cluster()
    pod = share("p", 1000, cpu=0, models=frozenset({"T4"}))
    got = score_nodes(state, pod, get_policy("gpupool"), PolicyContext(workload=T4_HALF))
    assert got.feasible.tolist() == [0] and got.scores.tolist() == [50]


@settings(max_examples=100, deadline=None)
@given(
    frees=st.lists(st.integers(0, 1000), min_size=6, max_size=6),
    tasks=st.lists(st.tuples(st.sampled_from([(), ("T4",), ("G2",), ("T4", "G2"), ("V100",)]),
                             st.floats(0.01, 1.0)), min_size=1, max_size=5),
)
def test_pressure_is_bounded_and_zero_where_no_task_is_confined(
        frees: list[int], tasks: list[tuple[tuple[str, ...], float]]) -> None:
    state = ClusterState([node("t", model="T4"), node("g", model="G2"), node("v", model="V100")])
    for name, part in zip("tgv", (frees[0:2], frees[2:4], frees[4:6]), strict=True):
        set_free(state, name, part)
    wl = tuple(TaskShape(0, 500, 1, models=frozenset(m), weight=w) for m, w in tasks)
    confined = confined_demand(state, WorkloadArrays.build(state, wl))
    assert confined.sum() == pytest.approx(sum(w for m, w in tasks if m) / sum(w for _, w in tasks))
    p = pressure(state, confined)
    assert np.all((p >= 0) & (p <= MAX_PRESSURE))
    assert np.all(p[confined == 0] == 0)
