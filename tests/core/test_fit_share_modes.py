"""Shares only where they are held (issue 40): in core.fit a request for a share of a card (less than a whole
one) under an isolation mode that holds shares (hook, mps, remote) is placed only on cards whose vendor holds
that mode (core.vendors.ISOLATION_OF_VENDOR: hook on NVIDIA and AMD, mps and remote on NVIDIA, none on Ascend);
whole cards, partitions (mig), `none` and requests that say no mode are placed as before."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.fit import NO_GPU_SHARE, NO_RUNTIME, NO_SHARE_MODE, OK, check, gpu_share_modes
from gpupool.core.model import GPU, Allocation, GPUGrant, GPURequest, Node, PodRequest
from gpupool.core.placement import Placement, Unschedulable, place
from gpupool.core.policies import get_policy
from gpupool.core.policy import PolicyContext
from gpupool.core.state import ClusterState
from gpupool.core.vendors import AMD, ASCEND, NVIDIA
from tests.core.test_fit_runtime import mixed_states, vendor_node

# Stated here on their own, not read from the catalogue: which vendors' cards hold a share in each mode.
HOLDERS = {"hook": {NVIDIA, AMD}, "mps": {NVIDIA}, "remote": {NVIDIA}}


def share(runtime: str | None = "any", isolation: str | None = "hook", milli: int = 300,
          memory: int | None = 8192, count: int = 1, key: str = "p") -> PodRequest:
    return PodRequest(key, 1000, 1000, GPURequest(count, milli, memory, runtime=runtime, isolation=isolation))


def fill(state: ClusterState, node: str) -> None:
    """Every card of `node` held whole by a pod of its own."""
    n = state.nodes[state.index[node]]
    for g in n.gpus:
        holder = PodRequest(f"full-{g.uuid}", 0, 0, GPURequest(1))
        assert state.allocate(holder, Allocation(holder.key, node, (GPUGrant(g.uuid, g.index, 1000, g.memory_mib),))) \
            is None


def test_an_any_share_stays_pending_when_only_ascend_cards_are_free() -> None:
    """The issue's case: an NVIDIA node full, an Ascend node with free cards. The "any" hook share fits neither,
    and the Ascend node says why: nothing there would hold the share."""
    state = ClusterState([vendor_node("nv", [NVIDIA, NVIDIA]), vendor_node("asc", [ASCEND, ASCEND])])
    fill(state, "nv")
    pod = share()
    fit = check(state, pod)
    assert fit.code.tolist() == [NO_GPU_SHARE, NO_SHARE_MODE]
    assert fit.gpu_fit.tolist() == [[False, False], [False, False]]
    assert fit.reason(1, pod) == ("needs 1 GPU(s) that hold a share under isolation hook (nvidia, amd cards); "
                                  "the node has fewer")
    placed = place(state, pod, get_policy("gpupool"), PolicyContext())
    assert isinstance(placed, Unschedulable)
    assert placed.reasons["asc"] == fit.reason(1, pod)


def test_an_any_whole_card_takes_the_ascend_one() -> None:
    state = ClusterState([vendor_node("nv", [NVIDIA, NVIDIA]), vendor_node("asc", [ASCEND, ASCEND])])
    fill(state, "nv")
    whole = PodRequest("w", 1000, 1000, GPURequest(1, runtime="any", isolation="hook"))
    placed = place(state, whole, get_policy("gpupool"), PolicyContext())
    assert isinstance(placed, Placement) and placed.allocation.node == "asc"


def test_each_mode_goes_to_its_holders_on_a_mixed_node() -> None:
    state = ClusterState([vendor_node("m", [NVIDIA, AMD, ASCEND])])
    assert check(state, share(isolation="hook")).gpu_fit[0].tolist() == [True, True, False]
    assert check(state, share(isolation="mps")).gpu_fit[0].tolist() == [True, False, False]
    assert check(state, share(isolation="remote")).gpu_fit[0].tolist() == [True, False, False]
    # No vendor rule: nothing enforced anywhere (none), a partition (mig, placed by the geometry), nothing said.
    for isolation in ("none", "mig", None):
        assert check(state, share(isolation=isolation)).gpu_fit[0].tolist() == [True, True, True], isolation
    # A memory-only share is a share too (1 milli-GPU), and so is full compute with a memory figure.
    assert check(state, share(milli=1)).gpu_fit[0].tolist() == [True, True, False]
    assert check(state, share(milli=1000, memory=4096)).gpu_fit[0].tolist() == [True, True, False]
    # A whole card under hook: nothing shares it, every vendor will do.
    assert check(state, share(milli=1000, memory=None)).gpu_fit[0].tolist() == [True, True, True]


def test_the_runtime_reason_comes_before_the_mode() -> None:
    """A rocm share on an NVIDIA-and-Ascend node: no AMD card is the reason, not the mode. A cann share (which the
    webhook refuses) on an Ascend node: the mode is the reason."""
    state = ClusterState([vendor_node("m", [NVIDIA, ASCEND]), vendor_node("asc", [ASCEND])])
    assert check(state, share("rocm")).code.tolist() == [NO_RUNTIME, NO_RUNTIME]
    assert check(state, share("cann")).code.tolist() == [NO_SHARE_MODE, NO_SHARE_MODE]
    assert check(state, share("cuda")).code.tolist() == [OK, NO_RUNTIME]


def test_share_mode_bits_per_slot() -> None:
    state = ClusterState([vendor_node("m", [NVIDIA, AMD, ASCEND]), vendor_node("one", [AMD])])
    # bit 0 hook, bit 1 mps, bit 2 remote (core.vendors.SHARE_MODES); padding and Ascend hold none.
    assert gpu_share_modes(state).tolist() == [[0b111, 0b001, 0], [0b001, 0, 0]]
    odd = ClusterState([Node("x", 1000, 1000, (GPU("x-0", 0, "DCU-Z100", 32_768, vendor="hygon"),))])
    assert gpu_share_modes(odd).tolist() == [[0]]  # a vendor gpupool does not know holds no share
    assert check(odd, share()).code.tolist() == [NO_SHARE_MODE]


# --- property: no share is ever placed on a card whose vendor does not hold its mode ----------------------------



@settings(max_examples=200, deadline=None)
@given(mixed_states(), st.sampled_from([None, "any", "cuda", "rocm", "cann"]),
       st.sampled_from(["hook", "mps", "remote"]), st.sampled_from([1, 250, 600, 999]),
       st.sampled_from(["gpupool", "bestfit", "fgd", "packing"]))
def test_no_share_is_placed_on_a_vendor_that_does_not_hold_its_mode(state: ClusterState, runtime: str | None,
                                                                  isolation: str, milli: int, policy: str) -> None:
    request = share(runtime, isolation, milli, None)
    fit = check(state, request)
    for k, i in enumerate(fit.nodes):
        for j in np.flatnonzero(fit.gpu_fit[k]):
            assert state.nodes[int(i)].gpus[int(j)].vendor in HOLDERS[isolation]
    placed = place(state, request, get_policy(policy), PolicyContext())
    if isinstance(placed, Placement):
        node = state.nodes[state.index[placed.allocation.node]]
        assert {node.gpus[g.index].vendor for g in placed.allocation.grants} <= HOLDERS[isolation]


@settings(max_examples=150, deadline=None)
@given(mixed_states(), st.sampled_from([None, "any", "cuda", "rocm", "cann"]), st.sampled_from([1, 400, 1000]))
def test_a_mode_on_holding_cards_changes_nothing(state: ClusterState, runtime: str | None, milli: int) -> None:
    """Where every card holds hook shares, or the request is whole, the mode changes no answer: the rule only
    ever takes cards away, and only those that cannot hold the share."""
    plain = check(state, share(runtime, None, milli, None))
    hooked = check(state, share(runtime, "hook", milli, None))
    holders = np.array([[g.vendor != ASCEND for g in n.gpus] + [False] * (state.width - len(n.gpus))
                        for n in state.nodes])
    expected = plain.gpu_fit if milli == 1000 else plain.gpu_fit & holders
    assert hooked.gpu_fit.tolist() == expected.tolist()


def test_a_mode_every_card_holds_costs_nothing_and_changes_nothing() -> None:
    """On an all-NVIDIA state every card holds every share mode: the answers are those without a mode."""
    state = ClusterState([vendor_node(f"n{i}", [NVIDIA] * 3) for i in range(4)])
    fill(state, "n1")
    for isolation in ("hook", "mps", "remote"):
        with_mode, without = check(state, share(isolation=isolation)), check(state, share(isolation=None))
        assert with_mode.code.tolist() == without.code.tolist() == [OK, NO_GPU_SHARE, OK, OK]
        assert with_mode.gpu_fit.tolist() == without.gpu_fit.tolist()
    # one AMD card joins: mps and remote now rule it out, hook does not
    mixed = ClusterState([vendor_node("n", [NVIDIA, AMD])])
    assert check(mixed, share(isolation="mps")).gpu_fit.tolist() == [[True, False]]
    assert check(mixed, share(isolation="hook")).gpu_fit.tolist() == [[True, True]]
