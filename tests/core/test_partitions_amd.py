"""AMD Instinct partition geometry (gpupool.core.partitions): MI300X and MI325X against a brute-force oracle
written from the rules alone, hand-computed sizes, and invariants of layouts grown by can_add."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.mig import PlacedInstance
from gpupool.core.partitions import (
    MODELS,
    can_add,
    free_starts,
    layout_problems,
    maximal_layouts,
    partition_model,
    usage,
    valid_layouts,
)

AMD_MODELS = ("MI300X", "MI325X")

# The oracle's own statement of the rules (amdgpu, bare metal): partitions per compute mode on 8 XCCs, and
# the memory modes each compute mode accepts. Every (compute, memory) pair is tried, valid or not.
PARTS = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}
# NPS2 is not a memory mode of these chips on bare metal, so no compute mode takes it
ACCEPTS = {"SPX": {"NPS1"}, "DPX": {"NPS1"}, "QPX": {"NPS1", "NPS4"}, "CPX": {"NPS1", "NPS4"}}
ALL_PAIRS = [f"{c}/{m}" for c in PARTS for m in ("NPS1", "NPS2", "NPS4")]


def oracle_valid(layout: tuple[PlacedInstance, ...]) -> bool:
    """One profile for the whole card, a compatible pair, aligned starts inside the 8 XCCs, no repeats."""
    if not layout:
        return True
    names = {i.profile for i in layout}
    if len(names) != 1:
        return False
    compute, memory = next(iter(names)).split("/")
    if compute not in PARTS or memory not in ACCEPTS[compute]:
        return False
    width = 8 // PARTS[compute]
    starts = [i.start for i in layout]
    return len(set(starts)) == len(starts) and all(0 <= s < 8 and s % width == 0 for s in starts)


def oracle_layouts() -> set[tuple[PlacedInstance, ...]]:
    """Every valid layout: for each valid pair, every subset of its aligned starts."""
    out: set[tuple[PlacedInstance, ...]] = {()}
    for compute, n in PARTS.items():
        for memory in ACCEPTS[compute]:
            starts = [k * 8 // n for k in range(n)]
            for r in range(1, n + 1):
                for chosen in itertools.combinations(starts, r):
                    out.add(tuple(PlacedInstance(f"{compute}/{memory}", s) for s in chosen))
    return out


def lay(*items: tuple[str, int]) -> tuple[PlacedInstance, ...]:
    return tuple(PlacedInstance(p, s) for p, s in items)


@pytest.mark.parametrize("model", AMD_MODELS)
def test_every_valid_layout_matches_the_oracle(model: str) -> None:
    expected = oracle_layouts()
    assert set(valid_layouts(model)) == expected
    # 1 (empty) + SPX 1 + DPX 1x3 + QPX 2x15 + CPX 2x255 = 545 (each mode's nonempty subsets of its starts)
    assert len(expected) == 545


@pytest.mark.parametrize("model", AMD_MODELS)
def test_maximal_layouts_are_one_full_mode_per_valid_pair(model: str) -> None:
    full = {tuple(PlacedInstance(f"{c}/{m}", k * 8 // n) for k in range(n))
            for c, n in PARTS.items() for m in ACCEPTS[c]}
    assert set(maximal_layouts(model)) == full and len(full) == 6


@pytest.mark.parametrize("model", AMD_MODELS)
def test_layout_problems_agree_with_the_oracle_on_every_pair_of_partitions(model: str) -> None:
    """Every layout of up to two partitions over all 12 compute/memory pairs and starts 0-8."""
    m = MODELS[model]
    singles = [PlacedInstance(p, s) for p in ALL_PAIRS for s in range(9)]
    for n in (1, 2):
        for layout in itertools.product(singles, repeat=n):
            assert (layout_problems(m, layout) == []) == oracle_valid(layout), layout


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(AMD_MODELS),
       st.lists(st.tuples(st.sampled_from(ALL_PAIRS), st.integers(0, 8)), min_size=3, max_size=9))
def test_layout_problems_agree_with_the_oracle_on_larger_layouts(model: str, items: list[tuple[str, int]]) -> None:
    layout = lay(*items)
    assert (layout_problems(model, layout) == []) == oracle_valid(layout)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(AMD_MODELS), st.sampled_from(ALL_PAIRS), st.lists(st.integers(0, 8), min_size=3, max_size=9))
def test_layout_problems_agree_with_the_oracle_on_one_profile_layouts(model: str, profile: str,
                                                                      starts: list[int]) -> None:
    """One profile throughout (the case a mixed random layout rarely reaches): starts decide."""
    layout = tuple(PlacedInstance(profile, s) for s in starts)
    assert (layout_problems(model, layout) == []) == oracle_valid(layout)


def test_qpx_mi300x_is_four_partitions_of_76_cus_and_49152_mib() -> None:
    # 304 CUs / 4 = 76; 192 GB = 192 x 1024 = 196,608 MiB, / 4 = 49,152 MiB (one NPS4 memory domain each)
    m = MODELS["MI300X"]
    for name in ("QPX/NPS1", "QPX/NPS4"):
        p = m.profile(name)
        assert p is not None
        assert (p.compute_units, p.memory_mib, p.max_count, p.slots, p.starts) == (76, 49152, 4, 2, (0, 2, 4, 6))


def test_dpx_mi300x_is_152_cus_and_half_the_memory() -> None:
    # 304 / 2 = 152 CUs as AMD SMI shows; 196,608 / 2 = 98,304 MiB planned, where AMD SMI shows 98,296 MiB
    # (8 MiB less, kept back by the driver): the plan is total/N, the cap the HIP library enforces
    p = MODELS["MI300X"].profile("DPX/NPS1")
    assert p is not None and (p.compute_units, p.memory_mib, p.starts) == (152, 98304, (0, 4))


def test_cpx_mi325x_is_38_cus_and_32_gib() -> None:
    # 304 / 8 = 38 CUs (one XCC); 256 x 1024 = 262,144 MiB, / 8 = 32,768 MiB
    p = MODELS["MI325X"].profile("CPX/NPS4")
    assert p is not None and (p.compute_units, p.memory_mib, p.slots) == (38, 32768, 1)


def test_invalid_layouts_say_why() -> None:
    m = "MI300X"
    assert layout_problems(m, lay(("CPX/NPS4", 0), ("DPX/NPS1", 4))) == [
        "MI300X is in one partition mode at a time; the layout mixes CPX/NPS4, DPX/NPS1"]
    assert layout_problems(m, lay(("CPX/NPS4", 0), ("CPX/NPS1", 1))) == [
        "MI300X is in one partition mode at a time; the layout mixes CPX/NPS4, CPX/NPS1"]
    assert layout_problems(m, lay(("QPX/NPS4", 3))) == ["QPX/NPS4 cannot start at XCC 3 (allowed: 0, 2, 4, 6)"]
    assert layout_problems(m, lay(("DPX/NPS1", 4), ("DPX/NPS1", 4))) == ["DPX/NPS1 at XCC 4 overlaps another partition"]
    assert layout_problems(m, lay(("DPX/NPS1", 0), ("DPX/NPS1", 4), ("DPX/NPS1", 0))) == [
        "DPX/NPS1 at XCC 0 overlaps another partition", "more than 2 partition(s) of DPX/NPS1 on MI300X"]
    problems = layout_problems(m, lay(("SPX/NPS4", 0)))
    assert len(problems) == 1 and problems[0].startswith("SPX/NPS4: not a profile of MI300X (profiles: CPX/NPS1,")


def test_free_starts_follow_the_card_mode() -> None:
    m = MODELS["MI300X"]
    used = lay(("CPX/NPS4", 0), ("CPX/NPS4", 5))
    assert free_starts(m, used, "CPX/NPS4") == [1, 2, 3, 4, 6, 7]
    assert free_starts(m, used, "CPX/NPS1") == [] and free_starts(m, used, "SPX/NPS1") == []
    assert free_starts(m, (), "DPX/NPS1") == [0, 4]
    assert free_starts(m, (), "no-such") == []


def test_lookup_by_alias_and_cards_without_this_geometry() -> None:
    found = partition_model("AMD Instinct MI300X")
    assert found is not None and found.name == "MI300X" and found.slots == 8
    assert partition_model("MI210") is None  # CDNA2: no compute partitions
    assert partition_model("H100-80GB") is None  # MIG lives in gpupool.core.mig
    assert partition_model("G2") is None
    with pytest.raises(KeyError, match="MI210"):
        layout_problems("MI210", ())


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(AMD_MODELS), st.lists(st.tuples(st.sampled_from(ALL_PAIRS), st.integers(0, 7)), max_size=30))
def test_a_layout_grown_by_can_add_stays_valid_and_within_the_card(model: str, tries: list[tuple[str, int]]) -> None:
    m = MODELS[model]
    layout: tuple[PlacedInstance, ...] = ()
    for name, start in tries:
        if can_add(m, layout, name, start):
            layout = (*layout, PlacedInstance(name, start))
            assert layout_problems(m, layout) == []
    u = usage(m, layout)
    assert u.compute_units <= m.compute_units and u.memory_mib <= m.memory_mib
    assert u.xcc_mask & ~m.full_mask == 0 and u.partitions <= m.max_partitions
    assert oracle_valid(layout)
