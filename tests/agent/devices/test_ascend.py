"""The Ascend adapter's discovery, health and processes over the fake DCMI library (tests/agent/fakes/ascend),
and the fake's own documented behaviour (numbering, return codes) where the adapter relies on it."""

from __future__ import annotations

import ctypes
import json
import shutil
from pathlib import Path

import pytest

from gpupool.agent.devices.ascend import (
    LIBRARY_ENV,
    RESOURCE_310P,
    RESOURCE_910,
    AscendBackend,
    AscendVendor,
    load_library,
    model_name,
)
from gpupool.agent.devices.discovery import DiscoveryError, GpuProcess, HealthEvent
from gpupool.agent.devices.vendor import Partition
from gpupool.api.isolation import IsolationMode
from tests.agent.fakes import ascend as fake


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Card 3 holds one 910B (phy 4, logic 1); card 7 holds two 310P chips (phy 0 / logic 0, phy 1 / logic 2):
    card ids, device ids, physical and logic ids all differ, as they may on a real server."""
    path = fake.write_state(tmp_path / "dcmi.json", [
        {"card_id": 3, "chips": [fake.card_910b(4, logic_id=1, pci=[0, 0xC1, 0, 0])]},
        {"card_id": 7, "chips": [fake.card_310p(0, logic_id=0, pci=[0, 0x3B, 0, 0]),
                                 fake.card_310p(1, logic_id=2, pci=[1, 0x5E, 2, 1])]},
    ], driver_version="24.1.rc3")
    monkeypatch.setenv(fake.STATE_ENV, str(path))
    return path


def backend(**kwargs: object) -> AscendBackend:
    numa = {"0000:c1:00.0": 1, "0000:3b:00.0": 0}
    return AscendBackend(str(fake.library()), numa_reader=lambda bus: numa.get(bus, -1), **kwargs)  # type: ignore[arg-type]


# --- discovery ---------------------------------------------------------------------------------------------
def test_discovery_lists_every_chip_in_logic_id_order_with_its_model_memory_cores_and_pci(state: Path) -> None:
    found = backend().discover()
    assert found.vendor == "ascend" and found.driver_version == "24.1.rc3" and found.cuda_version == ""
    rows = [(d.index, d.model, d.memory_mib, d.sm_count, d.pci_bus_id, d.numa_node, d.vendor) for d in found.devices]
    assert rows == [
        (0, "Ascend310P", 24576, 8, "0000:3b:00.0", 0, "ascend"),  # logic 0: card 7 chip 0
        (1, "Ascend910B", 65536, 32, "0000:c1:00.0", 1, "ascend"),  # logic 1: card 3 chip 0
        (2, "Ascend310P", 24576, 8, "0001:5e:02.1", -1, "ascend"),  # logic 2: card 7 chip 1
    ]
    assert len({d.uuid for d in found.devices}) == 3


def test_the_chips_are_addressed_by_card_and_device_id_behind_the_uuid(state: Path) -> None:
    b = backend()
    devices = b.discover().devices
    chips = [b.chip(d.uuid) for d in devices]
    assert [(c.card_id, c.device_id, c.phy_id, c.logic_id) for c in chips] == [(7, 0, 0, 0), (3, 0, 4, 1), (7, 1, 1, 2)]


def test_the_uuid_comes_from_the_die_id_and_stays_across_discoveries(state: Path) -> None:
    fake.update_chip(state, 3, die_id=[1, 2, 3, 4, 0xABCDEF])
    first = backend().discover().devices[1].uuid
    assert first == "NPU-00000001-00000002-00000003-00000004-00abcdef"
    assert backend().discover().devices[1].uuid == first


def test_a_30_core_training_card_reports_30_cores(state: Path) -> None:
    fake.update_chip(state, 3, aicore=30)
    assert backend().discover().devices[1].sm_count == 30


def test_training_memory_is_the_hbm_not_the_control_cpu_ddr(state: Path) -> None:
    """memory_info_v3 on a training card answers the control CPU's DDR (15 GiB in the fake): the adapter must
    read the HBM call, and fall back to memory_info_v3 only on the 310P whose HBM call is NOT_SUPPORT."""
    fake.update_chip(state, 3, memory_mib=32768)
    fake.update_chip(state, 7, 1, memory_mib=12288)
    memory = [d.memory_mib for d in backend().discover().devices]
    assert memory == [24576, 32768, 12288]


def test_model_names_follow_the_catalogue_then_the_chip_family() -> None:
    # The 910B variants have rows of their own (their own vNPU templates); an uncatalogued 910B (910B1) keeps
    # its own name rather than borrowing the generic row's templates.
    assert [model_name(n) for n in ("910B", "910B2", "910B3", "910B4", "910B1", "310P3", "310P", "910")] == [
        "Ascend910B", "Ascend910B2", "Ascend910B3", "Ascend910B4", "Ascend910B1", "Ascend310P", "Ascend310P",
        "Ascend910"]


# --- errors: library missing, driver down ------------------------------------------------------------------
def test_a_missing_library_is_a_discovery_error_naming_the_path_and_the_setting(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "libdcmi.so"
    with pytest.raises(DiscoveryError) as e:
        AscendBackend(str(missing))
    assert str(missing) in str(e.value) and LIBRARY_ENV in str(e.value) and "libdcmi.so" in str(e.value)


def test_the_library_path_comes_from_the_environment_when_not_given(
        state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LIBRARY_ENV, str(tmp_path / "absent.so"))
    with pytest.raises(DiscoveryError, match="absent.so"):
        load_library()
    monkeypatch.setenv(LIBRARY_ENV, str(fake.library()))
    assert load_library() is not None


def test_a_driver_that_does_not_start_is_a_discovery_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = fake.write_state(tmp_path / "dcmi.json", [{"card_id": 0, "chips": [fake.card_910b()]}], init_error=-8008)
    monkeypatch.setenv(fake.STATE_ENV, str(path))
    with pytest.raises(DiscoveryError, match=r"DCMI cannot start.*DCMI_ERR_CODE_DEVICE_NOT_EXIST \(-8008\)"):
        backend()


def test_an_unknown_uuid_is_a_discovery_error(state: Path) -> None:
    with pytest.raises(DiscoveryError, match="no Ascend chip with UUID NPU-nope"):
        backend().processes("NPU-nope")


# --- the fake's documented behaviour the adapter relies on -------------------------------------------------
def _fresh_library(tmp_path: Path) -> ctypes.CDLL:
    """A copy at its own path: dlopen gives it its own state, so it starts uninitialised."""
    copy = tmp_path / "libdcmi-copy.so"
    shutil.copy(fake.library(), copy)
    return ctypes.CDLL(str(copy))


def test_the_fake_refuses_calls_before_init_and_bad_ids_after(state: Path, tmp_path: Path) -> None:
    lib = _fresh_library(tmp_path)
    count, cards = ctypes.c_int(0), (ctypes.c_int * 8)()
    assert lib.dcmi_get_card_num_list(ctypes.byref(count), cards, 8) == -8012  # DCMI_ERR_CODE_NOT_REDAY
    assert lib.dcmi_init() == 0
    assert lib.dcmi_get_card_num_list(ctypes.byref(count), cards, 8) == 0
    assert list(cards[: count.value]) == [3, 7]
    assert lib.dcmi_get_card_num_list(ctypes.byref(count), cards, 1) == -8001  # list too short
    chips = ctypes.c_int(0)
    assert lib.dcmi_get_device_num_in_card(7, ctypes.byref(chips)) == 0 and chips.value == 2
    assert lib.dcmi_get_device_num_in_card(4, ctypes.byref(chips)) == -8007  # no card 4
    logic = ctypes.c_int(0)
    assert lib.dcmi_get_device_logic_id(ctypes.byref(logic), 7, 2) == -8007  # card 7 has devices 0 and 1
    assert lib.dcmi_get_device_logic_id(ctypes.byref(logic), 7, 1) == 0 and logic.value == 2
    card, device = ctypes.c_int(0), ctypes.c_int(0)
    assert lib.dcmi_get_card_id_device_id_from_phyid(ctypes.byref(card), ctypes.byref(device), 4) == 0
    assert (card.value, device.value) == (3, 0)
    device_max, mcu, cpu = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    assert lib.dcmi_get_device_id_in_card(3, ctypes.byref(device_max), ctypes.byref(mcu), ctypes.byref(cpu)) == 0
    assert (device_max.value, mcu.value, cpu.value) == (1, 1, -1)  # chip 0, then the MCU as device 1


def test_the_fake_answers_not_support_for_hbm_on_the_310p(state: Path, tmp_path: Path) -> None:
    lib = _fresh_library(tmp_path)
    assert lib.dcmi_init() == 0
    buf = (ctypes.c_ubyte * 64)()
    assert lib.dcmi_get_device_hbm_info(7, 0, buf) == -8255
    assert lib.dcmi_get_device_hbm_info(3, 0, buf) == 0


# --- health ------------------------------------------------------------------------------------------------
def test_no_event_while_every_chip_is_healthy_or_at_minor_alarm(state: Path) -> None:
    fake.update_chip(state, 7, 1, health=1, errors=[0x80E18402])
    b = backend()
    b.discover()
    assert b.wait_event(0) is None


def test_a_critical_chip_gives_one_event_carrying_its_error_code(state: Path) -> None:
    b = backend()
    uuid = b.discover().devices[1].uuid  # card 3
    fake.update_chip(state, 3, health=3, errors=[0x80E01801, 0x80CB8009])
    event = b.wait_event(0)
    detail = "DCMI health 3 (critical alarm), error codes [0x80e01801, 0x80cb8009]"
    assert event == HealthEvent(uuid, 0x80E01801, detail)
    assert b.wait_event(0) is None  # reported once, not at every poll
    fake.update_chip(state, 3, health=3, errors=[0x80E01801, 0x80CB8009, 0x80DE0000])
    event = b.wait_event(0)
    assert event is not None and event.uuid == uuid and event.xid == 0x80DE0000  # a new code is a new event


def test_a_major_alarm_without_codes_is_an_event_with_xid_minus_one(state: Path) -> None:
    b = backend()
    uuid = b.discover().devices[0].uuid
    fake.update_chip(state, 7, 0, health=2)
    assert b.wait_event(0) == HealthEvent(uuid, -1, "DCMI health 2 (major alarm), error codes []")


def test_a_chip_that_recovers_and_fails_again_is_reported_again(state: Path) -> None:
    b = backend()
    b.discover()
    fake.update_chip(state, 3, health=2, errors=[0x1])
    assert b.wait_event(0) is not None
    fake.update_chip(state, 3, health=0, errors=[])
    assert b.wait_event(0) is None
    fake.update_chip(state, 3, health=2, errors=[0x1])
    event = b.wait_event(0)
    assert event is not None and event.xid == 0x1


def test_a_chip_that_vanishes_is_an_event(state: Path) -> None:
    b = backend()
    uuid = b.discover().devices[2].uuid
    data = fake.read_state(state)
    data["cards"][1]["chips"].pop()
    state.write_text(json.dumps(data))
    event = b.wait_event(0)
    assert event is not None and event.uuid == uuid and event.xid == -1
    assert "DCMI_ERR_CODE_INVALID_DEVICE_ID" in event.detail


def test_several_failing_chips_are_returned_one_per_call(state: Path) -> None:
    b = backend()
    uuids = [d.uuid for d in b.discover().devices]
    fake.update_chip(state, 7, 0, health=3, errors=[0x10])
    fake.update_chip(state, 7, 1, health=3, errors=[0x20])
    events = [b.wait_event(0), b.wait_event(0), b.wait_event(0)]
    assert [(e.uuid, e.xid) for e in events if e] == [(uuids[0], 0x10), (uuids[2], 0x20)]
    assert events[2] is None


def test_wait_event_polls_at_its_interval_until_the_timeout(state: Path) -> None:
    """A fake clock: the waits are the poll interval, the last one cut to the time left."""
    now = [0.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    b = backend(poll_interval_s=2.0, sleep=sleep, clock=lambda: now[0])
    b.discover()
    assert b.wait_event(5.0) is None
    assert waits == [2.0, 2.0, 1.0]


def test_wait_event_returns_a_fault_that_appears_while_it_waits(state: Path) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        fake.update_chip(state, 3, health=3, errors=[0x42])  # the fault shows up during the first wait

    b = backend(poll_interval_s=1.0, sleep=sleep, clock=lambda: now[0])
    b.discover()
    event = b.wait_event(10.0)
    assert event is not None and event.xid == 0x42 and now[0] == 1.0


def test_probe_fails_at_major_alarm_and_passes_at_minor(state: Path) -> None:
    b = backend()
    uuid = b.discover().devices[1].uuid
    assert b.probe(uuid) is None
    fake.update_chip(state, 3, health=1)
    assert b.probe(uuid) is None
    fake.update_chip(state, 3, health=2, errors=[0x80E01801])
    assert b.probe(uuid) == "DCMI health 2 (major alarm), codes ['0x80e01801']"
    problem = b.probe("NPU-unknown")
    assert problem is not None and "NPU-unknown" in problem


# --- processes ---------------------------------------------------------------------------------------------
def test_processes_are_the_chips_host_pids_with_their_memory(state: Path) -> None:
    b = backend()
    devices = b.discover().devices
    fake.update_chip(state, 3, processes=[{"pid": 4321, "memory_mib": 2048}, {"pid": 77, "memory_mib": 3}])
    assert b.processes(devices[1].uuid) == (GpuProcess(77, 3.0), GpuProcess(4321, 2048.0))
    assert b.processes(devices[0].uuid) == ()
    assert b.process_utilization(devices[1].uuid, 0) == ()


# --- the vendor --------------------------------------------------------------------------------------------
def test_the_vendor_names_resources_by_model_and_hands_containers_the_davinci_nodes(state: Path) -> None:
    b = backend()
    vendor = AscendVendor(b)
    devices = b.discover().devices
    assert vendor.name == "ascend"
    assert vendor.resource_name == RESOURCE_910  # a mixed node: the training name, cards by their own model
    assert vendor.isolation_modes() == frozenset({IsolationMode.NONE, IsolationMode.MIG})
    whole = vendor.container_devices(devices[1])  # card 3, phy 4
    assert whole.device_nodes == ("/dev/davinci4", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
    assert dict(whole.env) == {"ASCEND_VISIBLE_DEVICES": "4"}
    vnpu = Partition(devices[1].uuid, "164", "vir04", 0, 8192, 4, ("/dev/vdavinci164",))
    part = vendor.container_devices(devices[1], vnpu)
    assert part.device_nodes == ("/dev/vdavinci164", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
    assert part.container_path("/dev/vdavinci164") == "/dev/davinci164"  # where the CANN runtime looks inside
    assert part.container_path("/dev/hisi_hdc") == "/dev/hisi_hdc"
    assert dict(part.env) == {"ASCEND_VISIBLE_DEVICES": "164", "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"}


def test_an_inference_only_node_uses_the_310p_resource_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = fake.write_state(tmp_path / "dcmi.json", [{"card_id": 0, "chips": [fake.card_310p(0), fake.card_310p(1)]}])
    monkeypatch.setenv(fake.STATE_ENV, str(path))
    assert AscendVendor(backend()).resource_name == RESOURCE_310P
