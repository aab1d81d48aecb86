"""What-ifs (gpupool.scheduler.what_if) work on a snapshot: the live ledger is never changed by a question,
not even for its duration, and not when the question raises halfway."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.api.inventory import encode_inventory
from gpupool.api.names import ANN_INVENTORY
from gpupool.core.fit import OK, check
from gpupool.core.model import GPU, Allocation, GPUGrant, GPURequest, PodRequest
from gpupool.core.state import ClusterState
from gpupool.scheduler.ledger import Ledger
from gpupool.scheduler.squeeze import fits_squeezed, squeezed_allocation
from gpupool.scheduler.what_if import Snapshot, StaleSnapshot, fits_without

CARD_MIB = 40960


def node(name: str, gpus: int = 2) -> dict[str, Any]:
    cards = [GPU(f"{name}-GPU-{j}", j, "A100-40GB", CARD_MIB) for j in range(gpus)]
    return {"metadata": {"name": name, "annotations": {ANN_INVENTORY: encode_inventory(name, cards, 10)}},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}}


def hold(ledger: Ledger, uid: str, where: str, gpu: int, milli: int, memory_mib: int = 4096) -> None:
    grant = GPUGrant(f"{where}-GPU-{gpu}", gpu, milli, memory_mib)
    request = PodRequest(uid, 1000, 1024, GPURequest(1, milli, memory_mib))
    assert ledger.assume(uid, f"default/{uid}", request, Allocation(uid, where, (grant,)), 1e12) is None


def fingerprint(ledger: Ledger) -> tuple[Any, ...]:
    """Everything of the ledger's state a question could change, the versions that caches key on and the
    order of what is held included."""
    s = ledger.state
    return (s.version, s.node_version.tolist(), s.cpu_free.tolist(), s.mem_free.tolist(),
            s.gpu_milli_free.tolist(), s.gpu_mem_free.tolist(), s.gpu_sharers.tolist(), list(s.held.items()),
            [sorted(p) for p in s.node_pods], [(u, e.allocation) for u, e in ledger.entries.items()],
            ledger.generation)


def two_pods() -> Ledger:
    """n0: GPU 0 holds a (600 milli) and b (300 milli); GPU 1 is full with c."""
    ledger = Ledger([node("n0")])
    hold(ledger, "a", "n0", 0, 600)
    hold(ledger, "b", "n0", 0, 300)
    hold(ledger, "c", "n0", 1, 1000)
    return ledger


WANTS_HALF = PodRequest("p", 1000, 1024, GPURequest(1, 500, 4096))


class RaisesMidway(Mapping[str, int]):
    """Squeezes whose second item cannot be read: the question fails halfway. Before failing it records the
    ledger as any other reader (a concurrent question, a filter) would see it at that moment."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.seen: tuple[Any, ...] | None = None

    def __getitem__(self, key: str) -> int:
        return 300

    def __len__(self) -> int:
        return 2

    def __iter__(self) -> Iterator[str]:
        yield "a"
        self.seen = fingerprint(self.ledger)
        raise RuntimeError("halfway")


def test_a_what_if_raising_midway_leaves_the_ledger_unchanged_and_unchanged_meanwhile() -> None:
    ledger = two_pods()
    before = fingerprint(ledger)
    squeezes = RaisesMidway(ledger)
    with pytest.raises(RuntimeError, match="halfway"):
        fits_squeezed(Snapshot(ledger), WANTS_HALF, "n0", squeezes)
    assert squeezes.seen == before  # nobody saw a's grant lowered while the question ran
    assert fingerprint(ledger) == before


