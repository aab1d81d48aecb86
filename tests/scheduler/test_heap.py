"""gpupool.scheduler.heap: the cached cluster moved out of the collector's way, and still freed."""

from __future__ import annotations

import gc
import weakref

import pytest

from gpupool.scheduler.heap import keep_frozen, stop_freezing


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
