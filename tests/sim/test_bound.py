import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.core.placement import Placement, place
from gpupool.core.policies import get_policy
from gpupool.core.policy import PolicyContext
from gpupool.core.state import ClusterState
from gpupool.sim.bound import (
    arrived_shares,
    filled_until,
    fractional_slack,
    least_slack,
    least_unallocated,
    patterns,
)

TRACE_SHARES = [810, 650, 590, 550, 470, 460, 370, 320, 230, 220, 160, 110, 50]


def share(key: str, milli: int, cpu: int = 1000, memory: int = 100, count: int = 1) -> PodRequest:
    return PodRequest(key, cpu, memory, GPURequest(count, milli))


def test_patterns_are_every_fill_of_one_gpu_within_the_counts() -> None:
    sizes, a = patterns({600: 1, 300: 2})
    # With the 600: room for one 300 or none; without it: two 300s (three would fit, two exist) or one.
    assert sizes == [600, 300]
    assert sorted(map(tuple, a.T.astype(int).tolist())) == [(0, 1), (0, 2), (1, 0), (1, 1)]


def test_least_slack_beats_first_fit_decreasing() -> None:
    # First fit decreasing: 550 | 470 | 320 -> first GPU (870) | 230, 220 -> second (920) | 160 -> third.
    # Best: 550 + 230 + 220 = 1000 and 470 + 320 + 160 = 950, so two GPUs and 50 milli of slack.
    bound = least_slack([550, 470, 230, 220, 320, 160])
    assert bound.exact and bound.milli == 50


def test_optional_shares_fill_gaps_or_stay_out() -> None:
    # The 810 needs a GPU: 160 fills it to 970 (slack 30); the 320 would open a GPU with 680 idle.
    assert least_slack([810], optional=[160, 320]).milli == 30
    assert least_slack([810]).milli == 190
    assert least_slack([]).milli == 0


def test_least_unallocated_drops_when_the_slack_costs_more() -> None:
    # Two 600s: both placed leave 400 + 400 = 800 idle; dropping one leaves max(400 idle, 600 dropped) = 600.
    assert least_unallocated([600, 600]).milli == 600
    # 810 + 160 and 810 alone: 30 + 190 = 220 idle; dropping an 810 would cost 810.
    assert least_unallocated([810, 810, 160]).milli == 220


def test_fractional_slack_splits_small_shares_into_remainders() -> None:
    # Remainders 190, 190; the 110 and 160 (270 in all) fill the first and 80 of the second: 110 stays empty.
    assert fractional_slack([810, 810, 160, 110]) == 110


def test_arrived_shares_stop_before_demand_passes_capacity() -> None:
    pods = [share("a", 500), PodRequest("b", 1000, 100, GPURequest(2, 1000)), share("c", 600), share("d", 300)]
    shares, arrived = arrived_shares(pods, 3000)
    # 500 + 2000 = 2500; the 600 would pass 3000, so the replay's bucket ends there.
    assert shares == [500] and arrived == pytest.approx(100 * 2500 / 3000)


def test_filled_until_takes_the_best_point_for_the_policy() -> None:
    # Capacity 3 GPUs. Big pods (>= 810 per GPU, CPU >= 1000, memory >= 100): the 810 and the whole GPU.
    # k = 0: max(0, 1810); k = 1: 810 alone (190) vs 1000; k = 2: 190 + 400 vs 1000;
    # k = 3: 590 vs 0 -> 590; k = 4: 190 + 400 + 410 = 1000. Least: 590 once 810 + 600 + 1000 arrived.
    pods = [share("a", 810), share("b", 600), PodRequest("c", 2000, 200, GPURequest(1, 1000)), share("d", 590)]
    bound, at = filled_until(pods, 3000)
    assert bound.milli == 590 and at == pytest.approx(100 * 2410 / 3000)


def cluster() -> list[Node]:
    return [Node(f"n{i}", 64_000, 256_000, tuple(GPU(f"n{i}-{j}", j, "T4", 16_384) for j in range(2)))
            for i in range(3)]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([*TRACE_SHARES, 1000, 2000]), min_size=1, max_size=14),
       st.sampled_from(["fgd", "gpupool", "bestfit", "random"]))
def test_no_policy_goes_below_the_bound(demands: list[int], policy: str) -> None:
    """Unallocated compute after any replay is at least least_unallocated of the shares that arrived."""
    state = ClusterState(cluster())
    capacity = state.total_gpus * 1000
    pods = [PodRequest(f"p{k}", 1000, 100, GPURequest(2, 1000) if d == 2000 else GPURequest(1, d))
            for k, d in enumerate(demands)]
    ctx = PolicyContext(rng=np.random.default_rng(0), rank=np.arange(len(state), dtype=np.int64))
    shares, _ = arrived_shares(pods, capacity)
    arrived = 0
    for pod in pods:
        demand = pod.gpu.count * pod.gpu.milli
        if arrived + demand > capacity:
            break
        arrived += demand
        decision = place(state, pod, get_policy(policy), ctx)
        if isinstance(decision, Placement):
            assert state.allocate(pod, decision.allocation) is None
    assert capacity - state.allocated_milli() >= least_unallocated(shares).milli - 1e-6