def test_answers_are_the_hand_computed_ones() -> None:
    ledger = two_pods()
    snapshot = Snapshot(ledger)
    # GPU 0 has 1000 - 600 - 300 = 100 milli free, GPU 1 none (memory is plenty everywhere).
    assert not snapshot.fits(WANTS_HALF, "n0")
    assert not fits_without(ledger, WANTS_HALF, "n0", {"b"})  # 400 free
    assert fits_without(ledger, WANTS_HALF, "n0", {"a"})  # 700 free
    assert not fits_squeezed(snapshot, WANTS_HALF, "n0", {"a": 300})  # 1000 - 300 - 300 = 400 free
    assert fits_squeezed(snapshot, WANTS_HALF, "n0", {"a": 200})  # exactly 500 free
    assert fits_squeezed(snapshot, WANTS_HALF, "n0", {"a": 200, "b": 100, "gone": 100})  # an unknown pod: ignored
    assert snapshot.takes("b", Allocation("b", "n0", (GPUGrant("n0-GPU-0", 0, 400, 4096),)))  # 300 + the 100 free
    assert not snapshot.takes("b", Allocation("b", "n0", (GPUGrant("n0-GPU-0", 0, 500, 4096),)))
    assert not snapshot.fits(WANTS_HALF, "elsewhere")


def test_a_snapshot_kept_across_a_change_of_the_ledger_refuses_to_answer() -> None:
    ledger = two_pods()
    snapshot = Snapshot(ledger)
    ledger.forget("b")
    with pytest.raises(StaleSnapshot):
        snapshot.fits(WANTS_HALF, "n0")


# --- property: no question ever changes the live state, and each answers as the live state would ------------

def reference(ledger: Ledger, request: PodRequest, where: str, gone: set[str],
              regrants: Mapping[str, Allocation]) -> bool:
    """The question answered the old way, on a deep copy of the live state: release, regrant, check."""
    state: ClusterState = copy.deepcopy(ledger.state)
    for uid in gone:
        state.release(uid)
    for uid, allocation in regrants.items():
        if uid in state.held and state.held[uid].allocation.node == where:
            state.regrant(uid, allocation)
    i = state.index.get(where)
    return i is not None and bool(check(state, request, np.asarray([i], dtype=np.int64)).code[0] == OK)


pods = st.lists(st.tuples(st.sampled_from(["n0", "n1"]), st.integers(0, 1), st.integers(1, 10),
                          st.integers(0, 8)), max_size=12)
questions = st.lists(st.tuples(st.sampled_from(["n0", "n1", "n2"]), st.integers(1, 10), st.integers(0, 4),
                               st.sets(st.integers(0, 11)), st.dictionaries(st.integers(0, 11), st.integers(1, 10))),
                     min_size=1, max_size=6)


@settings(max_examples=80, deadline=None)
@given(pods, questions)
def test_what_ifs_never_change_the_live_state(held: list[tuple[str, int, int, int]],
                                              asked: list[tuple[str, int, int, set[int], dict[int, int]]]) -> None:
    ledger = Ledger([node("n0"), node("n1")])
    for k, (where, gpu, tenths, gib) in enumerate(held):
        grant = GPUGrant(f"{where}-GPU-{gpu}", gpu, tenths * 100, gib * 1024)
        ledger.assume(f"u{k}", f"default/u{k}", PodRequest(f"u{k}", 500, 512, GPURequest(1, tenths * 100, gib * 1024)),
                      Allocation(f"u{k}", where, (grant,)), 1e12)  # refused ones simply are not held
    before = fingerprint(ledger)
    snapshot = Snapshot(ledger)
    for where, tenths, gib, gone_ids, squeeze_ids in asked:
        request = PodRequest("p", 1000, 1024, GPURequest(1, tenths * 100, gib * 1024))
        gone = {f"u{k}" for k in gone_ids}
        squeezes = {f"u{k}": milli * 100 for k, milli in squeeze_ids.items()}
        regrants = {uid: squeezed_allocation(a, milli) for uid, milli in squeezes.items()
                    if (a := snapshot.holds(uid)) is not None}
        assert snapshot.fits(request, where, gone) == reference(ledger, request, where, gone, {})
        assert fits_squeezed(snapshot, request, where, squeezes) == reference(ledger, request, where, set(), regrants)
        for uid, allocation in regrants.items():
            snapshot.takes(uid, allocation)
        assert fingerprint(ledger) == before
