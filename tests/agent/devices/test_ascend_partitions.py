"""Ascend vNPUs as partitions (AscendPartitions) over the fake DCMI library: every template on each card type,
the refusals (capacity, busy card, bad template or slot, static-only cards), destroy, and a property: any
sequence of creates and destroys keeps the AI Cores and memory in use within the card and equal to the sum
of the live vNPUs, and a create succeeds exactly when an independent model of the documented rules says so.

Expected figures are computed by hand from the vNPU guides: a template's memory is the card's memory times
its AI Cores over the card's AI Cores, rounded down (dcmi_fake.h), e.g. vir02 on a 30-core 64 GiB card:
65536 * 2 / 30 = 4369.07 -> 4369 MiB."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.agent.devices.ascend import AscendBackend, AscendPartitions
from gpupool.agent.devices.vendor import Partition, PartitionError
from tests.agent.fakes import ascend as fake

TRAINING = {"vir02": (2, 0), "vir04": (4, 0), "vir08": (8, 0), "vir16": (16, 0)}  # AI Cores, AI CPUs
# the 310P's DVPP variants (vir04_3c_ndvpp, vir04_4c_dvpp) exist on the card, but the scheduler's geometry
# (gpupool.core.partitions) does not model them, so the agent offers and carves none
INFERENCE = {"vir01": (1, 1), "vir02": (2, 2), "vir02_1c": (2, 1), "vir04": (4, 4), "vir04_3c": (4, 3)}


def open_card(path: Path, chip: dict[str, Any]) -> tuple[AscendPartitions, str]:
    """One card (id 5) with `chip` on it; the adapter and the chip's UUID."""
    fake.write_state(path, [{"card_id": 5, "chips": [chip]}])
    backend = AscendBackend(str(fake.library()), numa_reader=lambda bus: 0)
    return AscendPartitions(backend), backend.discover().devices[0].uuid


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "dcmi.json"
    monkeypatch.setenv(fake.STATE_ENV, str(path))
    return path


def code_of(call: Any, *args: Any) -> str:
    with pytest.raises(PartitionError) as e:
        call(*args)
    return e.value.code


# --- templates ---------------------------------------------------------------------------------------------
def test_profiles_are_the_card_familys_templates_smallest_first(state: Path) -> None:
    parts, uuid = open_card(state, fake.card_910b())
    assert parts.profiles(uuid) == ("vir02", "vir04", "vir08", "vir16")
    parts, uuid = open_card(state, fake.card_310p())
    assert parts.profiles(uuid) == ("vir01", "vir02_1c", "vir02", "vir04_3c", "vir04")
    assert code_of(parts.create, uuid, "vir04_4c_dvpp", 0) == "INVALID_ARGUMENT"  # on the card, not planned


@pytest.mark.parametrize(("chip", "template", "cores", "memory"), [
    (fake.card_910b(), "vir02", 2, 4096),
    (fake.card_910b(), "vir04", 4, 8192),
    (fake.card_910b(), "vir08", 8, 16384),
    (fake.card_910b(), "vir16", 16, 32768),
    (fake.card_910b(aicore=30), "vir02", 2, 4369),
    (fake.card_910b(aicore=30), "vir04", 4, 8738),
    (fake.card_910b(aicore=30), "vir08", 8, 17476),
    (fake.card_910b(aicore=30), "vir16", 16, 34952),
    (fake.card_910b(aicore=30, memory_mib=32768), "vir16", 16, 17476),  # the published 32 GiB figure
    (fake.card_310p(), "vir01", 1, 3072),
    (fake.card_310p(), "vir02", 2, 6144),
    (fake.card_310p(), "vir02_1c", 2, 6144),
    (fake.card_310p(), "vir04", 4, 12288),
    (fake.card_310p(), "vir04_3c", 4, 12288),
])
def test_every_template_on_each_card_type(state: Path, chip: dict[str, Any], template: str, cores: int,
                                          memory: int) -> None:
    parts, uuid = open_card(state, chip)
    made = parts.create(uuid, template, 3)
    # phy 0: vNPU ids start at 100, so slot 3 is vNPU 103
    assert made == Partition(uuid, "103", template, 3, memory, cores, ("/dev/vdavinci103",))
    assert parts.partitions(uuid) == (made,)
    assert fake.chip_state(state, 5)["vnpus"] == [{"vdev_id": 103, "template": template, "in_use": False}]


