"""Routing by runtime in core.fit: a request that names a runtime is placed only on cards whose vendor runs it
(cuda on NVIDIA, rocm on AMD, cann on Ascend); "any" or nothing said places anywhere, exactly as before."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.fit import NO_GPU_COUNT, NO_MODEL, NO_RUNTIME, OK, check, gpu_runtimes
from gpupool.core.model import GPU, RUNTIMES, Allocation, GPUGrant, GPURequest, Node, PodRequest
from gpupool.core.placement import Placement, place
from gpupool.core.policies import get_policy
from gpupool.core.policy import PolicyContext
from gpupool.core.state import ClusterState
from gpupool.core.vendors import AMD, ASCEND, NVIDIA, RUNTIME_OF_VENDOR

MODEL_OF = {NVIDIA: "A100-80GB", AMD: "MI300X", ASCEND: "Ascend910B"}


def vendor_node(name: str, vendors: list[str], gpu_mem: int = 65_536) -> Node:
    gpus = tuple(GPU(f"{name}-g{j}", j, MODEL_OF[v], gpu_mem, vendor=v) for j, v in enumerate(vendors))
    return Node(name, 64_000, 256_000, gpus)


def pod(runtime: str | None, count: int = 1, milli: int = 1000, key: str = "p") -> PodRequest:
    return PodRequest(key, 1000, 1000, GPURequest(count=count, milli=milli, runtime=runtime))


def test_each_runtime_lands_only_on_its_vendor_and_says_why_elsewhere() -> None:
    state = ClusterState([vendor_node("n", [NVIDIA, NVIDIA]), vendor_node("a", [AMD, AMD]),
                          vendor_node("h", [ASCEND, ASCEND])])
    for runtime, ok_node in (("cuda", 0), ("rocm", 1), ("cann", 2)):
        fit = check(state, pod(runtime))
        assert fit.code.tolist() == [OK if i == ok_node else NO_RUNTIME for i in range(3)], runtime
        assert fit.gpu_fit.tolist() == [[i == ok_node] * 2 for i in range(3)]
    fit = check(state, pod("rocm"))
    assert fit.reason(0, pod("rocm")) == "needs 1 GPU(s) that run rocm; the node has fewer"


def test_any_and_unsaid_land_anywhere() -> None:
    state = ClusterState([vendor_node("n", [NVIDIA]), vendor_node("a", [AMD]), vendor_node("h", [ASCEND])])
    for runtime in ("any", None):
        assert check(state, pod(runtime)).code.tolist() == [OK, OK, OK]


def test_a_mixed_node_offers_only_its_matching_cards() -> None:
    state = ClusterState([vendor_node("m", [NVIDIA, AMD, AMD, ASCEND])])
    assert check(state, pod("rocm")).gpu_fit[0].tolist() == [False, True, True, False]
    assert check(state, pod("rocm", count=2)).code.tolist() == [OK]
    # Three AMD cards asked, two present: the runtime is the reason, not the node's GPU count (it has four).
    assert check(state, pod("rocm", count=3)).code.tolist() == [NO_RUNTIME]
    assert check(state, pod("any", count=4)).code.tolist() == [OK]
    assert check(state, pod("any", count=5)).code.tolist() == [NO_GPU_COUNT]


def test_runtime_and_models_both_apply() -> None:
    state = ClusterState([vendor_node("a", [AMD, AMD])])
    wrong_model = PodRequest("p", 0, 0, GPURequest(1, runtime="rocm", models=frozenset({"MI325X"})))
    assert check(state, wrong_model).code.tolist() == [NO_MODEL]
    right_model = PodRequest("p", 0, 0, GPURequest(1, runtime="rocm", models=frozenset({"MI300X"})))
    assert check(state, right_model).code.tolist() == [OK]


def test_an_unknown_runtime_is_a_bad_request_with_its_name() -> None:
    bad = GPURequest(1, runtime="dtk-9")
    assert bad.problems() == ["runtime 'dtk-9' is unknown (use one of cuda, rocm, cann, any)"]
    assert GPURequest(1, runtime="any").problems() == []


def test_a_vendor_without_a_runtime_serves_only_any() -> None:
    odd = Node("x", 64_000, 256_000, (GPU("x-g0", 0, "DCU-Z100", 32_768, vendor="hygon"),))
    state = ClusterState([odd])
    assert gpu_runtimes(state).tolist() == [[-1]]
    assert [check(state, pod(r)).code[0] for r in ("cuda", "rocm", "cann", "any")] == [NO_RUNTIME] * 3 + [OK]


def test_the_kept_runtimes_stay_with_a_state_asked_often() -> None:
    """What-if copies of single nodes (ClusterState.node_copy) come and go; the big state asked between them
    keeps its array (least recently used eviction), so it is not rebuilt per question."""
    big = ClusterState([vendor_node(f"n{i}", [NVIDIA, AMD]) for i in range(4)])
    kept = gpu_runtimes(big)
    for k in range(100):
        gpu_runtimes(big.node_copy(k % 4))
        assert gpu_runtimes(big) is kept


def test_runtimes_of_a_copy_are_the_states_own() -> None:
    """The per-state array is kept per node list: a copy shares it, a state of other nodes never does."""
    one = ClusterState([vendor_node("n", [NVIDIA, AMD])])
    other = ClusterState([vendor_node("n", [AMD, NVIDIA])])
    assert gpu_runtimes(one.copy()) is gpu_runtimes(one)
    cuda, rocm = RUNTIMES.index("cuda"), RUNTIMES.index("rocm")
    assert gpu_runtimes(one).tolist() == [[cuda, rocm]]
    assert gpu_runtimes(other).tolist() == [[rocm, cuda]]


# --- properties over mixed clusters ---------------------------------------------------------------------------

VENDORS = [NVIDIA, AMD, ASCEND]


@st.composite
def mixed_states(draw: st.DrawFn) -> ClusterState:
    n = draw(st.integers(1, 6))
    nodes = [vendor_node(f"n{i}", draw(st.lists(st.sampled_from(VENDORS), min_size=1, max_size=4)))
             for i in range(n)]
    state = ClusterState(nodes)
    # Some cards already hold a share, so that fits also depend on what is free.
    for i, node in enumerate(nodes):
        for g in node.gpus:
            used = draw(st.sampled_from([0, 0, 300, 700, 1000]))
            if used:
                holder = PodRequest(f"h-{g.uuid}", 0, 0, GPURequest(1, used))
                assert state.allocate(holder, Allocation(holder.key, node.name,
                                                         (GPUGrant(g.uuid, g.index, used, 0),))) is None
        assert i == state.index[node.name]
    return state


@settings(max_examples=150, deadline=None)
@given(mixed_states(), st.sampled_from(["cuda", "rocm", "cann"]), st.integers(1, 3), st.sampled_from([1000, 400]))
def test_a_runtime_request_never_fits_a_card_of_another_vendor(state: ClusterState, runtime: str, count: int,
                                                              milli: int) -> None:
    request = pod(runtime, count=count if milli == 1000 else 1, milli=milli)
    fit = check(state, request)
    for k, i in enumerate(fit.nodes):
        for j in np.flatnonzero(fit.gpu_fit[k]):
            assert RUNTIME_OF_VENDOR[state.nodes[int(i)].gpus[int(j)].vendor] == runtime
    placed = place(state, request, get_policy("gpupool"), PolicyContext())
    if isinstance(placed, Placement):
        node = state.nodes[state.index[placed.allocation.node]]
        assert {RUNTIME_OF_VENDOR[node.gpus[g.index].vendor] for g in placed.allocation.grants} == {runtime}


@settings(max_examples=150, deadline=None)
@given(mixed_states(), st.sampled_from(["cuda", "rocm", "cann"]), st.sampled_from(["gpupool", "bestfit", "fgd"]))
def test_a_runtime_is_the_same_as_naming_its_cards(state: ClusterState, runtime: str, policy: str) -> None:
    """Among the allowed cards nothing changes: a rocm request is placed exactly where the same request
    without a runtime goes when it may use only the AMD cards (the existing gpu-uuid rule)."""
    uuids = frozenset(g.uuid for n in state.nodes for g in n.gpus if RUNTIME_OF_VENDOR[g.vendor] == runtime)
    by_runtime = pod(runtime, milli=400)
    by_uuid = PodRequest("p", 1000, 1000, GPURequest(1, 400, include_uuids=uuids or frozenset({"none"})))
    a, b = check(state, by_runtime), check(state, by_uuid)
    assert (a.code == OK).tolist() == (b.code == OK).tolist()
    assert a.gpu_fit.tolist() == b.gpu_fit.tolist()
    rank = np.arange(len(state), dtype=np.int64)[::-1].copy()
    pa = place(state, by_runtime, get_policy(policy), PolicyContext(rank=rank))
    pb = place(state, by_uuid, get_policy(policy), PolicyContext(rank=rank))
    assert isinstance(pa, Placement) == isinstance(pb, Placement)
    if isinstance(pa, Placement) and isinstance(pb, Placement):
        assert (pa.allocation.node, pa.allocation.grants) == (pb.allocation.node, pb.allocation.grants)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=6), st.integers(1, 3), st.sampled_from([1000, 300]),
       st.sampled_from(["gpupool", "bestfit", "fgd", "packing"]))
def test_all_nvidia_states_place_as_before(counts: list[int], count: int, milli: int, policy: str) -> None:
    """On today's clusters (NVIDIA only) a cuda, an "any" and an unsaid request are the same request."""
    state = ClusterState([vendor_node(f"n{i}", [NVIDIA] * c) for i, c in enumerate(counts)])
    count = count if milli == 1000 else 1
    fits = [check(state, pod(r, count, milli)) for r in (None, "cuda", "any")]
    for other in fits[1:]:
        assert other.code.tolist() == fits[0].code.tolist()
        assert other.gpu_fit.tolist() == fits[0].gpu_fit.tolist()
    placed = [place(state, pod(r, count, milli), get_policy(policy), PolicyContext()) for r in (None, "cuda", "any")]
    shown = [(p.allocation.node, p.allocation.grants) if isinstance(p, Placement) else sorted(p.reasons.items())
             for p in placed]
    assert shown[1] == shown[0] and shown[2] == shown[0]
