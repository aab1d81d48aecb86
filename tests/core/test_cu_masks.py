"""CU masks for AMD shares (gpupool.core.cu_masks): how many CUs, which ones, and how they spread over XCCs and
shader engines. Expected bits are worked out by hand from KFD's mapping (bit i on XCC i mod 8, its k = i div 8
going round the four engines), written out in each test."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.cu_masks import CuGeometry, CuShortage, choose_cus, counts, geometry_for, share_cus
from gpupool.core.vendors import AMD, MODELS

MI300X = geometry_for("MI300X", 304)
MI210 = geometry_for("MI210", 104)


# ---- the catalogue's layouts ------------------------------------------------------------------------------
def test_the_amd_models_carry_their_cu_layout() -> None:
    assert (MI300X.xccs, MI300X.shader_engines) == (8, 4)
    assert geometry_for("AMD Instinct MI325X", 304) == CuGeometry(304, 8, 4)
    assert (MI210.xccs, MI210.shader_engines) == (1, 8)
    for row in MODELS.values():  # every AMD row's engines hold its CUs; no other vendor's row claims a layout
        if row.vendor == AMD:
            assert row.compute_units % row.xccs == 0 and row.compute_units // row.xccs >= row.shader_engines
        else:
            assert (row.xccs, row.shader_engines) == (1, 0), row.name


def test_a_card_gpupool_cannot_place_gets_one_flat_group() -> None:
    assert geometry_for("MI300X", 152) == CuGeometry(152)  # a partition's count: not the catalogue's card
    assert geometry_for("Radeon 7900", 96) == CuGeometry(96)
    assert geometry_for("H100-80GB", 132) == CuGeometry(132)
    with pytest.raises(ValueError, match="at least 1"):
        CuGeometry(0)


def test_positions_follow_kfds_walk() -> None:
    # bit i: XCC i % 8, k = i // 8, engine k % 4 while k < 4 * 9 (every engine of a 38-CU XCC has 9 or more)
    assert MI300X.position(0) == (0, 0)
    assert MI300X.position(7) == (7, 0)
    assert MI300X.position(8) == (0, 1)
    assert MI300X.position(37) == (5, 0)  # k = 4
    assert MI300X.position(287) == (7, 3)  # k = 35, the last bit whose engine is known
    assert MI300X.position(288) == (0, None)  # k = 36: the 10th CU of an engine that kept ten
    assert MI300X.position(303) == (7, None)
    assert MI210.position(13) == (0, 5)
    with pytest.raises(ValueError, match="outside the card's 0..303"):
        MI300X.position(304)


# ---- how many ---------------------------------------------------------------------------------------------
def test_share_cus_is_the_floor_of_the_percent_and_at_least_one() -> None:
    assert share_cus(25, 304) == 76
    assert share_cus(50, 104) == 52
    assert share_cus(33.3, 304) == 101  # 101.232
    assert share_cus(33.4, 304) == 101  # 101.536: floor, so three of them (303) still fit
    assert share_cus(1, 104) == 1  # 1.04
    assert share_cus(0.1, 304) == 1  # 0.304 rounds down to none: at least one
    assert share_cus(100, 304) == 304
    assert share_cus(12.5, 304) == 38  # exactly one XCC's worth
    for bad in (0, -5, 100.5):
        with pytest.raises(ValueError, match="not a percent"):
            share_cus(bad, 304)


# ---- which ones -------------------------------------------------------------------------------------------
def test_four_quarters_of_an_mi300x_are_four_consecutive_ranges() -> None:
    """25 % = 76 = 8 x 9.5: four XCCs get 10 and four get 9. The first share takes the lowest bits (KFD spreads
    them evenly); the second puts its four 10s on XCCs 4-7, which have 29 free to XCCs 0-3's 28, so each XCC
    is left with 19 free; and so on, so the four shares tile the card in order."""
    held: set[int] = set()
    for start in (0, 76, 152, 228):
        got = choose_cus(MI300X, 25, held)
        assert got == frozenset(range(start, start + 76))
        held |= got
    assert held == set(range(304))


def test_the_first_quarter_is_ten_or_nine_per_xcc_and_even_over_engines() -> None:
    got = counts(MI300X, choose_cus(MI300X, 25, ()))
    per_xcc = [sum(n for (x, _), n in got.items() if x == xcc) for xcc in range(8)]
    assert per_xcc == [10, 10, 10, 10, 9, 9, 9, 9]
    assert [got[(0, se)] for se in range(4)] == [3, 3, 2, 2]  # 10 over four engines
    assert [got[(4, se)] for se in range(4)] == [3, 2, 2, 2]  # 9


def test_the_second_quarter_on_xcc_0_takes_the_next_nine_of_its_bits() -> None:
    # after bits 0-75, XCC 0 holds k = 0..9; the second share gets 9 there: k = 10..18, bits 8k = 80..144
    second = choose_cus(MI300X, 25, range(76))
    assert sorted(c for c in second if c % 8 == 0) == list(range(80, 145, 8))


def test_half_an_mi210_is_its_lowest_52_bits() -> None:
    # one XCC, eight engines of 13: 52 = 6.5 x 8, engines 0-3 take 7 and 4-7 take 6, bits 0..51
    got = choose_cus(MI210, 50, ())
    assert got == frozenset(range(52))
    assert [counts(MI210, got)[(0, se)] for se in range(8)] == [7, 7, 7, 7, 6, 6, 6, 6]


def test_fragmented_free_cus_are_used_as_they_lie() -> None:
    # every even CU of an MI210 held: half the card is exactly the odd ones
    assert choose_cus(MI210, 50, range(0, 104, 2)) == frozenset(range(1, 104, 2))


def test_held_bits_beyond_the_card_hold_nothing_on_it() -> None:
    assert choose_cus(MI210, 100, [104, 500, -1]) == frozenset(range(104))


def test_a_share_that_does_not_fit_is_refused_with_the_numbers() -> None:
    with pytest.raises(CuShortage, match="needs 76 of the card's 304 CUs, and only 75 are free"):
        choose_cus(MI300X, 25, range(229))


# ---- properties -------------------------------------------------------------------------------------------
@st.composite
def cards(draw: st.DrawFn) -> CuGeometry:
    xccs = draw(st.integers(1, 8))
    engines = draw(st.integers(1, 8))
    return CuGeometry(draw(st.integers(1, 400)), xccs, engines)


@st.composite
def situations(draw: st.DrawFn) -> tuple[CuGeometry, set[int], float]:
    card = draw(cards())
    held = draw(st.sets(st.integers(0, card.cus - 1), max_size=card.cus))
    percent = draw(st.one_of(st.integers(1, 100), st.floats(0.01, 100)))
    return card, held, percent


@settings(max_examples=300, deadline=None)
@given(situations())
def test_a_share_is_exact_disjoint_on_the_card_and_as_even_as_the_free_cus_allow(
        case: tuple[CuGeometry, set[int], float]) -> None:
    card, held, percent = case
    wanted = share_cus(percent, card.cus)
    if card.cus - len(held) < wanted:
        with pytest.raises(CuShortage):
            choose_cus(card, percent, held)
        return
    got = choose_cus(card, percent, held)
    assert len(got) == wanted
    assert not got & held
    assert all(0 <= c < card.cus for c in got)
    # evenness: a group (XCC; engine within an XCC) has two more of the share than another only when the other
    # has no free CU left
    left = set(range(card.cus)) - held - got
    xcc_of = {c: card.position(c)[0] for c in range(card.cus)}
    mine = [sum(1 for c in got if xcc_of[c] == x) for x in range(card.xccs)]
    spare = [sum(1 for c in left if xcc_of[c] == x) for x in range(card.xccs)]
    for a in range(card.xccs):
        for b in range(card.xccs):
            assert mine[a] <= mine[b] + 1 or spare[b] == 0, (a, b, mine, spare)
    per_group, spare_group = counts(card, got), counts(card, left)
    for x in range(card.xccs):
        for s in range(card.shader_engines):
            for t in range(card.shader_engines):
                assert per_group.get((x, s), 0) <= per_group.get((x, t), 0) + 1 or not spare_group.get((x, t)), \
                    (x, s, t, per_group, spare_group)
        # the harvest-dependent bits only once the XCC's known engines are spent
        if per_group.get((x, None)):
            assert not any(spare_group.get((x, s)) for s in range(card.shader_engines)), (x, spare_group)


@settings(max_examples=150, deadline=None)
@given(st.integers(100, 400), st.integers(1, 8), st.integers(1, 8),
       st.lists(st.tuples(st.booleans(), st.integers(1, 100)), max_size=30))
def test_shares_the_ledger_admits_always_fit_in_any_order(cus: int, xccs: int, engines: int,
                                                          steps: list[tuple[bool, int]]) -> None:
    """The floor rule: while the live shares of a card sum to 100 % or less, a new one always finds its CUs,
    whatever came and went before (a step adds a share of p % when the ledger would admit it, or removes the
    oldest). Cards of 100 CUs or more, where a whole percent is at least one CU, so the at-least-one rule
    never adds to the floor."""
    card = CuGeometry(cus, xccs, engines)
    live: list[tuple[int, frozenset[int]]] = []
    for add, percent in steps:
        if not add:
            if live:
                live.pop(0)
            continue
        if sum(p for p, _ in live) + percent > 100:
            continue  # the ledger refuses it
        got = choose_cus(card, percent, {c for _, cus_ in live for c in cus_})
        live.append((percent, got))
    held = [c for _, cus_ in live for c in cus_]
    assert len(held) == len(set(held))