def test_vnpu_ids_follow_the_physical_id(state: Path) -> None:
    parts, uuid = open_card(state, fake.card_310p(phy_id=2))
    made = parts.create(uuid, "vir01", 0)
    assert (made.partition_id, made.start, made.device_nodes) == ("132", 0, ("/dev/vdavinci132",))  # 2*16+100


@pytest.mark.parametrize("chip", [fake.card_910b(dynamic_vnpu=False), fake.card_310p(dynamic_vnpu=False)])
def test_a_card_without_dynamic_vnpus_refuses_creation_and_keeps_none(state: Path, chip: dict[str, Any]) -> None:
    parts, uuid = open_card(state, chip)
    with pytest.raises(PartitionError) as e:
        parts.create(uuid, "vir04", 0)
    assert e.value.code == "NOT_SUPPORTED" and "DCMI_ERR_CODE_NOT_SUPPORT" in str(e.value)
    assert parts.partitions(uuid) == ()


def test_by_default_only_the_inference_card_creates_vnpus_dynamically(state: Path) -> None:
    """vendors.md: dynamic vNPUs only on inference cards (the fake's default; the parameter is swept above)."""
    parts, uuid = open_card(state, {k: v for k, v in fake.card_910b().items() if k != "dynamic_vnpu"})
    assert code_of(parts.create, uuid, "vir02", 0) == "NOT_SUPPORTED"
    parts, uuid = open_card(state, fake.card_310p())
    assert parts.create(uuid, "vir01", 0).profile == "vir01"


def test_static_vnpus_are_listed_with_their_slots(state: Path) -> None:
    chip = fake.card_910b(dynamic_vnpu=False, vnpus=[{"vdev_id": 107, "template": "vir08", "in_use": True},
                                                     {"vdev_id": 100, "template": "vir16", "in_use": False}])
    parts, uuid = open_card(state, chip)
    assert [(p.partition_id, p.profile, p.start, p.compute_units, p.memory_mib) for p in parts.partitions(uuid)] == [
        ("100", "vir16", 0, 16, 32768), ("107", "vir08", 7, 8, 16384)]
    assert code_of(parts.destroy, uuid, "100") == "NOT_SUPPORTED"  # static: an administrator's to remove


# --- refusals ----------------------------------------------------------------------------------------------
def test_a_32_core_card_takes_two_vir16_and_nothing_more(state: Path) -> None:
    parts, uuid = open_card(state, fake.card_910b())
    parts.create(uuid, "vir16", 0)
    parts.create(uuid, "vir16", 1)
    with pytest.raises(PartitionError) as e:
        parts.create(uuid, "vir02", 2)
    assert e.value.code == "INSUFFICIENT_RESOURCES" and "needs 2 AI Cores" in str(e.value)


def test_a_30_core_card_takes_one_vir16_then_vir08_vir04_vir02(state: Path) -> None:
    """The vNPU guide's own example: 30 cores hold one vir16, the other 14 split as vir08 + vir04 + vir02."""
    parts, uuid = open_card(state, fake.card_910b(aicore=30))
    parts.create(uuid, "vir16", 0)
    assert code_of(parts.create, uuid, "vir16", 1) == "INSUFFICIENT_RESOURCES"
    for slot, template in enumerate(("vir08", "vir04", "vir02"), start=1):
        parts.create(uuid, template, slot)
    assert sum(p.compute_units for p in parts.partitions(uuid)) == 30
    assert code_of(parts.create, uuid, "vir02", 4) == "INSUFFICIENT_RESOURCES"


def test_a_310p_after_six_vir01_takes_one_vir02_1c_but_no_vir02(state: Path) -> None:
    """The guide's example: 7 AI CPUs, so after six vir01 only a one-AI-CPU vNPU fits (vir02_1c)."""
    parts, uuid = open_card(state, fake.card_310p())
    for slot in range(6):
        parts.create(uuid, "vir01", slot)
    with pytest.raises(PartitionError) as e:
        parts.create(uuid, "vir02", 6)
    assert e.value.code == "INSUFFICIENT_RESOURCES" and "2 AI CPUs" in str(e.value) and "1 are free" in str(e.value)
    parts.create(uuid, "vir02_1c", 6)
    assert code_of(parts.create, uuid, "vir01", 7) == "INSUFFICIENT_RESOURCES"


