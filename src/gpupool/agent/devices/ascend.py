"""Huawei Ascend NPUs (910B training cards, 310P inference cards) through DCMI, the vendor's C management library.

This is the only module that loads DCMI (`libdcmi.so`). There is no public Python binding, so the calls go
through ctypes, with structures laid out as the public DCMI API reference documents them. The library is
found, in order: the `library` argument, the environment variable GPUPOOL_DCMI_LIBRARY, the driver's standard
places (/usr/local/Ascend/driver/lib64/driver/libdcmi.so, /usr/local/Ascend/driver/lib64/libdcmi.so), then
the dynamic loader's search path ("libdcmi.so"). DCMI objects never leave this module: discovery answers in
`DeviceInfo`, partitions in `Partition`.

Numbering. DCMI addresses a chip by (card id, device id): the card is an NPU management unit from
dcmi_get_card_num_list (ids need not be contiguous), the device id the chip's index on that card. Each chip also
has a physical id (its /dev/davinci<N> node, what ASCEND_VISIBLE_DEVICES names) and a logic id (the order the
runtime enumerates). `DeviceInfo.index` is the chip's position in logic-id order; the UUID is built from the
chip's die id (dcmi_get_device_die_v2, unique per chip), or from model and PCI address where that is missing.

Health (`wait_event`) polls dcmi_get_device_health and dcmi_get_device_errorcode_v2, since DCMI's event
subscription needs a callback thread inside the library. DCMI health is 0 ok, 1 minor alarm, 2 major alarm,
3 critical alarm (0xFFFFFFFF: the chip does not answer). Mapping to `HealthEvent`:
- health 0 or 1: no event (a minor alarm leaves the card usable; npu-smi still shows it as "Warning");
- a chip that turns major or critical, or that reports a new error code while major or critical: one event,
  `xid` = the first new DCMI error code (-1 when DCMI lists none), `detail` naming the level and every code;
- a chip whose health cannot be read, or reads 0xFFFFFFFF: one event with xid -1 until it answers again.
`probe` fails at major alarm and above, so a chip recovers (after the quarantine) once DCMI reports it at
most minor again.

vNPUs (`AscendPartitions`). An Ascend chip is split by templates (vir02 ... vir16 on training cards; each 910B
variant's own, such as vir05_1c_16g and vir10_3c_32g on a 910B3; vir01, vir02, vir04 and their AI-CPU / DVPP
variants on the 310P), each a number of AI Cores, memory and AI CPUs. The chip's name (dcmi_get_device_chip_info)
picks its catalogue row (`model_name`), and the row's geometry its templates (`templates_for`).
Unlike MIG they have no placement position: AI Cores are a capacity (any vir04 uses 4 of the chip's cores).
`Partition.start` is therefore the vNPU's slot on the chip: its id's offset in the chip's vNPU id range,
which starts at phy_id*16+100 (npu-smi create-vnpu's documented range); `create(..., start)` asks DCMI for
exactly that id, so the scheduler's plan and the card's state compare slot by slot. Creation needs the chip
free of whole-card work (IN_USE otherwise). Before calling DCMI the free AI Cores and AI CPUs are checked
(GET_FREE_RESOURCE, as npu-smi does); a refusal DCMI gives anyway (DCMI_ERR_CODE_NOT_SUPPORT: no dynamic vNPU
creation on this card, or a resource DCMI does not report before creation, such as template memory) becomes
NOT_SUPPORTED with both reasons named, since DCMI's code cannot tell them apart.

Never run on real Ascend hardware: written from the public DCMI reference and tested over the fake library
in tests/agent/fakes/ascend (see docs/vendors.md, "Huawei Ascend").
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.agent.devices.discovery import (
    DeviceInfo,
    Discovered,
    DiscoveryError,
    GpuProcess,
    HealthEvent,
    UtilizationSample,
)
from gpupool.agent.devices.vendor import ContainerDevices, Partition, PartitionError
from gpupool.api.isolation import IsolationMode
from gpupool.core.partitions import partition_model
from gpupool.core.vendors import ASCEND, PARTITION_VNPU, card_model

LIBRARY_ENV = "GPUPOOL_DCMI_LIBRARY"
STANDARD_PATHS = (
    "/usr/local/Ascend/driver/lib64/driver/libdcmi.so",
    "/usr/local/Ascend/driver/lib64/libdcmi.so",
)

# Error codes (DCMI API reference: DCMI_ERROR_CODE_BASE -8000 minus an offset).
DCMI_OK = 0
ERR_INVALID_PARAMETER = -8001
ERR_INVALID_DEVICE_ID = -8007
ERR_DEVICE_NOT_EXIST = -8008
ERR_RESOURCE_OCCUPIED = -8020
ERR_NOT_SUPPORT = -8255
_ERROR_NAMES = {
    ERR_INVALID_PARAMETER: "DCMI_ERR_CODE_INVALID_PARAMETER",
    -8002: "DCMI_ERR_CODE_OPER_NOT_PERMITTED",
    -8005: "DCMI_ERR_CODE_INNER_ERR",
    -8006: "DCMI_ERR_CODE_TIME_OUT",
    ERR_INVALID_DEVICE_ID: "DCMI_ERR_CODE_INVALID_DEVICE_ID",
    ERR_DEVICE_NOT_EXIST: "DCMI_ERR_CODE_DEVICE_NOT_EXIST",
    -8012: "DCMI_ERR_CODE_NOT_REDAY",
    -8014: "DCMI_ERR_CODE_FILE_OPERATE_FAIL",
    ERR_RESOURCE_OCCUPIED: "DCMI_ERR_CODE_RESOURCE_OCCUPIED",
    ERR_NOT_SUPPORT: "DCMI_ERR_CODE_NOT_SUPPORT",
}

HEALTH_MINOR = 1
HEALTH_MAJOR = 2
HEALTH_NOT_PRESENT = 0xFFFFFFFF
_HEALTH_NAMES = {0: "ok", 1: "minor alarm", 2: "major alarm", 3: "critical alarm", HEALTH_NOT_PRESENT: "not present"}

VDEV_AUTO_ID = 0xFFFFFFFF
VDEV_ID_BASE = 100  # a chip's vNPU ids start at phy_id * VDEV_IDS_PER_CHIP + VDEV_ID_BASE
VDEV_IDS_PER_CHIP = 16  # the id stride between chips
VDEV_SLOTS_TRAINING = 16  # ids a training chip's vNPUs may take: base .. base+15 (up to 16 vNPUs)
VDEV_SLOTS_310P = 8  # base .. base+7 on the 310P (npu-smi create-vnpu's range; at most 7 vNPUs)
MAIN_CMD_VDEV_MNG = 52
SUB_GET_VDEV_RESOURCE, SUB_GET_TOTAL_RESOURCE, SUB_GET_FREE_RESOURCE = 0, 1, 2
DIE_VDIE = 1  # enum dcmi_die_type: NDIE 0, VDIE 1
MAX_PROCESSES = 32
MAX_ERROR_CODES = 128
MAX_CARDS = 64  # DCMI's MAX_CARD_NUM

RESOURCE_910 = "huawei.com/Ascend910"
RESOURCE_310P = "huawei.com/Ascend310P"
# Device nodes every Ascend container needs beside its chip's (the driver's manager, shared virtual memory and
# host-device channel), as the Ascend device plugin and docker runtime mount them.
SHARED_NODES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")


# --- ctypes layouts (DCMI API reference) --------------------------------------------------------------------
class _ChipInfo(ctypes.Structure):
    _fields_ = [
        ("chip_type", ctypes.c_ubyte * 32),
        ("chip_name", ctypes.c_ubyte * 32),
        ("chip_ver", ctypes.c_ubyte * 32),
        ("aicore_cnt", ctypes.c_uint),
    ]


class _PcieInfoAll(ctypes.Structure):
    _fields_ = [
        ("venderid", ctypes.c_uint),
        ("subvenderid", ctypes.c_uint),
        ("deviceid", ctypes.c_uint),
        ("subdeviceid", ctypes.c_uint),
        ("domain", ctypes.c_int),
        ("bdf_busid", ctypes.c_uint),
        ("bdf_deviceid", ctypes.c_uint),
        ("bdf_funcid", ctypes.c_uint),
        ("reserve", ctypes.c_ubyte * 32),
    ]


class _HbmInfo(ctypes.Structure):
    _fields_ = [
        ("memory_size", ctypes.c_ulonglong),  # MB
        ("freq", ctypes.c_uint),
        ("memory_usage", ctypes.c_ulonglong),
        ("temp", ctypes.c_int),
        ("bandwith_util_rate", ctypes.c_uint),
    ]


class _MemoryInfo(ctypes.Structure):
    _fields_ = [
        ("memory_size", ctypes.c_ulonglong),  # MB
        ("memory_available", ctypes.c_ulonglong),
        ("freq", ctypes.c_uint),
        ("hugepagesize", ctypes.c_ulong),
        ("hugepages_total", ctypes.c_ulong),
        ("hugepages_free", ctypes.c_ulong),
        ("utiliza", ctypes.c_uint),
        ("reserve", ctypes.c_ubyte * 60),
    ]


class _DieId(ctypes.Structure):
    _fields_ = [("soc_die", ctypes.c_uint * 5)]


class _ProcMemInfo(ctypes.Structure):
    _fields_ = [("proc_id", ctypes.c_int), ("proc_mem_usage", ctypes.c_ulong)]  # bytes


class _BaseResource(ctypes.Structure):
    _fields_ = [
        ("token", ctypes.c_ulonglong),
        ("token_max", ctypes.c_ulonglong),
        ("task_timeout", ctypes.c_ulonglong),
        ("vfg_id", ctypes.c_uint),
        ("vip_mode", ctypes.c_ubyte),
        ("reserved", ctypes.c_ubyte * 31),
    ]


class _ComputingResource(ctypes.Structure):
    _fields_ = [
        ("aic", ctypes.c_float),
        ("aiv", ctypes.c_float),
        ("dsa", ctypes.c_ushort),
        ("rtsq", ctypes.c_ushort),
        ("acsq", ctypes.c_ushort),
        ("cdqm", ctypes.c_ushort),
        ("c_core", ctypes.c_ushort),
        ("ffts", ctypes.c_ushort),
        ("sdma", ctypes.c_ushort),
        ("pcie_dma", ctypes.c_ushort),
        ("memory_size", ctypes.c_ulonglong),  # MB
        ("event_id", ctypes.c_uint),
        ("notify_id", ctypes.c_uint),
        ("stream_id", ctypes.c_uint),
        ("model_id", ctypes.c_uint),
        ("topic_schedule_aicpu", ctypes.c_ushort),
        ("host_ctrl_cpu", ctypes.c_ushort),
        ("host_aicpu", ctypes.c_ushort),
        ("device_aicpu", ctypes.c_ushort),
        ("topic_ctrl_cpu_slot", ctypes.c_ushort),
        ("vdev_aicore_utilization", ctypes.c_uint),
        ("vdev_memory_total", ctypes.c_ulonglong),
        ("vdev_memory_free", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ubyte * 12),
    ]


class _MediaResource(ctypes.Structure):
    _fields_ = [(name, ctypes.c_float) for name in ("jpegd", "jpege", "vpc", "vdec", "pngd", "venc")] + [
        ("reserved", ctypes.c_ubyte * 32)
    ]


class _CreateVdevRes(ctypes.Structure):
    _fields_ = [
        ("vdev_id", ctypes.c_uint),
        ("vfg_id", ctypes.c_uint),
        ("template_name", ctypes.c_char * 32),
        ("reserved", ctypes.c_ubyte * 64),
    ]


class _CreateVdevOut(ctypes.Structure):
    _fields_ = [
        ("vdev_id", ctypes.c_uint),
        ("pcie_bus", ctypes.c_uint),
        ("pcie_device", ctypes.c_uint),
        ("pcie_func", ctypes.c_uint),
        ("vfg_id", ctypes.c_uint),
        ("reserved", ctypes.c_ubyte * 32),
    ]


class _VdevQueryInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 16),
        ("status", ctypes.c_uint),
        ("is_container_used", ctypes.c_uint),
        ("vfid", ctypes.c_uint),
        ("vfg_id", ctypes.c_uint),
        ("container_id", ctypes.c_ulonglong),
        ("base", _BaseResource),
        ("computing", _ComputingResource),
        ("media", _MediaResource),
    ]


class _VdevQuery(ctypes.Structure):
    _fields_ = [("vdev_id", ctypes.c_uint), ("query_info", _VdevQueryInfo)]


class _SocFreeResource(ctypes.Structure):
    _fields_ = [
        ("vfg_num", ctypes.c_uint),
        ("vfg_bitmap", ctypes.c_uint),
        ("base", _BaseResource),
        ("computing", _ComputingResource),
        ("media", _MediaResource),
    ]


class _SocTotalResource(ctypes.Structure):
    _fields_ = [
        ("vdev_num", ctypes.c_uint),
        ("vdev_id", ctypes.c_uint * 32),
        ("vfg_num", ctypes.c_uint),
        ("vfg_bitmap", ctypes.c_uint),
        ("base", _BaseResource),
        ("computing", _ComputingResource),
        ("media", _MediaResource),
    ]


class DcmiError(Exception):
    """A DCMI call returned nonzero; `code` is DCMI's (negative) error code."""

    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} failed: {error_name(code)} ({code})")
        self.call = call
        self.code = code


