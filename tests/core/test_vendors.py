"""The model catalogue of gpupool.core.vendors: vendors, runtimes, and agreement with the tables that already
name NVIDIA models (the MIG table, the simulator's trace, the demo scenarios)."""

from __future__ import annotations

import pytest

from gpupool.core import mig, vendors
from gpupool.core.model import GPU
from gpupool.core.vendors import (
    AMD,
    ANY_RUNTIME,
    ASCEND,
    CANN,
    CUDA,
    NVIDIA,
    PARTITION_MIG,
    PARTITION_NONE,
    PARTITION_VNPU,
    PARTITION_XCP,
    ROCM,
    card_model,
    known_models,
    runs_on,
    runtime_of,
    runtime_of_model,
    vendor_of_model,
)
from gpupool.sim.trace import GPU_MEMORY_MIB


def test_every_mig_model_is_catalogued_with_the_same_name_memory_and_slices() -> None:
    for name, geometry in mig.MODELS.items():
        row = vendors.MODELS[name]
        assert (row.vendor, row.partitioning) == (NVIDIA, PARTITION_MIG)
        assert row.memory_mib == geometry.memory_mib
        assert row.partition_slots == geometry.memory_slices


def test_only_mig_models_say_mig() -> None:
    assert {n for n, m in vendors.MODELS.items() if m.partitioning == PARTITION_MIG} == set(mig.MODELS)


def test_the_simulator_trace_models_are_nvidia_with_the_trace_memory() -> None:
    for name, memory in GPU_MEMORY_MIB.items():
        row = card_model(name)
        assert row is not None, name
        assert (row.vendor, row.memory_mib) == (NVIDIA, memory)


@pytest.mark.parametrize("name", ["A10-24GB", "L4-24GB", "T4-16GB", "H100-80GB", "A100-80GB", "A10", "L40S"])
def test_demo_and_fake_inventory_names_are_nvidia(name: str) -> None:
    assert vendor_of_model(name) == NVIDIA


def test_the_trace_undisclosed_cards_are_unknown_and_gpus_still_default_to_nvidia() -> None:
    assert vendor_of_model("G2") is None and vendor_of_model("G3") is None
    assert GPU("u", 0, "G2", 32768).vendor == NVIDIA


@pytest.mark.parametrize(("name", "vendor", "memory", "units", "partitioning", "slots"), [
    ("MI300X", AMD, 192 * 1024, 304, PARTITION_XCP, 8),
    ("MI325X", AMD, 256 * 1024, 304, PARTITION_XCP, 8),
    ("MI210", AMD, 64 * 1024, 104, PARTITION_NONE, 0),
    ("Ascend910B", ASCEND, 64 * 1024, 30, PARTITION_VNPU, 0),
    ("Ascend310P", ASCEND, 24 * 1024, 8, PARTITION_VNPU, 0),
])
def test_amd_and_ascend_rows(name: str, vendor: str, memory: int, units: int, partitioning: str, slots: int) -> None:
    row = vendors.MODELS[name]
    assert (row.vendor, row.memory_mib, row.compute_units, row.partitioning, row.partition_slots) == (
        vendor, memory, units, partitioning, slots)


@pytest.mark.parametrize(("alias", "name"), [
    ("AMD Instinct MI300X", "MI300X"), ("amd instinct mi325x", "MI325X"), ("  mi210 ", "MI210"),
    ("NVIDIA A10", "A10"), ("nvidia h100-nvl", "H100-NVL"), ("310P3", "Ascend310P"), ("Ascend 910B", "Ascend910B"),
    ("a30", "A30-24GB"),
])
def test_aliases_and_vendor_prefixes_find_the_row(alias: str, name: str) -> None:
    row = card_model(alias)
    assert row is not None and row.name == name


@pytest.mark.parametrize("name", ["A100", "V100", "H100", "", "MI250X", "Ascend950"])
def test_ambiguous_or_unknown_names_have_no_vendor(name: str) -> None:
    assert vendor_of_model(name) is None and runtime_of_model(name) is None


def test_every_name_and_alias_finds_its_own_row() -> None:
    """No alias shadows another row's name (lookups ignore case and vendor words)."""
    for row in vendors.MODELS.values():
        for n in (row.name, *row.aliases):
            found = card_model(n)
            assert found is not None and found.name == row.name, n


