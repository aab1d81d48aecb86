"""The real 910B variants through the Ascend adapter over the fake DCMI library: a chip that reports "910B2",
"910B3" or "910B4" is discovered as its own catalogue model (AI Cores, HBM), offers that variant's templates and
carves them with the sizes their names give; AI Cores, AI CPUs and memory run out as the chip's would.

Figures by hand from the templates (HAMi's Ascend table): vir10_3c_32g = 10 AI Cores, 3 AI CPUs, 32,768 MiB; two
fill a 910B3's 20 AI Cores and 64 GiB and leave 1 of its 7 AI CPUs (npu-smi's own output on a 910B3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupool.agent.devices.ascend import AscendBackend, AscendPartitions
from gpupool.agent.devices.vendor import PartitionError
from gpupool.core.partitions import MODELS
from tests.agent.fakes import ascend as fake


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "dcmi.json"
    monkeypatch.setenv(fake.STATE_ENV, str(path))
    return path


def variant(name: str, **overrides: Any) -> dict[str, Any]:
    """A chip as the fake's variant table defaults it: only its name (and dynamic creation) given."""
    chip = {"chip_name": name, "phy_id": 0, "logic_id": 0, "pci": [0, 0xC1, 0, 0], "dynamic_vnpu": True}
    return {**chip, **overrides}


def open_card(path: Path, chip: dict[str, Any]) -> tuple[AscendBackend, AscendPartitions, str]:
    fake.write_state(path, [{"card_id": 3, "chips": [chip]}])
    backend = AscendBackend(str(fake.library()), numa_reader=lambda bus: 0)
    return backend, AscendPartitions(backend), backend.discover().devices[0].uuid


@pytest.mark.parametrize(("chip", "model", "cores", "memory", "templates"), [
    ("910B2", "Ascend910B2", 24, 65536, ("vir03_1c_8g", "vir06_1c_16g", "vir12_3c_32g")),
    ("910B3", "Ascend910B3", 20, 65536, ("vir05_1c_16g", "vir10_3c_32g")),
    ("910B4", "Ascend910B4", 20, 32768, ("vir05_1c_8g", "vir10_3c_16g")),
])
def test_a_variant_is_discovered_as_its_own_model_with_its_templates(state: Path, chip: str, model: str, cores: int,
                                                                     memory: int, templates: tuple[str, ...]) -> None:
    backend, parts, uuid = open_card(state, variant(chip))
    device = backend.discover().devices[0]
    assert (device.model, device.sm_count, device.memory_mib, device.vendor) == (model, cores, memory, "ascend")
    assert parts.profiles(uuid) == templates
    # the agent offers exactly what the scheduler plans with
    assert tuple(p.name for p in MODELS[model].profiles) == templates


@pytest.mark.parametrize(("chip", "template", "cores", "memory"), [
    ("910B2", "vir03_1c_8g", 3, 8192),
    ("910B2", "vir06_1c_16g", 6, 16384),
    ("910B2", "vir12_3c_32g", 12, 32768),
    ("910B3", "vir05_1c_16g", 5, 16384),
    ("910B3", "vir10_3c_32g", 10, 32768),
    ("910B4", "vir05_1c_8g", 5, 8192),
    ("910B4", "vir10_3c_16g", 10, 16384),
])
def test_every_variant_template_is_carved_with_the_size_its_name_gives(state: Path, chip: str, template: str,
                                                                       cores: int, memory: int) -> None:
    _, parts, uuid = open_card(state, variant(chip))
    made = parts.create(uuid, template, 2)
    assert (made.profile, made.compute_units, made.memory_mib, made.partition_id) == (template, cores, memory, "102")
    assert made.device_nodes == ("/dev/vdavinci102",)


def test_two_vir10_fill_a_910b3_as_npu_smi_shows(state: Path) -> None:
    _, parts, uuid = open_card(state, variant("910B3", phy_id=4, logic_id=4))
    ids = [parts.create(uuid, "vir10_3c_32g", k).partition_id for k in (0, 1)]
    assert ids == ["164", "165"]  # phy_id 4: ids from 4 x 16 + 100
    assert parts.free(uuid) == (0, 1, 0)
    with pytest.raises(PartitionError) as e:
        parts.create(uuid, "vir05_1c_16g", 2)
    assert e.value.code == "INSUFFICIENT_RESOURCES"
    assert "needs 5 AI Cores and 1 AI CPUs, 0 and 1 are free" in str(e.value)


def test_the_910b2_runs_out_of_ai_cpus_before_ai_cores(state: Path) -> None:
    _, parts, uuid = open_card(state, variant("910B2"))
    for k in range(6):
        parts.create(uuid, "vir03_1c_8g", k)
    assert parts.free(uuid) == (6, 0, 16384)
    with pytest.raises(PartitionError) as e:
        parts.create(uuid, "vir03_1c_8g", 6)
    assert e.value.code == "INSUFFICIENT_RESOURCES" and "6 and 0 are free" in str(e.value)


def test_generic_templates_are_not_offered_on_a_variant(state: Path) -> None:
    _, parts, uuid = open_card(state, variant("910B3"))
    with pytest.raises(PartitionError) as e:
        parts.create(uuid, "vir08", 0)
    assert e.value.code == "INVALID_ARGUMENT" and "Ascend910B3 has the templates" in str(e.value)


def test_an_uncatalogued_910b_is_served_whole(state: Path) -> None:
    """A 910B1 (no template table found): its own name, no templates offered, nothing carved."""
    backend, parts, uuid = open_card(state, variant("910B1", aicore=25, memory_mib=65536))
    assert backend.discover().devices[0].model == "Ascend910B1"
    assert parts.profiles(uuid) == ()
    with pytest.raises(PartitionError) as e:
        parts.create(uuid, "vir16", 0)
    assert e.value.code == "INVALID_ARGUMENT"