def error_name(code: int) -> str:
    return _ERROR_NAMES.get(code, "unknown DCMI error")


def _text(raw: Any) -> str:
    data = bytes(raw)
    return data.split(b"\0", 1)[0].decode(errors="replace")


def _sysfs_numa(bus_id: str) -> int:
    try:
        return int(Path(f"/sys/bus/pci/devices/{bus_id}/numa_node").read_text().strip())
    except (OSError, ValueError):
        return -1


def model_name(chip_name: str) -> str:
    """DCMI's chip name -> gpupool's model: a catalogued chip by its own row ("910B3" -> "Ascend910B3", with its
    own vNPU templates; "910B" -> "Ascend910B"), any 310P by the 310P row ("310P3" -> "Ascend310P"), anything
    else by its own name ("910B1" -> "Ascend910B1": not catalogued, so served whole, never carved by templates
    it may not have). Until the variants were catalogued every "910B*" chip was reported as "Ascend910B"."""
    row = card_model(f"Ascend{chip_name}")
    if row is not None and row.vendor == ASCEND:
        return row.name
    if chip_name.startswith("310P"):
        return "Ascend310P"
    return f"Ascend{chip_name}"


def is_training(model: str) -> bool:
    return model.startswith("Ascend910")


def templates_for(model: str) -> dict[str, tuple[int, int]]:
    """The model's vNPU templates: name -> (AI Cores, AI CPUs; 0 where not limited), from the geometry the
    scheduler plans with (gpupool.core.partitions), so the agent carves nothing the plan cannot hold."""
    geometry = partition_model(model)
    if geometry is None or geometry.kind != PARTITION_VNPU:
        return {}
    return {p.name: (p.compute_units, p.ai_cpus) for p in geometry.profiles}