def test_runtimes() -> None:
    assert [runtime_of(v) for v in (NVIDIA, AMD, ASCEND)] == [CUDA, ROCM, CANN]
    assert runtime_of(" AMD ") == ROCM and runtime_of("hygon") is None
    assert runtime_of_model("MI300X") == ROCM and runtime_of_model("Ascend910B") == CANN
    assert runtime_of_model("H100-80GB") == CUDA
    assert [vendors.MODELS[n].runtime for n in ("B200", "MI210", "Ascend310P")] == [CUDA, ROCM, CANN]
    assert [vendors.MODELS[n].unit for n in ("B200", "MI210", "Ascend310P")] == ["SM", "CU", "AI Core"]


def test_runs_on() -> None:
    assert runs_on(CUDA, NVIDIA) and not runs_on(CUDA, AMD) and not runs_on(ROCM, ASCEND)
    assert runs_on("CANN", ASCEND) and runs_on(ANY_RUNTIME, AMD) and runs_on(ANY_RUNTIME, ASCEND)
    assert not runs_on("dtk", AMD)  # DTK is Hygon's; no Hygon cards are catalogued


def test_known_models_by_vendor() -> None:
    assert known_models(AMD) == ["MI210", "MI300X", "MI325X"]
    assert known_models(ASCEND) == ["Ascend310P", "Ascend910B", "Ascend910B2", "Ascend910B3", "Ascend910B4"]
    assert set(known_models()) == set(vendors.MODELS)
    assert all(vendors.MODELS[n].vendor == NVIDIA for n in known_models(NVIDIA))


# --- isolation modes per vendor -----------------------------------------------------------------------------------


def test_the_isolation_table_speaks_the_wire_values() -> None:
    from gpupool.api.isolation import IsolationMode

    named = {vendors.ISOLATION_NONE, vendors.ISOLATION_HOOK, vendors.ISOLATION_MPS, vendors.ISOLATION_MIG,
             vendors.ISOLATION_REMOTE}
    assert named == {m.value for m in IsolationMode}
    assert set(vendors.ISOLATION_OF_VENDOR) == set(vendors.VENDORS)
    assert all(modes <= named for modes in vendors.ISOLATION_OF_VENDOR.values())


def test_which_vendors_hold_a_share_in_each_mode() -> None:
    assert vendors.share_holders("hook") == (NVIDIA, AMD)
    assert vendors.share_holders("mps") == (NVIDIA,)
    assert vendors.share_holders("remote") == (NVIDIA,)
    # Modes that restrict no vendor: nothing enforced (none), a partition (mig), and an unknown word.
    assert [vendors.share_holders(m) for m in ("none", "mig", "bogus")] == [None, None, None]
    assert vendors.holds("Ascend", "mig") and not vendors.holds(ASCEND, "hook") and not vendors.holds("hygon", "none")


# --- the 910B variants ---------------------------------------------------------------------------------------------


def test_each_910b_variant_is_catalogued_with_its_chip_name_and_templates() -> None:
    for variant in vendors.ASCEND_910B_VARIANTS:
        row = card_model(variant.chip_name)  # DCMI's chip name finds its row
        assert row is not None and row.name == variant.model and row.vendor == ASCEND
        assert row.partitioning == PARTITION_VNPU
        for t in variant.templates:
            # vir<cores>_<cpus>c_<GB>g: the name states its resources; each fits the chip
            cores, cpus, gb = t.name.removeprefix("vir").replace("c", "").replace("g", "").split("_")
            assert (t.ai_cores, t.ai_cpus, t.memory_mib) == (int(cores), int(cpus), int(gb) * 1024)
            assert t.ai_cores <= row.compute_units and t.ai_cpus <= variant.ai_cpus and t.memory_mib <= row.memory_mib
    shown = {v.model: (card_model(v.model).compute_units, card_model(v.model).memory_mib, v.ai_cpus)  # type: ignore[union-attr]
             for v in vendors.ASCEND_910B_VARIANTS}
    assert shown == {"Ascend910B2": (24, 65536, 6), "Ascend910B3": (20, 65536, 7), "Ascend910B4": (20, 32768, 7)}
    assert vendors.ascend_variant("Ascend910B") is None and vendors.ascend_variant("910b3") is not None
