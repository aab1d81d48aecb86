"""gpupool.agent.devices.amd through the real amdsmi binding over the fake libamd_smi.so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.agent.devices.amd import (
    AMD_GPU_POST_RESET,
    AMD_GPU_PRE_RESET,
    AMD_RAS_UNCORRECTABLE,
    AmdBackend,
    AmdPartitions,
    AmdVendor,
    normalise_model,
)
from gpupool.agent.devices.discovery import DeviceInfo, DiscoveryError, GpuProcess, HealthEvent
from gpupool.agent.devices.vendor import PartitionError
from gpupool.api.isolation import IsolationMode
from tests.agent.fakes.amd import amd_fake

ROOT = Path(__file__).resolve().parents[3]
MI300X_MIB, MI325X_MIB, MI210_MIB = 196_592, 262_128, 65_520
# What amdgpu accepts on an 8-XCC MI300X / MI325X with NPS1 and NPS4 (the fake's header), smallest first.
EIGHT_XCC_PROFILES = ("CPX/NPS1", "CPX/NPS4", "QPX/NPS1", "QPX/NPS4", "DPX/NPS1", "SPX/NPS1")
PARTITIONS_OF = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}


@pytest.fixture(scope="module")
def smi(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return amd_fake.load_binding(tmp_path_factory.mktemp("rocm"))


@contextmanager
def node(path: Path, cards: list[dict[str, Any]], smi: Any, **top: Any) -> Iterator[AmdBackend]:
    """A node whose cards are `cards`: the state file written, the fake pointed at it, a backend over it."""
    amd_fake.write_state(path, cards, **top)
    before = os.environ.get(amd_fake.STATE_ENV)
    os.environ[amd_fake.STATE_ENV] = str(path)
    backend = AmdBackend(amdsmi=smi, numa_reader=lambda bus: -1)
    try:
        yield backend
    finally:
        backend.close()
        if before is None:
            del os.environ[amd_fake.STATE_ENV]
        else:
            os.environ[amd_fake.STATE_ENV] = before


@pytest.fixture
def three(tmp_path: Path, smi: Any) -> Iterator[AmdBackend]:
    cards = [amd_fake.card("MI300X", 0), amd_fake.card("MI325X", 1), amd_fake.card("MI210", 2, numa=1)]
    with node(tmp_path / "amd.json", cards, smi) as backend:
        yield backend


def uuids(backend: AmdBackend) -> list[str]:
    return [d.uuid for d in backend.discover().devices]


# --- discovery ---------------------------------------------------------------------------------------------
def test_discovery_reports_each_card_with_its_model_memory_and_compute_units(three: AmdBackend) -> None:
    found = three.discover()
    assert found.vendor == "amd"
    assert found.driver_version == "6.12.12"
    assert found.devices == (
        DeviceInfo("10ff74a1-0000-1000-80c2-1b7a3e0c4d00", 0, "MI300X", MI300X_MIB, "0000:0c:00.0", 0, 304,
                   vendor="amd"),
        DeviceInfo("11ff74a1-0000-1000-80c2-1b7a3e0c4d01", 1, "MI325X", MI325X_MIB, "0000:1c:00.0", 0, 304,
                   vendor="amd"),
        DeviceInfo("12ff74a1-0000-1000-80c2-1b7a3e0c4d02", 2, "MI210", MI210_MIB, "0000:2c:00.0", 1, 104,
                   vendor="amd"),
    )


def test_a_partitioned_card_is_still_one_card_with_all_its_memory_and_units(tmp_path: Path, smi: Any) -> None:
    cards = [amd_fake.card("MI300X", 0, compute="CPX", memory="NPS4"), amd_fake.card("MI300X", 1, compute="DPX")]
    with node(tmp_path / "amd.json", cards, smi) as backend:
        devices = backend.discover().devices
    assert [(d.uuid, d.memory_mib, d.sm_count) for d in devices] == [
        ("10ff74a1-0000-1000-80c2-1b7a3e0c4d00", 8 * 24_574, 8 * 38),  # the card's identity is partition 0's
        ("11ff74a1-0000-1000-80c2-1b7a3e0c4d01", 2 * 98_296, 2 * 152),
    ]


def test_an_unknown_numa_node_falls_back_to_sysfs(tmp_path: Path, smi: Any) -> None:
    path = amd_fake.write_state(tmp_path / "amd.json", [amd_fake.card("MI300X", 0, numa=0xFFFFFFFF)])
    os.environ[amd_fake.STATE_ENV] = str(path)
    backend = AmdBackend(amdsmi=smi, numa_reader=lambda bus: 3 if bus == "0000:0c:00.0" else -1)
    try:
        assert backend.discover().devices[0].numa_node == 3
    finally:
        backend.close()
        del os.environ[amd_fake.STATE_ENV]


@pytest.mark.parametrize(
    ("market", "model"),
    [
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI325X OAM", "MI325X"),
        ("Radeon Pro W7900", "Radeon Pro W7900"),
    ],
)
def test_market_names_are_normalised_to_the_model(market: str, model: str) -> None:
    assert normalise_model(market) == model


def test_probe_is_none_for_a_card_that_answers_and_says_why_otherwise(three: AmdBackend) -> None:
    first = uuids(three)[0]
    assert three.probe(first) is None
    assert "no card" in (three.probe("no-such-uuid") or "")


# --- partitions --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["MI300X", "MI325X"])
def test_eight_xcc_cards_offer_the_pairs_amdgpu_accepts(tmp_path: Path, smi: Any, model: str) -> None:
    with node(tmp_path / "amd.json", [amd_fake.card(model, 0)], smi) as backend:
        assert AmdPartitions(backend).profiles(uuids(backend)[0]) == EIGHT_XCC_PROFILES


@pytest.mark.parametrize(("model", "total_mib"), [("MI300X", MI300X_MIB), ("MI325X", MI325X_MIB)])
@pytest.mark.parametrize("profile", EIGHT_XCC_PROFILES)
def test_every_valid_mode_is_carved_with_its_exact_geometry(
    tmp_path: Path, smi: Any, model: str, total_mib: int, profile: str
) -> None:
    state = tmp_path / "amd.json"
    with node(state, [amd_fake.card(model, 0)], smi) as backend:
        card = uuids(backend)[0]
        parts = AmdPartitions(backend)
        made = parts.create(card, profile, 0)
        n = PARTITIONS_OF[profile.split("/")[0]]
        assert (made.gpu_uuid, made.profile, made.start) == (card, profile, 0)
        assert (made.compute_units, made.memory_mib) == (304 // n, total_mib // n)
        carved = parts.partitions(card)
        if profile == "SPX/NPS1":
            assert carved == ()  # the card whole: nothing carved
        else:
            assert [p.start for p in carved] == [k * 8 // n for k in range(n)]
            assert len({p.partition_id for p in carved}) == n
            assert [p.device_nodes for p in carved] == [(f"/dev/dri/renderD{128 + k}",) for k in range(n)]
    saved = amd_fake.read_state(state)["cards"][0]
    assert f"{saved['compute']}/{saved['memory']}" == profile


def test_a_dpx_mi300x_partition_has_152_cus_and_98296_mib(tmp_path: Path, smi: Any) -> None:
    with node(tmp_path / "amd.json", [amd_fake.card("MI300X", 0)], smi) as backend:
        second = AmdPartitions(backend).create(uuids(backend)[0], "DPX/NPS1", 4)
    assert (second.start, second.compute_units, second.memory_mib) == (4, 152, 98_296)  # vendors.md


@pytest.mark.parametrize(("profile", "start"), [("DPX/NPS2", 0), ("SPX/NPS4", 0), ("TPX/NPS1", 0), ("QPX/NPS1", 3)])
def test_pairs_and_starts_the_card_lacks_are_refused(tmp_path: Path, smi: Any, profile: str, start: int) -> None:
    state = tmp_path / "amd.json"
    with node(state, [amd_fake.card("MI300X", 0)], smi) as backend, pytest.raises(PartitionError) as refused:
        AmdPartitions(backend).create(uuids(backend)[0], profile, start)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert amd_fake.read_state(state)["cards"][0]["compute"] == "SPX"


def test_the_vendors_refusal_of_a_pair_comes_back_as_invalid_argument(tmp_path: Path, smi: Any) -> None:
    """A card whose library refuses a pair the profiles offered (status 55) gives INVALID_ARGUMENT, not a crash."""
    with node(tmp_path / "amd.json", [amd_fake.card("MI300X", 0)], smi) as backend:
        parts = AmdPartitions(backend)
        card = uuids(backend)[0]
        handle = backend._cards()[0].primary.handle
        with pytest.raises(smi.AmdSmiLibraryException) as raw:
            smi.amdsmi_set_gpu_memory_partition(handle, smi.AmdSmiMemoryPartitionType.NPS4)
        assert raw.value.get_error_code() == 55
        with pytest.raises(PartitionError) as refused:
            parts._call("NPS4", card, lambda: smi.amdsmi_set_gpu_memory_partition(
                handle, smi.AmdSmiMemoryPartitionType.NPS4))
        assert refused.value.code == "INVALID_ARGUMENT"


def test_mi210_has_no_partitions(three: AmdBackend) -> None:
    mi210 = uuids(three)[2]
    parts = AmdPartitions(three)
    assert parts.profiles(mi210) == ()
    assert parts.partitions(mi210) == ()
    with pytest.raises(PartitionError) as refused:
        parts.create(mi210, "SPX/NPS1", 0)
    assert refused.value.code == "NOT_SUPPORTED"


def test_a_mode_change_is_refused_while_the_card_runs_work(tmp_path: Path, smi: Any) -> None:
    state = tmp_path / "amd.json"
    running = [{"pid": 4242, "name": "python3", "vram_mib": 2048, "partition": 1}]
    with node(state, [amd_fake.card("MI300X", 0, compute="DPX", processes=running)], smi) as backend:
        card = uuids(backend)[0]
        parts = AmdPartitions(backend)
        assert parts.busy(card)
        with pytest.raises(PartitionError) as refused:
            parts.create(card, "CPX/NPS4", 0)
        assert refused.value.code == "IN_USE"
        assert parts.create(card, "DPX/NPS1", 0).start == 0  # the current mode's partitions still hand out
    assert amd_fake.read_state(state)["cards"][0]["compute"] == "DPX"


def test_the_card_returns_to_spx_nps1_when_its_last_partition_is_released(tmp_path: Path, smi: Any) -> None:
    state = tmp_path / "amd.json"
    with node(state, [amd_fake.card("MI300X", 0)], smi) as backend:
        card = uuids(backend)[0]
        parts = AmdPartitions(backend)
        parts.create(card, "QPX/NPS4", 2)
        ids = [p.partition_id for p in parts.partitions(card)]
        for pid in ids[:-1]:
            parts.destroy(card, pid)
            assert amd_fake.read_state(state)["cards"][0]["compute"] == "QPX"  # others remain: the mode stays
        parts.destroy(card, ids[-1])
        assert parts.partitions(card) == ()
    saved = amd_fake.read_state(state)["cards"][0]
    assert (saved["compute"], saved["memory"]) == ("SPX", "NPS1")


def test_a_partition_running_work_is_not_released_and_keeps_the_mode(tmp_path: Path, smi: Any) -> None:
    state = tmp_path / "amd.json"
    running = [{"pid": 99, "name": "serve", "vram_mib": 100, "partition": 3}]
    cpx = amd_fake.card("MI300X", 0, compute="CPX", memory="NPS4", processes=running)
    with node(state, [cpx], smi) as backend:
        card = uuids(backend)[0]
        parts = AmdPartitions(backend)
        ids = [p.partition_id for p in parts.partitions(card)]
        with pytest.raises(PartitionError) as refused:
            parts.destroy(card, ids[3])
        assert refused.value.code == "IN_USE"
        for k, pid in enumerate(ids):
            if k != 3:
                parts.destroy(card, pid)
        assert len(parts.partitions(card)) == 8
    assert amd_fake.read_state(state)["cards"][0]["compute"] == "CPX"


def test_a_released_partition_is_handed_out_again_and_counts_as_held(tmp_path: Path, smi: Any) -> None:
    state = tmp_path / "amd.json"
    with node(state, [amd_fake.card("MI300X", 0)], smi) as backend:
        card = uuids(backend)[0]
        parts = AmdPartitions(backend)
        first = parts.create(card, "DPX/NPS1", 0)
        parts.destroy(card, first.partition_id)
        assert parts.create(card, "DPX/NPS1", 0) == first
        second = parts.partitions(card)[1]
        parts.destroy(card, second.partition_id)  # partition 0 is held again: the mode stays
    assert amd_fake.read_state(state)["cards"][0]["compute"] == "DPX"


def test_destroying_what_is_not_there_is_not_found(three: AmdBackend) -> None:
    card = uuids(three)[0]
    with pytest.raises(PartitionError) as refused:
        AmdPartitions(three).destroy(card, "no-such-partition")
    assert refused.value.code == "NOT_FOUND"


def test_a_mode_set_by_one_process_is_seen_by_another(tmp_path: Path, smi: Any) -> None:
    state = tmp_path / "amd.json"
    with node(state, [amd_fake.card("MI300X", 0)], smi) as backend:
        rocm = Path(smi.amdsmi_wrapper.location).parent.parent
        child = (
            "from gpupool.agent.devices.amd import AmdBackend, AmdPartitions\n"
            "b = AmdBackend()\n"
            "AmdPartitions(b).create(b.discover().devices[0].uuid, 'CPX/NPS4', 0)\n"
            "b.close()\n"
        )
        env = {**os.environ, "ROCM_PATH": str(rocm), amd_fake.STATE_ENV: str(state)}
        subprocess.run([sys.executable, "-c", child], check=True, env=env, cwd=ROOT, timeout=60)
        assert len(AmdPartitions(backend).partitions(uuids(backend)[0])) == 8


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(["MI300X", "MI325X"]), path=st.lists(st.sampled_from(EIGHT_XCC_PROFILES), max_size=5))
def test_any_sequence_of_modes_ends_in_the_last_with_the_whole_card_split(
    tmp_path: Path, smi: Any, model: str, path: list[str]
) -> None:
    """Whatever modes came before, the card ends in the last one asked for, and its partitions' CUs and
    memory add up to the card's (the library's own accounting, summed by discovery)."""
    state = tmp_path / "walk.json"
    with node(state, [amd_fake.card(model, 0)], smi) as backend:
        card = uuids(backend)[0]
        whole = backend.discover().devices[0]
        parts = AmdPartitions(backend)
        for profile in path:
            parts.create(card, profile, 0)
            carved = parts.partitions(card) or (parts.create(card, profile, 0),)
            assert sum(p.compute_units for p in carved) == whole.sm_count == 304
            assert sum(p.memory_mib for p in carved) == whole.memory_mib
            assert sorted(p.start for p in carved) == list(range(0, 8, 8 // len(carved)))
        saved = amd_fake.read_state(state)["cards"][0]
        assert f"{saved['compute']}/{saved['memory']}" == (path[-1] if path else "SPX/NPS1")


# --- health ------------------------------------------------------------------------------------------------
def test_a_reset_event_marks_the_card_it_came_from(tmp_path: Path, smi: Any) -> None:
    state = tmp_path / "amd.json"
    events = [
        {"card": 1, "partition": 5, "type": 3, "message": "reset starting"},
        {"card": 0, "partition": 0, "type": 4, "message": "reset done"},
    ]
    cards = [amd_fake.card("MI300X", 0), amd_fake.card("MI300X", 1, compute="CPX", memory="NPS4")]
    with node(state, cards, smi, events=events) as backend:
        first, second = uuids(backend)
        got = [backend.wait_event(0.5), backend.wait_event(0.5)]
        assert [(e.uuid, e.xid) for e in got if e] == [(second, AMD_GPU_PRE_RESET), (first, AMD_GPU_POST_RESET)]
        assert backend.wait_event(0) is None
    assert amd_fake.read_state(state)["events"] == []  # consumed


def test_partitions_made_after_discovery_are_watched_too(tmp_path: Path, smi: Any) -> None:
    state = tmp_path / "amd.json"
    with node(state, [amd_fake.card("MI300X", 0)], smi) as backend:
        card = uuids(backend)[0]
        AmdPartitions(backend).create(card, "CPX/NPS4", 0)
        data = amd_fake.read_state(state)
        data["events"] = [{"card": 0, "partition": 6, "type": 3, "message": "reset"}]
        state.write_text(json.dumps(data))
        assert backend.wait_event(0) == HealthEvent(card, AMD_GPU_PRE_RESET, "AMD SMI event GPU_PRE_RESET: reset")


def test_vm_faults_are_not_health_events(tmp_path: Path, smi: Any) -> None:
    """An application's bad address (AMD's analog of Xid 13/31) does not make the card unhealthy."""
    state = tmp_path / "amd.json"
    fault = {"card": 0, "partition": 0, "type": 1, "message": "vm fault"}
    with node(state, [amd_fake.card("MI300X", 0)], smi, events=[fault]) as backend:
        backend.discover()
        assert backend.wait_event(0) is None
    assert amd_fake.read_state(state)["events"] == [fault]


def test_a_rise_in_uncorrectable_ecc_errors_is_a_health_event(tmp_path: Path, smi: Any) -> None:
    state = tmp_path / "amd.json"
    with node(state, [amd_fake.card("MI300X", 0, ecc={"uncorrectable": 2})], smi) as backend:
        card = uuids(backend)[0]
        assert backend.wait_event(0) is None  # 2 were there at discovery: not news
        data = amd_fake.read_state(state)
        data["cards"][0]["ecc"] = {"correctable": 9, "uncorrectable": 3}
        state.write_text(json.dumps(data))
        assert backend.wait_event(0) == HealthEvent(card, AMD_RAS_UNCORRECTABLE, "uncorrectable ECC errors 2 -> 3")
        assert backend.wait_event(0) is None


# --- processes ---------------------------------------------------------------------------------------------
def test_processes_of_every_partition_with_their_vram(tmp_path: Path, smi: Any) -> None:
    procs = [
        {"pid": 300, "name": "a", "vram_mib": 1024, "partition": 0},
        {"pid": 100, "name": "b", "vram_mib": 512, "partition": 1},
    ]
    with node(tmp_path / "amd.json", [amd_fake.card("MI300X", 0, compute="DPX", processes=procs)], smi) as backend:
        card = uuids(backend)[0]
        assert backend.processes(card) == (GpuProcess(100, 512.0), GpuProcess(300, 1024.0))
        assert backend.process_utilization(card, 0) == ()  # AMD SMI has no per-process samples
        with pytest.raises(DiscoveryError):
            backend.processes("no-such-uuid")


# --- the vendor --------------------------------------------------------------------------------------------
def test_containers_get_kfd_and_the_render_nodes_of_what_they_hold(tmp_path: Path, smi: Any) -> None:
    cards = [amd_fake.card("MI300X", 0), amd_fake.card("MI300X", 1, compute="QPX", render=136)]
    with node(tmp_path / "amd.json", cards, smi) as backend:
        vendor = AmdVendor(backend)
        whole, split = backend.discover().devices
        assert vendor.container_devices(whole).device_nodes == ("/dev/kfd", "/dev/dri/renderD128")
        assert vendor.container_devices(split).device_nodes == (
            "/dev/kfd", "/dev/dri/renderD136", "/dev/dri/renderD137", "/dev/dri/renderD138", "/dev/dri/renderD139")
        third = vendor.partitioning.partitions(split.uuid)[2] if vendor.partitioning else None
        assert third is not None
        assert vendor.container_devices(split, third).device_nodes == ("/dev/kfd", "/dev/dri/renderD138")


def test_the_vendor_names_and_isolation_modes(three: AmdBackend) -> None:
    vendor = AmdVendor(three)
    assert (vendor.name, vendor.resource_name) == ("amd", "amd.com/gpu")
    assert vendor.isolation_modes() == {IsolationMode.NONE, IsolationMode.MIG, IsolationMode.HOOK}
    assert vendor.discovery is three


# --- errors ------------------------------------------------------------------------------------------------
def run_child(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, cwd=ROOT, text=True,
                          capture_output=True, timeout=60)


PROBE = (
    "from gpupool.agent.devices.amd import AmdBackend\n"
    "from gpupool.agent.devices.discovery import DiscoveryError\n"
    "try:\n    AmdBackend()\nexcept DiscoveryError as e:\n    print('DiscoveryError:', e)\n"
)


def test_a_missing_library_is_a_discovery_error_that_says_so(tmp_path: Path) -> None:
    done = run_child(PROBE, {"ROCM_PATH": str(tmp_path / "empty"), "ROCM_HOME": str(tmp_path / "empty")})
    assert done.returncode == 0, done.stderr
    assert "DiscoveryError: AMD SMI library libamd_smi.so could not be loaded" in done.stdout
    assert "Traceback" not in done.stderr


def test_an_init_failure_is_a_discovery_error(tmp_path: Path, smi: Any) -> None:
    state = amd_fake.write_state(tmp_path / "amd.json", [amd_fake.card("MI300X", 0)], init_status=34)
    os.environ[amd_fake.STATE_ENV] = str(state)
    try:
        with pytest.raises(DiscoveryError, match="AMD SMI cannot start"):
            AmdBackend(amdsmi=smi)
    finally:
        del os.environ[amd_fake.STATE_ENV]
