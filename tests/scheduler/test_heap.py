"""gpupool.scheduler.heap: the cached cluster moved out of the collector's way, and still freed."""

from __future__ import annotations

import gc
import weakref

import pytest

from gpupool.scheduler.heap import handed_back, keep_frozen, stop_freezing


class Cached:
    """Stands for a cached API object (decoded JSON holds no cycles)."""

    def __init__(self, k: int) -> None:
        self.body = {"metadata": {"name": f"pod-{k}"}}


@pytest.fixture
def freezing():  # type: ignore[no-untyped-def]
    keep_frozen()
    yield
    stop_freezing()  # the suite's other tests keep the collector as it was


def walked() -> set[int]:
    """What a collection walks (the permanent generation is not in it)."""
    return {id(o) for o in gc.get_objects()}


def test_frozen_objects_are_skipped_by_collections_and_freed_when_dropped() -> None:
    cache = [Cached(k) for k in range(2000)]
    keep_frozen()
    try:
        assert not any(id(c) in walked() for c in cache[:50])
        made_later = Cached(-1)
        assert id(made_later) in walked()
        # Refcounting still frees a frozen object nothing refers to (a pod replaced by its next version).
        gone = weakref.ref(cache[0])
        del cache[0]
        assert gone() is None
    finally:
        stop_freezing()
    assert id(cache[1]) in walked()  # unfrozen again: collectable as before


def test_the_survivors_of_each_full_collection_are_frozen_and_new_objects_are_not(freezing) -> None:  # type: ignore[no-untyped-def]
    newer = [Cached(k) for k in range(100)]
    assert id(newer[0]) in walked()
    gc.collect()  # a full pass, as the collector runs one when enough objects survived
    assert id(newer[0]) not in walked()
    after = Cached(-2)
    gc.collect(generation=1)  # a younger pass freezes nothing
    assert id(after) in walked()


class Cyclic:
    """Stands for what does form a cycle (a task, a future and its callback, an exception and its frame)."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def no_automatic_collections():  # type: ignore[no-untyped-def]
    # Only the test's own gc.collect() calls run (the callback runs for them as for automatic ones), so
    # which pass hands the frozen part back does not depend on how many objects the suite has made.
    gc.disable()
    yield
    gc.enable()


def test_a_cycle_that_dies_frozen_is_collected_once_the_frozen_part_has_grown(no_automatic_collections) -> None:  # type: ignore[no-untyped-def]
    keep_frozen(regrow=1.05)
    try:
        doomed = Cyclic()
        gone = weakref.ref(doomed)
        gc.collect()  # a full pass: the cycle, alive, is frozen with the other survivors
        del doomed
        gc.collect()
        assert gone() is not None  # the price: frozen, so no pass sees that it died
        assert handed_back() == 0
        # Grow the heap by more than 5 %: each Cached is at least two tracked objects (itself, its dicts).
        growth = [Cached(k) for k in range(gc.get_freeze_count() // 20 + 1000)]
        gc.collect()  # its survivors frozen, the frozen part is past 1.05 times: handed back
        assert handed_back() == 1
        assert id(growth[0]) in walked()
        gc.collect()  # this pass walks everything, the dead cycle included, and freezes the survivors
        assert gone() is None
        assert id(growth[0]) not in walked()
        gc.collect()  # the frozen part measured again after that pass: no second hand-back
        assert handed_back() == 1
    finally:
        stop_freezing()


def test_regrow_must_be_above_one() -> None:
    with pytest.raises(ValueError, match="regrow must be above 1"):
        keep_frozen(regrow=1.0)
    assert handed_back() == 0
