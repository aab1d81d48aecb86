"""Placement on AMD and Ascend cards (gpupool.core.partitions): fragmentation in the MIG plugin's manner
(idle units the expected demand could not use) and the carving `choose` prefers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.mig import PlacedInstance
from gpupool.core.mig_placement import MigChoice, MigInstance, MigRefusal
from gpupool.core.partitions import (
    MODELS,
    PartitionCard,
    choose,
    fragmentation,
    layout_problems,
    options,
)

MI300X = "MI300X"
T910 = "Ascend910B"
T310 = "Ascend310P"


def chosen(result: MigChoice | MigRefusal) -> MigChoice:
    assert isinstance(result, MigChoice), result
    return result


def used(profile: str, start: int) -> MigInstance:
    return MigInstance(profile, start, used=True)


def idle(profile: str, start: int) -> MigInstance:
    return MigInstance(profile, start, used=False)


def test_amd_fragmentation_counts_idle_xccs_of_the_wrong_mode() -> None:
    one_cpx = (used("CPX/NPS4", 0),)
    # 7 XCCs idle; a DPX/NPS1 pod cannot use any of them while the card is in CPX/NPS4
    assert fragmentation(MI300X, one_cpx, {"DPX/NPS1": 1.0}) == 7
    # a CPX/NPS4 pod can use all 7
    assert fragmentation(MI300X, one_cpx, {"CPX/NPS4": 1.0}) == 0
    # half and half: 0.5 x 7 + 0.5 x 0
    assert fragmentation(MI300X, one_cpx, {"DPX/NPS1": 0.5, "CPX/NPS4": 0.5}) == 3.5
    # an empty card, or one whose partitions are all idle, can take any mode
    assert fragmentation(MI300X, (), {"SPX/NPS1": 1.0}) == 0
    assert fragmentation(MI300X, tuple(idle("CPX/NPS4", s) for s in range(8)), {"DPX/NPS1": 1.0}) == 0


def test_amd_choose_keeps_empty_cards_free_for_other_modes() -> None:
    cards = [PartitionCard(MI300X), PartitionCard(MI300X, (used("CPX/NPS4", 0),))]
    # on card 1 a second CPX/NPS4 shrinks its DPX fragment 7 -> 6; on card 0 it makes 7 XCCs unusable
    c = chosen(choose(cards, "CPX/NPS4", {"DPX/NPS1": 1.0}))
    assert (c.gpu, c.option.start, c.option.reuse, c.fragment_delta) == (1, 1, False, -1.0)


def test_amd_choose_prefers_an_idle_partition_of_the_mode() -> None:
    card = PartitionCard(MI300X, (used("QPX/NPS4", 0), idle("QPX/NPS4", 2), idle("QPX/NPS4", 4), idle("QPX/NPS4", 6)))
    c = chosen(choose([card], "QPX/NPS4", {"QPX/NPS4": 1.0}))
    assert (c.option.start, c.option.reuse) == (2, True)
    assert [(o.start, o.reuse) for o in options(card, "QPX/NPS4")] == [(2, True), (4, True), (6, True)]


def test_amd_mode_change_replaces_idle_partitions_of_the_old_mode() -> None:
    card = PartitionCard(MI300X, tuple(idle("CPX/NPS4", s) for s in range(8)))
    after = card.with_partition("DPX/NPS1", 0)
    assert after.instances == (used("DPX/NPS1", 0),)


def test_ascend_fragmentation_counts_ai_cores_the_template_cannot_fill() -> None:
    card = (used("vir16", 0),)
    # 14 AI Cores idle; one vir08 fits (8), 6 are a fragment for it; seven vir02 fill all 14
    assert fragmentation(T910, card, {"vir08": 1.0}) == 6
    assert fragmentation(T910, card, {"vir02": 1.0}) == 0
    assert fragmentation(T910, card, {"vir16": 1.0}) == 14
    # an idle vNPU holds its AI Cores for its own template only: an idle vir08 leaves 6 for vir04 (one fits,
    # 4) and is 8 more the vir04 demand cannot use -> 14 - 4 = 10
    assert fragmentation(T910, (used("vir16", 0), idle("vir08", 1)), {"vir04": 1.0}) == 10
    assert fragmentation(T910, (used("vir16", 0), idle("vir08", 1)), {"vir08": 1.0}) == 6


def test_ascend_choose_packs_small_templates_beside_a_used_card() -> None:
    cards = [PartitionCard(T910), PartitionCard(T910, (used("vir16", 0),))]
    # card 1: vir16 fragment 14 -> 12 (delta -2); card 0: 0 -> 28 - 16 = 12 (delta +12)
    c = chosen(choose(cards, "vir02", {"vir16": 1.0}))
    assert (c.gpu, c.option.start, c.option.reuse, c.fragment_delta) == (1, 1, False, -2.0)


def test_refusals_name_the_reason() -> None:
    full = PartitionCard(T910, (used("vir16", 0), used("vir08", 1), used("vir04", 2), used("vir02", 3)))
    assert choose([full], "vir02", {}) == MigRefusal("no card has an idle vir02 partition or room for a new one")
    assert choose([full, PartitionCard(MI300X)], "vir01", {}) == MigRefusal(
        "profile vir01 exists on none of the 2 card(s) given")


PROFILES = {MI300X: [p.name for p in MODELS[MI300X].profiles], T910: [p.name for p in MODELS[T910].profiles],
            T310: [p.name for p in MODELS[T310].profiles]}


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_choose_keeps_every_card_valid_and_fragmentation_within_the_idle_units(data: st.DataObject) -> None:
    model = data.draw(st.sampled_from(sorted(PROFILES)))
    names = PROFILES[model]
    demand = {n: 1.0 / len(names) for n in names}
    cards = [PartitionCard(model), PartitionCard(model)]
    for profile in data.draw(st.lists(st.sampled_from(names), max_size=12)):
        result = choose(cards, profile, demand)
        if isinstance(result, MigRefusal):
            assert all(not options(c, profile) for c in cards)
            continue
        card = cards[result.gpu]
        cards[result.gpu] = card.with_partition(result.option.profile, result.option.start)
        layout = tuple(PlacedInstance(i.profile, i.start) for i in cards[result.gpu].instances)
        assert layout_problems(model, layout) == []
        m = MODELS[model]
        units = m.slots or m.compute_units
        assert 0 <= fragmentation(model, cards[result.gpu].instances, demand) <= units