def resource_name_for(model: str) -> str:
    return RESOURCE_910 if is_training(model) else RESOURCE_310P


def load_library(library: str | None = None) -> ctypes.CDLL:
    """Open libdcmi.so from `library`, $GPUPOOL_DCMI_LIBRARY, the standard places or the loader path."""
    explicit = library or os.environ.get(LIBRARY_ENV)
    candidates = [explicit] if explicit else [*(p for p in STANDARD_PATHS if Path(p).exists()), "libdcmi.so"]
    errors = []
    for candidate in candidates:
        try:
            return ctypes.CDLL(candidate)
        except OSError as e:
            errors.append(f"{candidate}: {e}")
    tried = "; ".join(errors)
    raise DiscoveryError(
        f"the Ascend DCMI library (libdcmi.so) cannot be loaded ({tried}); install the Ascend driver or set "
        f"{LIBRARY_ENV} to the library's path"
    )


@dataclass(frozen=True, slots=True)
class _Chip:
    uuid: str
    card_id: int
    device_id: int
    phy_id: int
    logic_id: int
    model: str
    aicore: int


class AscendBackend:
    """DiscoveryBackend over DCMI. `sleep` and `clock` pace the health polling (injectable for tests)."""

    name = "dcmi"

    def __init__(
        self,
        library: str | None = None,
        numa_reader: Callable[[str], int] = _sysfs_numa,
        poll_interval_s: float = 1.0,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lib = load_library(library)
        self._numa_reader = numa_reader
        self._poll_interval_s = poll_interval_s
        self._sleep = sleep or (lambda s: threading.Event().wait(s))
        self._clock = clock
        self._lock = threading.Lock()  # DCMI calls from the agent's threads go one at a time
        self._chips: dict[str, _Chip] = {}
        self._reported: dict[str, tuple[int, frozenset[int]]] = {}  # uuid -> (health, codes) last reported
        self._pending: list[HealthEvent] = []
        try:
            self.call("dcmi_init")
        except DcmiError as e:
            raise DiscoveryError(f"DCMI cannot start (is the Ascend driver loaded?): {e}") from None

    # --- plumbing -----------------------------------------------------------------------------------------
    def call(self, name: str, *args: Any) -> None:
        """Call a DCMI function; DcmiError on a nonzero return (one call at a time: DCMI is not documented
        as thread-safe)."""
        try:
            fn = getattr(self._lib, name)
        except AttributeError:
            raise DcmiError(name, ERR_NOT_SUPPORT) from None  # an older driver without the function
        with self._lock:
            code = int(fn(*args))
        if code != DCMI_OK:
            raise DcmiError(name, code)

    def chip(self, uuid: str) -> _Chip:
        """The chip behind a UUID (discovering again once if it is not known yet)."""
        if uuid not in self._chips:
            self.discover()
        try:
            return self._chips[uuid]
        except KeyError:
            raise DiscoveryError(f"no Ascend chip with UUID {uuid} on this node") from None

    # --- discovery ----------------------------------------------------------------------------------------
    def discover(self) -> Discovered:
        try:
            found = self._enumerate()
            version = ctypes.create_string_buffer(256)
            self.call("dcmi_get_driver_version", version, ctypes.c_uint(len(version)))
        except DcmiError as e:
            raise DiscoveryError(f"DCMI device enumeration failed: {e}") from None
        found.sort(key=lambda pair: pair[0].logic_id)
        devices = []
        for index, (chip, info) in enumerate(found):
            devices.append(
                DeviceInfo(
                    uuid=chip.uuid,
                    index=index,
                    model=chip.model,
                    memory_mib=info["memory_mib"],
                    pci_bus_id=info["bus_id"],
                    numa_node=self._numa_reader(info["bus_id"]),
                    sm_count=chip.aicore,
                    vendor="ascend",
                )
            )
        self._chips = {chip.uuid: chip for chip, _ in found}
        return Discovered("ascend", version.value.decode(errors="replace"), "", tuple(devices))

    def _enumerate(self) -> list[tuple[_Chip, dict[str, Any]]]:
        count = ctypes.c_int(0)
        cards = (ctypes.c_int * MAX_CARDS)()
        self.call("dcmi_get_card_num_list", ctypes.byref(count), cards, MAX_CARDS)
        found = []
        for card_id in cards[: count.value]:
            chips = ctypes.c_int(0)
            self.call("dcmi_get_device_num_in_card", card_id, ctypes.byref(chips))
            for device_id in range(chips.value):
                found.append(self._describe(card_id, device_id))
        return found

    def _describe(self, card_id: int, device_id: int) -> tuple[_Chip, dict[str, Any]]:
        info = _ChipInfo()
        self.call("dcmi_get_device_chip_info", card_id, device_id, ctypes.byref(info))
        logic = ctypes.c_int(0)
        self.call("dcmi_get_device_logic_id", ctypes.byref(logic), card_id, device_id)
        phy = ctypes.c_uint(0)
        self.call("dcmi_get_device_phyid_from_logicid", ctypes.c_uint(logic.value), ctypes.byref(phy))
        pcie = _PcieInfoAll()
        self.call("dcmi_get_device_pcie_info_v2", card_id, device_id, ctypes.byref(pcie))
        bus_id = f"{pcie.domain:04x}:{pcie.bdf_busid:02x}:{pcie.bdf_deviceid:02x}.{pcie.bdf_funcid:x}"
        model = model_name(_text(info.chip_name))
        uuid = self._uuid(card_id, device_id, model, bus_id)
        chip = _Chip(uuid, card_id, device_id, phy.value, logic.value, model, int(info.aicore_cnt))
        return chip, {"memory_mib": self._memory_mib(card_id, device_id), "bus_id": bus_id}

    def _memory_mib(self, card_id: int, device_id: int) -> int:
        """HBM on training cards; the 310P has DDR only (its HBM call answers NOT_SUPPORT), read through
        memory_info_v3. On a training card memory_info_v3 reports the control CPU's DDR: never the NPU's."""
        hbm = _HbmInfo()
        try:
            self.call("dcmi_get_device_hbm_info", card_id, device_id, ctypes.byref(hbm))
            return int(hbm.memory_size)
        except DcmiError as e:
            if e.code != ERR_NOT_SUPPORT:
                raise
        memory = _MemoryInfo()
        self.call("dcmi_get_device_memory_info_v3", card_id, device_id, ctypes.byref(memory))
        return int(memory.memory_size)

    def _uuid(self, card_id: int, device_id: int, model: str, bus_id: str) -> str:
        die = _DieId()
        try:
            self.call("dcmi_get_device_die_v2", card_id, device_id, DIE_VDIE, ctypes.byref(die))
        except DcmiError:
            return f"NPU-{model}-{bus_id}"
        return "NPU-" + "-".join(f"{word:08x}" for word in die.soc_die)

    # --- health -------------------------------------------------------------------------------------------
    def _health(self, chip: _Chip) -> tuple[int, tuple[int, ...]]:
        health = ctypes.c_uint(0)
        self.call("dcmi_get_device_health", chip.card_id, chip.device_id, ctypes.byref(health))
        count = ctypes.c_int(0)
        codes = (ctypes.c_uint * MAX_ERROR_CODES)()
        self.call("dcmi_get_device_errorcode_v2", chip.card_id, chip.device_id, ctypes.byref(count), codes,
                   MAX_ERROR_CODES)
        return int(health.value), tuple(int(c) for c in codes[: count.value])

    def _poll(self) -> None:
        if not self._chips:
            try:
                self.discover()
            except DiscoveryError as e:
                self._pending.append(HealthEvent(None, -1, str(e)))
                return
        for uuid, chip in self._chips.items():
            previous_health, previous_codes = self._reported.get(uuid, (0, frozenset()))
            try:
                health, codes = self._health(chip)
            except DcmiError as e:
                health, codes = HEALTH_NOT_PRESENT, ()
                detail = f"DCMI cannot read the health of card {chip.card_id} chip {chip.device_id}: {e}"
            else:
                detail = (f"DCMI health {health} ({_HEALTH_NAMES.get(health, 'unknown')}), error codes "
                          f"[{', '.join(f'{c:#x}' for c in codes)}]")
            if health < HEALTH_MAJOR:
                self._reported.pop(uuid, None)  # healthy enough again: a later fault reports afresh
                continue
            new = [c for c in codes if c not in previous_codes]
            if previous_health >= HEALTH_MAJOR and not new:
                continue  # this fault was reported already
            xid = new[0] if new and health != HEALTH_NOT_PRESENT else -1
            self._reported[uuid] = (health, frozenset(codes) | previous_codes)
            self._pending.append(HealthEvent(uuid, xid, detail))

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        deadline = self._clock() + timeout_s
        while True:
            if not self._pending:
                self._poll()
            if self._pending:
                return self._pending.pop(0)
            remaining = deadline - self._clock()
            if remaining <= 0:
                return None
            self._sleep(min(self._poll_interval_s, remaining))

    def probe(self, uuid: str) -> str | None:
        try:
            chip = self.chip(uuid)
            health, codes = self._health(chip)
        except (DcmiError, DiscoveryError) as e:
            return f"DCMI probe failed: {e}"
        if health >= HEALTH_MAJOR:
            return f"DCMI health {health} ({_HEALTH_NAMES.get(health, 'unknown')}), codes {[hex(c) for c in codes]}"
        return None

    # --- processes ----------------------------------------------------------------------------------------
    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        chip = self.chip(uuid)
        infos = (_ProcMemInfo * MAX_PROCESSES)()
        count = ctypes.c_int(0)
        try:
            self.call("dcmi_get_device_resource_info", chip.card_id, chip.device_id, infos, ctypes.byref(count))
        except DcmiError as e:
            raise DiscoveryError(f"DCMI cannot list the processes of {uuid}: {e}") from None
        held = {int(p.proc_id): int(p.proc_mem_usage) / (1 << 20) for p in infos[: min(count.value, MAX_PROCESSES)]}
        return tuple(GpuProcess(pid, mib) for pid, mib in sorted(held.items()))

    def process_utilization(self, uuid: str, since_us: int) -> tuple[UtilizationSample, ...]:
        # DCMI reports utilisation per chip (dcmi_get_device_utilization_rate) and per vNPU, never per process,
        # so there are no per-process samples to give: the watchdog's compute view is unavailable on Ascend.
        return ()

    def close(self) -> None:
        # DCMI has no shutdown call: the library's state lives as long as the process.
        self._chips.clear()


def _partition_code(code: int) -> str:
    """A DCMI refusal as a PartitionError code (NOT_SUPPORT and anything unknown: NOT_SUPPORTED)."""
    return {
        ERR_INVALID_PARAMETER: "INVALID_ARGUMENT",
        ERR_RESOURCE_OCCUPIED: "IN_USE",
        ERR_INVALID_DEVICE_ID: "NOT_FOUND",
        ERR_DEVICE_NOT_EXIST: "NOT_FOUND",
    }.get(code, "NOT_SUPPORTED")


class AscendPartitions:
    """PartitionBackend over DCMI's vNPU calls (module docstring: templates, slots, refusals)."""

    def __init__(self, backend: AscendBackend) -> None:
        self._backend = backend

    def _chip(self, gpu_uuid: str) -> _Chip:
        try:
            return self._backend.chip(gpu_uuid)
        except DiscoveryError as e:
            raise PartitionError("NOT_FOUND", str(e)) from None

    def _call(self, what: str, name: str, *args: Any) -> None:
        try:
            self._backend.call(name, *args)
        except DcmiError as e:
            raise PartitionError(_partition_code(e.code), f"{what}: {e}") from None

    def _vdev_info(self, chip: _Chip, sub_cmd: int, buf: ctypes.Structure) -> None:
        size = ctypes.c_uint(ctypes.sizeof(buf))
        self._call("DCMI vNPU query", "dcmi_get_device_info", chip.card_id, chip.device_id, MAIN_CMD_VDEV_MNG,
                   sub_cmd, ctypes.byref(buf), ctypes.byref(size))

    def profiles(self, gpu_uuid: str) -> tuple[str, ...]:
        chip = self._chip(gpu_uuid)
        table = templates_for(chip.model)
        return tuple(sorted(table, key=lambda name: (table[name][0], table[name][1], name)))

    def partitions(self, gpu_uuid: str) -> tuple[Partition, ...]:
        chip = self._chip(gpu_uuid)
        total = _SocTotalResource()
        self._vdev_info(chip, SUB_GET_TOTAL_RESOURCE, total)
        out = []
        for vdev_id in sorted(total.vdev_id[: min(total.vdev_num, 32)]):
            query = _VdevQuery(vdev_id=vdev_id)
            self._vdev_info(chip, SUB_GET_VDEV_RESOURCE, query)
            out.append(self._partition(chip, query))
        return tuple(out)

    def _partition(self, chip: _Chip, query: _VdevQuery) -> Partition:
        info = query.query_info
        return Partition(
            gpu_uuid=chip.uuid,
            partition_id=str(query.vdev_id),
            profile=info.name.decode(errors="replace"),
            start=int(query.vdev_id) - self._id_base(chip),
            memory_mib=int(info.computing.memory_size),
            compute_units=int(info.computing.aic),
            device_nodes=(f"/dev/vdavinci{query.vdev_id}",),
        )

    @staticmethod
    def _id_base(chip: _Chip) -> int:
        return chip.phy_id * VDEV_IDS_PER_CHIP + VDEV_ID_BASE

    def free(self, gpu_uuid: str) -> tuple[int, int, int]:
        """What the chip has left for new vNPUs, as DCMI reports it: (AI Cores, AI CPUs, memory MiB)."""
        chip = self._chip(gpu_uuid)
        free = _SocFreeResource()
        self._vdev_info(chip, SUB_GET_FREE_RESOURCE, free)
        return int(free.computing.aic), int(free.computing.device_aicpu), int(free.computing.memory_size)

    def busy(self, gpu_uuid: str) -> bool:
        try:
            return bool(self._backend.processes(gpu_uuid))
        except DiscoveryError as e:
            raise PartitionError("NOT_FOUND", str(e)) from None

    def create(self, gpu_uuid: str, profile: str, start: int) -> Partition:
        chip = self._chip(gpu_uuid)
        table = templates_for(chip.model)
        where = f"{profile} at slot {start} on {gpu_uuid}"
        if profile not in table:
            raise PartitionError("INVALID_ARGUMENT", f"{where}: {chip.model} has the templates {sorted(table)}")
        slots = VDEV_SLOTS_TRAINING if is_training(chip.model) else VDEV_SLOTS_310P
        if not 0 <= start < slots:
            raise PartitionError("INVALID_ARGUMENT", f"{where}: {chip.model} has the slots 0..{slots - 1}")
        if any(p.start == start for p in self.partitions(gpu_uuid)):
            raise PartitionError("INSUFFICIENT_RESOURCES", f"{where}: the slot holds a vNPU already")
        if self.busy(gpu_uuid):
            raise PartitionError("IN_USE", f"{where}: processes run on the whole card")
        free_cores, free_cpus, _ = self.free(gpu_uuid)
        cores, cpus = table[profile]
        if cores > free_cores or cpus > free_cpus:
            raise PartitionError(
                "INSUFFICIENT_RESOURCES",
                f"{where}: needs {cores} AI Cores and {cpus} AI CPUs, {free_cores} and {free_cpus} are free",
            )
        request = _CreateVdevRes(vdev_id=self._id_base(chip) + start, vfg_id=VDEV_AUTO_ID,
                                 template_name=profile.encode())
        out = _CreateVdevOut()
        try:
            self._backend.call("dcmi_create_vdevice", chip.card_id, chip.device_id, ctypes.byref(request),
                                ctypes.byref(out))
        except DcmiError as e:
            if e.code == ERR_NOT_SUPPORT:
                raise PartitionError(
                    "NOT_SUPPORTED",
                    f"{where}: DCMI refused ({e}): the card creates no vNPUs dynamically, or lacks a resource "
                    "DCMI does not report before creation (such as the template's memory)",
                ) from None
            raise PartitionError(_partition_code(e.code), f"{where}: {e}") from None
        query = _VdevQuery(vdev_id=out.vdev_id)
        self._vdev_info(chip, SUB_GET_VDEV_RESOURCE, query)
        return self._partition(chip, query)

    def destroy(self, gpu_uuid: str, partition_id: str) -> None:
        chip = self._chip(gpu_uuid)
        try:
            vdev_id = int(partition_id)
        except ValueError:
            raise PartitionError("INVALID_ARGUMENT", f"{partition_id!r} is not a vNPU id") from None
        if all(p.partition_id != partition_id for p in self.partitions(gpu_uuid)):
            raise PartitionError("NOT_FOUND", f"no vNPU {partition_id} on {gpu_uuid}")
        self._call(f"destroy vNPU {partition_id} on {gpu_uuid}", "dcmi_set_destroy_vdevice", chip.card_id,
                   chip.device_id, ctypes.c_uint(vdev_id))


class AscendVendor:
    """Ascend as a gpupool vendor.

    Resource names: each card is advertised under its own model's device-plugin name (`resource_name_for`):
    huawei.com/Ascend910 for training cards, huawei.com/Ascend310P for inference cards, so a node that holds
    both (a 310P card in a 910B server) serves both kinds of pod. `resource_name`, the protocol's single
    name, is the training name when the node has any training card, else the 310P name.

    Isolation: whole cards (NONE) and vNPUs, which are hardware partitions and are held like MIG instances
    (IsolationMode.MIG is the seam's hardware-partition mode). gpupool owns no memory or compute limiter for
    CANN programs, so there is no shared mode.
    """

    name = "ascend"

    def __init__(self, backend: AscendBackend) -> None:
        self._backend = backend
        self._partitions = AscendPartitions(backend)
        models = {d.model for d in backend.discover().devices}
        self.resource_name = (
            RESOURCE_910 if any(is_training(m) for m in models) or not models else RESOURCE_310P
        )

    @property
    def discovery(self) -> AscendBackend:
        return self._backend

    @property
    def partitioning(self) -> AscendPartitions:
        return self._partitions

    def isolation_modes(self) -> frozenset[IsolationMode]:
        return frozenset({IsolationMode.NONE, IsolationMode.MIG})

    def container_devices(self, device: DeviceInfo, partition: Partition | None = None) -> ContainerDevices:
        """A whole chip: its /dev/davinci<phy_id>. A vNPU: its /dev/vdavinci<vdev_id>, seen inside as
        /dev/davinci<vdev_id> (as the Ascend docker runtime mounts it); ASCEND_VISIBLE_DEVICES names the chip's
        physical id or the vNPU id, with ASCEND_RUNTIME_OPTIONS=VIRTUAL for a vNPU, as the Ascend device plugin
        sets them."""
        chip = self._backend.chip(device.uuid)
        if partition is None:
            return ContainerDevices((f"/dev/davinci{chip.phy_id}", *SHARED_NODES),
                                    {"ASCEND_VISIBLE_DEVICES": str(chip.phy_id)})
        host = f"/dev/vdavinci{partition.partition_id}"
        return ContainerDevices(
            (host, *SHARED_NODES),
            {"ASCEND_VISIBLE_DEVICES": partition.partition_id, "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"},
            renames={host: f"/dev/davinci{partition.partition_id}"},
        )