def test_a_memory_shortage_dcmi_reports_only_at_creation_is_not_supported_naming_memory(state: Path) -> None:
    """An assumed vir16 of 40000 MiB: two fit the cores (32) but not the 64 GiB."""
    parts, uuid = open_card(state, fake.card_910b(template_memory_mib={"vir16": 40000}))
    assert parts.create(uuid, "vir16", 0).memory_mib == 40000
    with pytest.raises(PartitionError) as e:
        parts.create(uuid, "vir16", 1)
    assert e.value.code == "NOT_SUPPORTED" and "memory" in str(e.value)
    assert len(parts.partitions(uuid)) == 1


def test_a_card_running_whole_card_work_refuses_with_in_use(state: Path) -> None:
    parts, uuid = open_card(state, fake.card_310p(processes=[{"pid": 900, "memory_mib": 100}]))
    assert parts.busy(uuid) is True
    assert code_of(parts.create, uuid, "vir01", 0) == "IN_USE"
    assert parts.partitions(uuid) == ()
    fake.update_chip(state, 5, processes=[])
    assert parts.busy(uuid) is False
    assert parts.create(uuid, "vir01", 0).profile == "vir01"


@pytest.mark.parametrize(("chip", "template", "start"), [
    (fake.card_910b(), "vir01", 0),  # a 310P template on a training card
    (fake.card_310p(), "vir16", 0),  # a training template on a 310P
    (fake.card_910b(), "vir03", 0),
    (fake.card_910b(), "vir02", 16),  # training slots are 0..15
    (fake.card_310p(), "vir01", 8),  # 310P slots are 0..7
    (fake.card_310p(), "vir01", -1),
])
def test_bad_templates_and_slots_are_invalid_arguments(state: Path, chip: dict[str, Any], template: str,
                                                       start: int) -> None:
    parts, uuid = open_card(state, chip)
    assert code_of(parts.create, uuid, template, start) == "INVALID_ARGUMENT"
    assert parts.partitions(uuid) == ()


def test_free_is_what_dcmi_has_left(state: Path) -> None:
    parts, uuid = open_card(state, fake.card_310p())
    assert parts.free(uuid) == (8, 7, 24576)
    parts.create(uuid, "vir04_3c", 0)
    assert parts.free(uuid) == (4, 4, 12288)  # 8 - 4 cores, 7 - 3 AI CPUs, 24576 - 12288 MiB


def test_a_taken_slot_is_insufficient_resources(state: Path) -> None:
    parts, uuid = open_card(state, fake.card_910b())
    parts.create(uuid, "vir02", 4)
    assert code_of(parts.create, uuid, "vir02", 4) == "INSUFFICIENT_RESOURCES"


def test_an_unknown_card_is_not_found(state: Path) -> None:
    parts, _ = open_card(state, fake.card_910b())
    assert code_of(parts.create, "NPU-missing", "vir02", 0) == "NOT_FOUND"
    assert code_of(parts.partitions, "NPU-missing") == "NOT_FOUND"


# --- destroy -----------------------------------------------------------------------------------------------
def test_destroy_gives_the_cores_and_memory_back(state: Path) -> None:
    parts, uuid = open_card(state, fake.card_910b())
    parts.create(uuid, "vir16", 0)
    parts.create(uuid, "vir16", 1)
    parts.destroy(uuid, "100")
    assert [p.partition_id for p in parts.partitions(uuid)] == ["101"]
    assert parts.create(uuid, "vir08", 0).partition_id == "100"
    assert parts.create(uuid, "vir08", 2).partition_id == "102"


def test_destroy_refusals(state: Path) -> None:
    parts, uuid = open_card(state, fake.card_310p())
    parts.create(uuid, "vir04", 0)
    fake.update_chip(state, 5, vnpus=[{"vdev_id": 100, "template": "vir04", "in_use": True}])
    assert code_of(parts.destroy, uuid, "100") == "IN_USE"  # a container holds it
    assert code_of(parts.destroy, uuid, "105") == "NOT_FOUND"
    assert code_of(parts.destroy, uuid, "vnpu-1") == "INVALID_ARGUMENT"
    assert len(parts.partitions(uuid)) == 1


