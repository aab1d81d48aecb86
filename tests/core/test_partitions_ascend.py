"""Ascend vNPU geometry (gpupool.core.partitions): the 910-class training card and the 310P against a
brute-force oracle over every count of every template, the MindCluster examples, and invariants."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

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

T910 = "Ascend910B"
T310 = "Ascend310P"

# The oracle's statement of the rules, per template: (AI Cores, AI CPUs).
TRAINING = {"vir02": 2, "vir04": 4, "vir08": 8, "vir16": 16}
INFERENCE = {"vir01": (1, 1), "vir02": (2, 2), "vir02_1c": (2, 1), "vir04": (4, 4), "vir04_3c": (4, 3)}


def training_ok(n: Counter[str]) -> bool:
    """30 AI Cores, at most 15 vNPUs (MindCluster: "30 AI Cores: at most 15 virtual instances")."""
    return sum(TRAINING[t] * k for t, k in n.items()) <= 30 and sum(n.values()) <= 15


def inference_ok(n: Counter[str]) -> bool:
    """8 AI Cores, 7 AI CPUs, 4 vGroups of at least 2 AI Cores (vir01s pair up in one), 7 vNPUs."""
    pairs = (n["vir01"] + 1) // 2
    groups = pairs + sum(k for t, k in n.items() if t != "vir01")
    cores = 2 * pairs + sum(INFERENCE[t][0] * k for t, k in n.items() if t != "vir01")
    cpus = sum(INFERENCE[t][1] * k for t, k in n.items())
    return cores <= 8 and cpus <= 7 and groups <= 4 and sum(n.values()) <= 7


def counts(templates: list[str], limit: int) -> list[Counter[str]]:
    """Every multiset of `templates` with each count in 0..limit."""
    out = []
    for ks in itertools.product(range(limit + 1), repeat=len(templates)):
        out.append(Counter({t: k for t, k in zip(templates, ks, strict=True) if k}))
    return out


def as_counter(layout: tuple[PlacedInstance, ...]) -> Counter[str]:
    return Counter(i.profile for i in layout)


def key(n: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(n.items()))


def lay(*names: str) -> tuple[PlacedInstance, ...]:
    return tuple(PlacedInstance(n, k) for k, n in enumerate(names))


@pytest.mark.parametrize(("model", "templates", "ok", "limit"), [
    (T910, list(TRAINING), training_ok, 16),
    (T310, list(INFERENCE), inference_ok, 8),
])
def test_every_valid_layout_matches_the_oracle(model: str, templates: list[str], ok: Callable[[Counter[str]], bool],
                                                limit: int) -> None:
    expected = {key(n) for n in counts(templates, limit) if ok(n)}
    found = [key(as_counter(lay_)) for lay_ in valid_layouts(model)]
    assert len(found) == len(set(found))  # each multiset once
    assert set(found) == expected
    # maximal: valid, and no template can be added under the oracle's rules
    maximal = {k for k in expected if not any(ok(Counter(dict(k)) + Counter({t: 1})) for t in templates)}
    assert {key(as_counter(lay_)) for lay_ in maximal_layouts(model)} == maximal


@pytest.mark.parametrize(("model", "templates", "ok"), [
    (T910, list(TRAINING), training_ok), (T310, list(INFERENCE), inference_ok)])
def test_layout_problems_agree_with_the_oracle_on_every_multiset(model: str, templates: list[str],
                                                                ok: Callable[[Counter[str]], bool]) -> None:
    for n in counts(templates, 8 if model == T310 else 16):
        if sum(n.values()) > 20:
            continue
        layout = lay(*sorted(n.elements()))
        assert (layout_problems(model, layout) == []) == ok(n), n


def test_mindcluster_training_examples() -> None:
    # "30 AI Cores: not two vir16, only one; the other 14 as vir08 + vir04 + vir02" and "at most 15"
    # 2 x 16 = 32 AI Cores; 2 x 34,952 = 69,904 MiB
    assert layout_problems(T910, lay("vir16", "vir16")) == [
        "more than 1 partition(s) of vir16 on Ascend910B", "32 AI Cores asked, Ascend910B has 30",
        "69904 MiB asked, Ascend910B has 65536 MiB"]
    full = lay("vir16", "vir08", "vir04", "vir02")
    assert layout_problems(T910, full) == [] and full in maximal_layouts(T910)
    assert layout_problems(T910, lay(*["vir02"] * 15)) == []
    assert layout_problems(T910, lay(*["vir02"] * 16)) == [
        "vir02: vNPU index 15 is outside 0-14", "16 vNPUs, Ascend910B allows at most 15",
        "32 AI Cores asked, Ascend910B has 30", "69904 MiB asked, Ascend910B has 65536 MiB"]


def test_mindx_310p_example_six_vir01_then_one_more() -> None:
    # "after six vir01 two more vir01 cannot be carved; one vir02_1c can (or one vir01, wasting an AI Core)"
    six = ["vir01"] * 6
    assert layout_problems(T310, lay(*six, "vir01", "vir01")) == [
        "vir01: vNPU index 7 is outside 0-6", "8 vNPUs, Ascend310P allows at most 7",
        "8 AI CPUs asked, Ascend310P has 7"]
    assert layout_problems(T310, lay(*six, "vir02_1c")) == []
    assert layout_problems(T310, lay(*six, "vir01")) == []
    assert layout_problems(T310, lay(*six, "vir02")) == ["8 AI CPUs asked, Ascend310P has 7"]


def test_310p_vgroups_and_cores() -> None:
    # a lone vir01 holds a 2-core vGroup: vir04 + vir02 + vir01 + vir01 is 4 + 2 + 2 = 8 AI Cores, 3 vGroups
    u = usage(MODELS[T310], lay("vir04", "vir02_1c", "vir01", "vir01"))
    assert (u.compute_units, u.ai_cpus, u.vgroups, u.partitions) == (8, 7, 3, 4)
    # vir04 + vir04 is 8 AI Cores but 8 AI CPUs: only vir04 + vir04_3c fits
    assert layout_problems(T310, lay("vir04", "vir04")) == ["8 AI CPUs asked, Ascend310P has 7"]
    assert layout_problems(T310, lay("vir04", "vir04_3c")) == []
    # four vir02_1c (8 cores, 4 CPUs, 24,576 MiB) plus a vir01: a fifth vGroup, 10 cores, 27,648 MiB
    assert layout_problems(T310, lay(*["vir02_1c"] * 4, "vir01")) == [
        "10 AI Cores asked (one or two vir01 hold a 2-core vGroup), Ascend310P has 8",
        "27648 MiB asked, Ascend310P has 24576 MiB", "5 vGroups needed, Ascend310P has at most 4"]


def test_template_sizes() -> None:
    t = MODELS[T910]
    # 64 GB = 65,536 MiB over 30 AI Cores, rounded down: vir02 = 65,536 x 2 // 30 = 4,369; vir16 = 34,952
    assert [(p.name, p.compute_units, p.memory_mib, p.max_count) for p in t.profiles] == [
        ("vir02", 2, 4369, 15), ("vir04", 4, 8738, 7), ("vir08", 8, 17476, 3), ("vir16", 16, 34952, 1)]
    i = MODELS[T310]
    # 24,576 MiB / 8 AI Cores = 3,072 MiB per core: HAMi's 310P3 vir01/vir02/vir04 sizes
    assert [(p.name, p.memory_mib, p.ai_cpus) for p in i.profiles] == [
        ("vir01", 3072, 1), ("vir02", 6144, 2), ("vir02_1c", 6144, 1), ("vir04", 12288, 4), ("vir04_3c", 12288, 3)]


def test_vnpu_indices() -> None:
    assert free_starts(T910, lay("vir16"), "vir08") == [1]
    assert free_starts(T910, (PlacedInstance("vir02", 0), PlacedInstance("vir02", 2)), "vir02") == [1]
    assert free_starts(T910, lay("vir16", "vir08", "vir04", "vir02"), "vir02") == []
    assert layout_problems(T910, (PlacedInstance("vir02", 0), PlacedInstance("vir04", 0))) == [
        "vir04: vNPU index 0 is taken by another vNPU"]
    assert layout_problems(T910, (PlacedInstance("vir02", 15),)) == ["vir02: vNPU index 15 is outside 0-14"]
    assert layout_problems(T310, lay("vir08"))[0].startswith("vir08: not a profile of Ascend310P")


def test_lookup_by_alias() -> None:
    found = partition_model("310P3")
    assert found is not None and found.name == T310
    found = partition_model("Ascend 910B")
    assert found is not None and found.name == T910


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([T910, T310]),
       st.lists(st.sampled_from(["vir01", "vir02", "vir02_1c", "vir04", "vir04_3c", "vir08", "vir16"]), max_size=25))
def test_a_layout_grown_by_can_add_stays_valid_and_within_the_card(model: str, tries: list[str]) -> None:
    m = MODELS[model]
    layout: tuple[PlacedInstance, ...] = ()
    for name in tries:
        starts = free_starts(m, layout, name)
        if starts:
            assert can_add(m, layout, name, starts[0])
            layout = (*layout, PlacedInstance(name, starts[0]))
            assert layout_problems(m, layout) == []
    u = usage(m, layout)
    assert u.compute_units <= m.compute_units and u.memory_mib <= m.memory_mib
    assert u.partitions <= m.max_partitions
    assert (training_ok if model == T910 else inference_ok)(as_counter(layout))
