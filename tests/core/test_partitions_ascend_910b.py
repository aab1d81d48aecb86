"""The real 910B variants' vNPU geometry (gpupool.core.partitions over core.vendors.ASCEND_910B_VARIANTS):
every valid layout of each model against a brute-force oracle that states the rules on its own (each template's
AI Cores, AI CPUs and memory as its name gives them, the chip's three capacities, at most 16 vNPUs), the
documented examples, and a growth property."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.mig import PlacedInstance
from gpupool.core.mig_placement import MigChoice
from gpupool.core.partitions import (
    MODELS,
    PartitionCard,
    can_add,
    choose,
    free_starts,
    layout_problems,
    maximal_layouts,
    partition_model,
    usage,
    valid_layouts,
)

# The oracle's own statement, per model: (AI Cores, AI CPUs, MiB) of the chip and of each template (HAMi's table).
CHIPS: dict[str, tuple[tuple[int, int, int], dict[str, tuple[int, int, int]]]] = {
    "Ascend910B2": ((24, 6, 65536), {"vir03_1c_8g": (3, 1, 8192), "vir06_1c_16g": (6, 1, 16384),
                                     "vir12_3c_32g": (12, 3, 32768)}),
    "Ascend910B3": ((20, 7, 65536), {"vir05_1c_16g": (5, 1, 16384), "vir10_3c_32g": (10, 3, 32768)}),
    "Ascend910B4": ((20, 7, 32768), {"vir05_1c_8g": (5, 1, 8192), "vir10_3c_16g": (10, 3, 16384)}),
}
MAX_VNPUS = 16  # npu-smi's 16 vNPU ids per chip


def ok(model: str, n: Counter[str]) -> bool:
    (cores, cpus, mib), templates = CHIPS[model]
    return (sum(templates[t][0] * k for t, k in n.items()) <= cores
            and sum(templates[t][1] * k for t, k in n.items()) <= cpus
            and sum(templates[t][2] * k for t, k in n.items()) <= mib
            and sum(n.values()) <= MAX_VNPUS)


def every_count(model: str, limit: int = 9) -> list[Counter[str]]:
    names = list(CHIPS[model][1])
    return [Counter({t: k for t, k in zip(names, ks, strict=True) if k})
            for ks in itertools.product(range(limit + 1), repeat=len(names))]


def key(n: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(n.items()))


def lay(*names: str) -> tuple[PlacedInstance, ...]:
    return tuple(PlacedInstance(n, k) for k, n in enumerate(names))


@pytest.mark.parametrize("model", sorted(CHIPS))
def test_every_valid_layout_matches_the_oracle(model: str) -> None:
    expected = {key(n) for n in every_count(model) if ok(model, n)}
    found = [key(Counter(i.profile for i in layout)) for layout in valid_layouts(model)]
    assert len(found) == len(set(found)) and set(found) == expected
    maximal = {k for k in expected if not any(ok(model, Counter(dict(k)) + Counter({t: 1})) for t in CHIPS[model][1])}
    assert {key(Counter(i.profile for i in layout)) for layout in maximal_layouts(model)} == maximal


@pytest.mark.parametrize("model", sorted(CHIPS))
def test_layout_problems_agree_with_the_oracle_on_every_multiset(model: str) -> None:
    for n in every_count(model):
        assert (layout_problems(model, lay(*sorted(n.elements()))) == []) == ok(model, n), n


def test_the_counts_by_hand() -> None:
    # 910B3 (and 910B4, the same shape at half the memory): a vir05 and b vir10 with 5a + 10b <= 20 and
    # a + 3b <= 7: b = 0 -> a 0..4 (5), b = 1 -> a 0..2 (3), b = 2 -> a 0 (1): 9 layouts; maximal (4, 0), (2, 1),
    # (0, 2).
    for model in ("Ascend910B3", "Ascend910B4"):
        assert (len(valid_layouts(model)), len(maximal_layouts(model))) == (9, 3)
    assert (len(valid_layouts("Ascend910B2")), len(maximal_layouts("Ascend910B2"))) == (31, 9)


def test_the_documented_examples() -> None:
    # npu-smi on a 910B3 carved into two vir10_3c_32g: AI Cores 0/20 and memory 0/64 GB free, AI CPUs 1/7.
    u = usage(MODELS["Ascend910B3"], lay("vir10_3c_32g", "vir10_3c_32g"))
    assert (20 - u.compute_units, 7 - u.ai_cpus, 65536 - u.memory_mib) == (0, 1, 0)
    assert free_starts("Ascend910B3", lay("vir10_3c_32g", "vir10_3c_32g"), "vir05_1c_16g") == []
    # The 910B2's 6 AI CPUs bind before its 24 AI Cores: six vir03_1c_8g (18 cores) and no seventh.
    six = lay(*["vir03_1c_8g"] * 6)
    assert layout_problems("Ascend910B2", six) == []
    assert layout_problems("Ascend910B2", lay(*["vir03_1c_8g"] * 7)) == [
        "vir03_1c_8g: vNPU index 6 is outside 0-5", "7 vNPUs, Ascend910B2 allows at most 6",
        "7 AI CPUs asked, Ascend910B2 has 6"]
    # The 910B4's 32 GB: two vir10_3c_16g fill it.
    assert layout_problems("Ascend910B4", lay("vir10_3c_16g", "vir10_3c_16g", "vir05_1c_8g")) == [
        "25 AI Cores asked, Ascend910B4 has 20", "40960 MiB asked, Ascend910B4 has 32768 MiB"]


def test_templates_of_one_variant_are_not_anothers() -> None:
    assert layout_problems("Ascend910B3", lay("vir16"))[0].startswith("vir16: not a profile of Ascend910B3")
    assert layout_problems("Ascend910B4", lay("vir05_1c_16g"))[0].startswith("vir05_1c_16g: not a profile")
    found = partition_model("910B3")
    assert found is not None and found.name == "Ascend910B3"
    assert [p.name for p in MODELS["Ascend910B2"].profiles] == ["vir03_1c_8g", "vir06_1c_16g", "vir12_3c_32g"]


def test_choose_keeps_the_larger_template_possible() -> None:
    # A 910B3 with one vir05 and an empty one: a second vir05 goes beside the first (the card still takes a
    # vir10 after it), so the empty card keeps its two vir10s.
    cards = [PartitionCard("Ascend910B3"), PartitionCard("Ascend910B3", ())]
    one = cards[0].with_partition("vir05_1c_16g", 0)
    got = choose([one, cards[1]], "vir05_1c_16g", {"vir05_1c_16g": 0.5, "vir10_3c_32g": 0.5})
    assert isinstance(got, MigChoice) and got.gpu == 0 and got.option.start == 1


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(CHIPS)), st.lists(st.integers(0, 2), max_size=20))
def test_a_layout_grown_by_can_add_stays_valid_and_within_the_chip(model: str, picks: list[int]) -> None:
    m = MODELS[model]
    names = [p.name for p in m.profiles]
    layout: tuple[PlacedInstance, ...] = ()
    for k in picks:
        name = names[k % len(names)]
        starts = free_starts(m, layout, name)
        if starts:
            assert can_add(m, layout, name, starts[0])
            layout = (*layout, PlacedInstance(name, starts[0]))
    assert layout_problems(m, layout) == [] and ok(model, Counter(i.profile for i in layout))
    u = usage(m, layout)
    assert u.compute_units <= m.compute_units and u.memory_mib <= m.memory_mib and u.ai_cpus <= m.ai_cpus