# --- the property ------------------------------------------------------------------------------------------
@st.composite
def cards(draw: st.DrawFn) -> dict[str, Any]:
    """A training card (30 or 32 cores, 32 or 64 GiB) or a 310P, with some template memories overridden
    (the unpublished figures the fake takes as parameters)."""
    if draw(st.booleans()):
        chip = fake.card_910b(aicore=draw(st.sampled_from([30, 32])), memory_mib=draw(st.sampled_from([32768, 65536])))
        names = list(TRAINING)
    else:
        chip = fake.card_310p()
        names = list(INFERENCE)
    overrides = draw(st.dictionaries(st.sampled_from(names), st.integers(1024, 40000), max_size=len(names)))
    return {**chip, "template_memory_mib": overrides}


# Creates outnumber destroys three to one, so that sequences reach a full card; slots and templates reach past
# what the card has (slots 8..15 and training templates on a 310P and the reverse are refusals).
operations = st.lists(
    st.tuples(st.sampled_from(["create", "create", "create", "destroy"]),
              st.sampled_from(sorted({*TRAINING, *INFERENCE})),
              st.integers(0, 15)),
    max_size=30,
)


def _memory(chip: dict[str, Any], template: str, cores: int) -> int:
    overridden: int | None = chip["template_memory_mib"].get(template)
    return overridden if overridden is not None else chip["memory_mib"] * cores // chip["aicore"]


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """A state file outside the function-scoped fixtures (hypothesis runs many examples per test call)."""
    saved = os.environ.get(fake.STATE_ENV)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "dcmi.json"
        os.environ[fake.STATE_ENV] = str(path)
        yield path
    if saved is None:
        os.environ.pop(fake.STATE_ENV, None)
    else:
        os.environ[fake.STATE_ENV] = saved


@settings(max_examples=200, deadline=None)
@given(chip=cards(), ops=operations)
def test_any_create_destroy_sequence_keeps_use_within_the_card_and_equal_to_the_live_vnpus(
        scratch: Path, chip: dict[str, Any], ops: list[tuple[str, str, int]]) -> None:
    parts, uuid = open_card(scratch, chip)
    training = chip["chip_name"].startswith("910")
    table, slots, max_vnpus = (TRAINING, 16, 16) if training else (INFERENCE, 8, 7)
    live: dict[int, str] = {}  # the model: slot -> template
    for op, template, slot in ops:
        if op == "create":
            used_cores = sum(table[t][0] for t in live.values())
            used_cpus = sum(table[t][1] for t in live.values())
            used_memory = sum(_memory(chip, t, table[t][0]) for t in live.values())
            cores, cpus = table.get(template, (0, 0))
            fits = (template in table and slot < slots and slot not in live and len(live) < max_vnpus
                    and used_cores + cores <= chip["aicore"] and used_cpus + cpus <= chip["aicpu"]
                    and used_memory + _memory(chip, template, cores) <= chip["memory_mib"])
            try:
                parts.create(uuid, template, slot)
                created = True
            except PartitionError:
                created = False
            assert created == fits, (op, template, slot, live)
            if created:
                live[slot] = template
        else:
            target = str(100 + slot)
            try:
                parts.destroy(uuid, target)
                destroyed = True
            except PartitionError as e:
                assert e.code == "NOT_FOUND"
                destroyed = False
            assert destroyed == (slot in live)
            live.pop(slot, None)
        now = parts.partitions(uuid)
        assert {p.start: p.profile for p in now} == live
        cores_in_use = sum(p.compute_units for p in now)
        memory_in_use = sum(p.memory_mib for p in now)
        assert cores_in_use == sum(table[t][0] for t in live.values()) <= chip["aicore"]
        assert memory_in_use == sum(_memory(chip, t, table[t][0]) for t in live.values()) <= chip["memory_mib"]
        free_cores, _, free_memory = parts.free(uuid)  # DCMI's own account agrees
        assert (free_cores, free_memory) == (chip["aicore"] - cores_in_use, chip["memory_mib"] - memory_in_use)
