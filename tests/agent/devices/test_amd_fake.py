"""The fake libamd_smi.so against AMD SMI's documented behaviour, through the real amdsmi binding."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.fakes.amd import amd_fake

WRAPPER_NAME = re.compile(r"_libraries\['libamd_smi\.so'\]\.(\w+)")


@pytest.fixture(scope="module")
def smi(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return amd_fake.load_binding(tmp_path_factory.mktemp("rocm"))


@pytest.fixture
def state(tmp_path: Path, smi: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = amd_fake.write_state(
        tmp_path / "amd.json",
        [amd_fake.card("MI300X", 0), amd_fake.card("MI325X", 1), amd_fake.card("MI210", 2)],
    )
    monkeypatch.setenv(amd_fake.STATE_ENV, str(path))
    smi.amdsmi_init()
    yield path
    smi.amdsmi_shut_down()


def test_the_committed_symbol_list_is_what_the_binding_resolves(smi: Any) -> None:
    source = Path(smi.amdsmi_wrapper.__file__).read_text()
    assert sorted(set(WRAPPER_NAME.findall(source))) == amd_fake.binding_symbols()


def test_the_fake_exports_every_symbol_and_unused_ones_are_not_supported(smi: Any) -> None:
    lib = ctypes.CDLL(str(Path(smi.amdsmi_wrapper.location)))
    for name in amd_fake.binding_symbols():
        assert hasattr(lib, name), name
    unused = lib.amdsmi_get_gpu_fan_speed  # nothing in gpupool reads fans
    unused.restype = ctypes.c_int
    assert unused() == amd_fake.NOT_SUPPORTED


def test_a_card_shows_one_processor_per_partition(smi: Any, state: Path) -> None:
    assert len(smi.amdsmi_get_processor_handles()) == 3
    mi300x = smi.amdsmi_get_processor_handles()[0]
    smi.amdsmi_set_gpu_compute_partition(mi300x, smi.AmdSmiComputePartitionType.DPX)
    handles = smi.amdsmi_get_processor_handles()
    assert len(handles) == 4  # two DPX halves, the MI325X, the MI210
    half = handles[1]
    assert smi.amdsmi_get_gpu_kfd_info(half)["current_partition_id"] == 1
    assert smi.amdsmi_get_gpu_asic_info(half)["num_compute_units"] == 152  # vendors.md
    assert smi.amdsmi_get_gpu_vram_info(half)["vram_size"] == 98_296  # vendors.md
    assert smi.amdsmi_get_gpu_device_bdf(half) == smi.amdsmi_get_gpu_device_bdf(handles[0])
    assert amd_fake.read_state(state)["cards"][0]["compute"] == "DPX"
    sockets = smi.amdsmi_get_socket_handles()
    assert len(sockets) == 3  # one per card, its partitions under it
    assert smi.amdsmi_get_socket_info(sockets[0]) == "0000:0c:00"


@pytest.mark.parametrize(
    ("compute", "memory"),
    [("SPX", "NPS4"), ("DPX", "NPS4"), ("CPX", "NPS2"), ("QPX", "NPS2"), ("SPX", "NPS2")],
)
def test_invalid_pairs_are_refused_with_setting_unavailable(smi: Any, state: Path, compute: str, memory: str) -> None:
    for model_index in (0, 1):
        h = smi.amdsmi_get_processor_handles()[model_index]
        smi.amdsmi_set_gpu_compute_partition(h, getattr(smi.AmdSmiComputePartitionType, compute))
        with pytest.raises(smi.AmdSmiLibraryException) as refused:
            smi.amdsmi_set_gpu_memory_partition(h, getattr(smi.AmdSmiMemoryPartitionType, memory))
        assert refused.value.get_error_code() == 55  # AMDSMI_STATUS_SETTING_UNAVAILABLE
    cards = amd_fake.read_state(state)["cards"]
    assert [c["memory"] for c in cards[:2]] == ["NPS1", "NPS1"]


def test_a_compute_mode_that_does_not_fit_the_memory_mode_is_refused(smi: Any, state: Path) -> None:
    h = smi.amdsmi_get_processor_handles()[0]
    smi.amdsmi_set_gpu_compute_partition(h, smi.AmdSmiComputePartitionType.CPX)
    smi.amdsmi_set_gpu_memory_partition(h, smi.AmdSmiMemoryPartitionType.NPS4)
    for compute in ("SPX", "DPX", "TPX"):  # none pairs with NPS4; TPX is for 6-XCC parts only
        with pytest.raises(smi.AmdSmiLibraryException) as refused:
            smi.amdsmi_set_gpu_compute_partition(h, getattr(smi.AmdSmiComputePartitionType, compute))
        assert refused.value.get_error_code() == 55
    assert smi.amdsmi_get_gpu_compute_partition(h) == "CPX"


def test_mode_changes_are_refused_while_a_process_runs(smi: Any, state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    busy = amd_fake.card("MI300X", 0, processes=[{"pid": 7, "name": "train", "vram_mib": 10, "partition": 0}])
    amd_fake.write_state(state, [busy])
    h = smi.amdsmi_get_processor_handles()[0]
    for change in (
        lambda: smi.amdsmi_set_gpu_compute_partition(h, smi.AmdSmiComputePartitionType.CPX),
        lambda: smi.amdsmi_set_gpu_memory_partition(h, smi.AmdSmiMemoryPartitionType.NPS1),
    ):
        with pytest.raises(smi.AmdSmiLibraryException) as refused:
            change()
        assert refused.value.get_error_code() == 30  # AMDSMI_STATUS_BUSY


def test_mi210_has_no_partition_modes(smi: Any, state: Path) -> None:
    h = smi.amdsmi_get_processor_handles()[2]
    for call in (
        lambda: smi.amdsmi_get_gpu_compute_partition(h),
        lambda: smi.amdsmi_get_gpu_memory_partition_config(h),
        lambda: smi.amdsmi_set_gpu_compute_partition(h, smi.AmdSmiComputePartitionType.DPX),
    ):
        with pytest.raises(smi.AmdSmiLibraryException) as refused:
            call()
        assert refused.value.get_error_code() == 2  # AMDSMI_STATUS_NOT_SUPPORTED


def test_short_buffers_get_what_fits_and_insufficient_size(smi: Any, state: Path) -> None:
    h = smi.amdsmi_get_processor_handles()[0]
    buf = ctypes.create_string_buffer(3)
    assert smi.amdsmi_wrapper.amdsmi_get_gpu_compute_partition(h, buf, 3) == 41  # AMDSMI_STATUS_INSUFFICIENT_SIZE
    assert buf.value == b"SP"
    length = ctypes.c_uint32(10)
    uuid = ctypes.create_string_buffer(10)
    assert smi.amdsmi_wrapper.amdsmi_get_gpu_device_uuid(h, ctypes.byref(length), uuid) == 41


def test_process_list_counts_with_zero_and_refuses_a_short_list(smi: Any, state: Path) -> None:
    procs = [{"pid": p, "name": "w", "vram_mib": 1, "partition": 0} for p in (11, 12, 13)]
    amd_fake.write_state(state, [amd_fake.card("MI300X", 0, processes=procs)])
    h = smi.amdsmi_get_processor_handles()[0]
    count = ctypes.c_uint32(0)
    assert smi.amdsmi_wrapper.amdsmi_get_gpu_process_list(h, ctypes.byref(count), None) == 0
    assert count.value == 3
    two = ctypes.c_uint32(2)
    out = (smi.amdsmi_wrapper.amdsmi_proc_info_t * 2)()
    assert smi.amdsmi_wrapper.amdsmi_get_gpu_process_list(h, ctypes.byref(two), out) == 15  # OUT_OF_RESOURCES
    assert [out[0].pid, out[1].pid] == [11, 12]


def test_calls_before_init_answer_not_init(smi: Any, state: Path) -> None:
    h = smi.amdsmi_get_processor_handles()[0]
    smi.amdsmi_shut_down()
    try:
        with pytest.raises(smi.AmdSmiLibraryException) as refused:
            smi.amdsmi_get_gpu_vram_usage(h)
        assert refused.value.get_error_code() == 32  # AMDSMI_STATUS_NOT_INIT
    finally:
        smi.amdsmi_init()
