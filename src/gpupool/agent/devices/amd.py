"""AMD Instinct cards through AMD SMI (adapter for the `amdsmi` Python binding, which loads libamd_smi.so).

This is the only module that touches amdsmi. Its handles and dictionaries become `DeviceInfo`, `HealthEvent`,
`GpuProcess` and `Partition` here and never leave. The module object is injected (`AmdBackend(amdsmi=...)`);
in production it is imported in the constructor, so a node without ROCm fails there with a DiscoveryError
instead of at import time.

Cards and partitions. AMD SMI lists *processors*: a card in compute mode SPX shows one, in DPX/QPX/CPX two,
four or eight (one per partition, each with its share of the card's XCCs, CUs and VRAM), all at the card's
PCI address (the function digit aside) and told apart by the KFD `current_partition_id`. A card is the group
of processors at one PCI address; its identity (`DeviceInfo.uuid`) is the UUID of its partition 0, so it
does not change when the mode does.

Health (HealthEvent.xid for AMD; NVIDIA's Xids are below 1000, so the two never collide):
- AMD SMI event GPU_PRE_RESET -> AMD_EVENT_CODE_BASE + 3 (100003), GPU_POST_RESET -> 100004: the card is
  being or was reset, so its work is lost; the agent marks the card unhealthy until a probe passes after the
  quarantine. VM faults (an application's bad address, like NVIDIA's Xid 13/31) and thermal throttling are not
  subscribed: neither is a broken card.
- A rise of the card's uncorrectable ECC (RAS) count since the last look -> AMD_RAS_UNCORRECTABLE (100200).
  AMD SMI has no event for RAS errors, so `wait_event` compares the totals on every call.

Not exercised on AMD hardware: written from AMD SMI's reference and the amdsmi 7.0.x binding, tested over
the fake library in tests/agent/fakes/amd (docs/vendors.md, "AMD Instinct").
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from gpupool.agent.devices.discovery import (
    DeviceInfo,
    Discovered,
    DiscoveryBackend,
    DiscoveryError,
    GpuProcess,
    HealthEvent,
    UtilizationSample,
)
from gpupool.agent.devices.vendor import ContainerDevices, Partition, PartitionBackend, PartitionError
from gpupool.api.isolation import IsolationMode
from gpupool.core.partitions import AMD_COMPATIBLE_MEMORY, COMPUTE_MODES
from gpupool.core.vendors import AMD

MIB = 1024 * 1024
XCC_SLOTS = 8  # XCCs of an MI300X / MI325X: a partition's `start` is its first XCC
AMD_EVENT_CODE_BASE = 100_000
AMD_GPU_PRE_RESET = AMD_EVENT_CODE_BASE + 3
AMD_GPU_POST_RESET = AMD_EVENT_CODE_BASE + 4
AMD_RAS_UNCORRECTABLE = AMD_EVENT_CODE_BASE + 200
WATCHED_EVENTS = ("GPU_PRE_RESET", "GPU_POST_RESET")
REST_PROFILE = "SPX/NPS1"  # the card whole: where a card returns when its last partition is destroyed

# AMD SMI status codes (amdsmi_status_t) the adapter tells apart.
STATUS_NOT_SUPPORTED = 2
STATUS_BUSY = 30
STATUS_NOT_FOUND = 31
STATUS_NO_DATA = 40
STATUS_SETTING_UNAVAILABLE = 55

_MODEL = re.compile(r"\bMI\d{3}[A-Z]*\b")


def normalise_model(market_name: str) -> str:
    """'AMD Instinct MI300X' -> 'MI300X'; a name without an MI number is kept as it is."""
    m = _MODEL.search(market_name.upper())
    return m.group(0) if m else market_name.strip()


def _number(value: Any, default: int = 0) -> int:
    """The binding gives 'N/A' where the library reported the type's maximum (not available)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _sysfs_numa(bus_id: str) -> int:
    try:
        return int(Path(f"/sys/bus/pci/devices/{bus_id}/numa_node").read_text().strip())
    except (OSError, ValueError):
        return -1


def import_amdsmi() -> Any:
    """Import the binding (the one place that does). It loads libamd_smi.so on import (from ROCM_PATH/lib,
    the linker path or its own folder) and prints to stdout when it cannot; that text goes into the error
    instead."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            import amdsmi

            return amdsmi
    except ImportError as e:
        raise DiscoveryError(f"the AMD backend needs the amdsmi package: {e}") from None
    except Exception as e:  # the binding fails with KeyError/OSError/AttributeError when the library is missing
        said = " ".join(printed.getvalue().split())
        raise DiscoveryError(
            "AMD SMI library libamd_smi.so could not be loaded (is amd-smi-lib installed, and ROCM_PATH its "
            f"prefix?): {said or type(e).__name__ + ': ' + str(e)}"
        ) from None


@dataclass(frozen=True, slots=True)
class _Processor:
    handle: Any
    card: str  # the card's PCI address less its function: "0000:0c:00"
    bus_id: str  # "0000:0c:00.0"
    partition: int  # KFD current_partition_id
    uuid: str


@dataclass(frozen=True, slots=True)
class _Card:
    key: str
    uuid: str
    processors: tuple[_Processor, ...]  # by partition

    @property
    def primary(self) -> _Processor:
        return self.processors[0]


class AmdBackend:
    """DiscoveryBackend over AMD SMI."""

    name = "amdsmi"

    def __init__(self, amdsmi: ModuleType | Any | None = None, numa_reader: Callable[[str], int] = _sysfs_numa) -> None:
        self._smi: Any = amdsmi if amdsmi is not None else import_amdsmi()
        self._numa_reader = numa_reader
        self._error: type[BaseException] = getattr(self._smi, "AmdSmiException", Exception)
        self._lock = threading.RLock()
        self._readers: list[Any] = []
        self._reader_keys: tuple[int, ...] = ()
        self._pending: deque[HealthEvent] = deque()
        self._ecc_seen: dict[str, int] = {}
        self._initialised = False
        try:
            self._smi.amdsmi_init()
        except self._error as e:
            raise DiscoveryError(f"AMD SMI cannot start (is the amdgpu driver loaded?): {e}") from None
        self._initialised = True

    # --- the library's view, re-read on every call (a mode change replaces the processors) ---------------
    def status_of(self, error: BaseException) -> int:
        getter = getattr(error, "get_error_code", None)
        return _number(getter(), -1) if callable(getter) else -1

    def _cards(self) -> list[_Card]:
        s = self._smi
        try:
            handles = list(s.amdsmi_get_processor_handles())
            processors = []
            for h in handles:
                bus_id = str(s.amdsmi_get_gpu_device_bdf(h)).lower()
                partition = _number(s.amdsmi_get_gpu_kfd_info(h).get("current_partition_id"), 0)
                uuid = str(s.amdsmi_get_gpu_device_uuid(h))
                processors.append(_Processor(h, bus_id.rsplit(".", 1)[0], bus_id, partition, uuid))
        except self._error as e:
            raise DiscoveryError(f"AMD SMI device enumeration failed: {e}") from None
        by_card: dict[str, list[_Processor]] = {}
        for p in processors:
            by_card.setdefault(p.card, []).append(p)
        cards = []
        for key, group in by_card.items():
            group.sort(key=lambda p: p.partition)
            cards.append(_Card(key, group[0].uuid, tuple(group)))
        return cards

    def _card(self, uuid: str) -> _Card:
        for card in self._cards():
            if card.uuid == uuid:
                return card
        raise DiscoveryError(f"AMD SMI has no card {uuid}")

    def _numa(self, handle: Any) -> int | None:
        """The card's NUMA node; None when the library cannot say (an error, or the all-ones "unknown")."""
        try:
            node = int(self._smi.amdsmi_topo_get_numa_node_number(handle))
        except (self._error, TypeError, ValueError):
            return None
        return node if 0 <= node < 0xFFFF else None

    def _optional(self, call: Callable[[], Any], default: Any) -> Any:
        try:
            return call()
        except (self._error, AttributeError, KeyError):
            return default

    # --- discovery ----------------------------------------------------------------------------------------
    def discover(self) -> Discovered:
        s = self._smi
        cards = self._cards()
        devices = []
        for index, card in enumerate(cards):
            try:
                asic = s.amdsmi_get_gpu_asic_info(card.primary.handle)
                memory = sum(_number(s.amdsmi_get_gpu_vram_info(p.handle)["vram_size"]) for p in card.processors)
                units = sum(
                    _number(s.amdsmi_get_gpu_asic_info(p.handle)["num_compute_units"]) for p in card.processors
                )
            except self._error as e:
                raise DiscoveryError(f"AMD SMI could not describe card {index} ({card.key}): {e}") from None
            bus_id = card.primary.bus_id
            numa = self._numa(card.primary.handle)
            devices.append(
                DeviceInfo(
                    uuid=card.uuid,
                    index=index,
                    model=normalise_model(str(asic["market_name"])),
                    memory_mib=memory,  # AMD SMI's "MB" are MiB: an MI300X reports 196,592
                    pci_bus_id=bus_id,
                    numa_node=self._numa_reader(bus_id) if numa is None else numa,
                    sm_count=units,  # compute units
                    vendor=AMD,
                )
            )
        driver = ""
        if cards:
            info = self._optional(lambda: s.amdsmi_get_gpu_driver_info(cards[0].primary.handle), {})
            driver = str(info.get("driver_version", ""))
        with self._lock:
            self._register_events(cards)
            for card in cards:
                self._ecc_seen.setdefault(card.uuid, self._uncorrectable(card))
        return Discovered(AMD, driver, "", tuple(devices))

    def probe(self, uuid: str) -> str | None:
        s = self._smi
        try:
            card = self._card(uuid)
            for p in card.processors:
                s.amdsmi_get_gpu_vram_usage(p.handle)
                s.amdsmi_get_gpu_device_bdf(p.handle)
        except (self._error, DiscoveryError) as e:
            return f"AMD SMI probe failed: {e}"
        return None

    def render_nodes(self, uuid: str) -> tuple[str, ...]:
        """The DRM render nodes of the card's processors (one per partition), e.g. /dev/dri/renderD128."""
        card = self._card(uuid)
        return tuple(self._render_node(p) for p in card.processors)

    def _render_node(self, p: _Processor) -> str:
        try:
            render = _number(self._smi.amdsmi_get_gpu_enumeration_info(p.handle)["drm_render"], -1)
        except self._error as e:
            raise DiscoveryError(f"AMD SMI cannot name the render node of {p.uuid}: {e}") from None
        if render < 0:
            raise DiscoveryError(f"AMD SMI reports no render node for {p.uuid}")
        return f"/dev/dri/renderD{render}"

    # --- health -------------------------------------------------------------------------------------------
    def _register_events(self, cards: list[_Card]) -> None:
        """One reader per processor (the library collects events per processor); re-made when the processors
        change, as after a partition mode change."""
        s = self._smi
        keys = tuple(sorted(self._handle_key(p.handle) for c in cards for p in c.processors))
        if keys == self._reader_keys:
            return
        self._stop_readers()
        kinds = getattr(s, "AmdSmiEvtNotificationType", None)
        reader_class = getattr(s, "AmdSmiEventReader", None)
        if kinds is None or reader_class is None:
            return  # no event support: health then relies on probes and the RAS counts
        wanted = [getattr(kinds, name) for name in WATCHED_EVENTS]
        for card in cards:
            for p in card.processors:
                with contextlib.suppress(self._error):
                    self._readers.append(reader_class(p.handle, wanted))
        self._reader_keys = keys

    def watch_new_processors(self) -> None:
        """Subscribe the processors a mode change made (the old ones' handles are gone)."""
        with self._lock, contextlib.suppress(DiscoveryError):
            self._register_events(self._cards())

    def _stop_readers(self) -> None:
        for reader in self._readers:
            with contextlib.suppress(self._error):
                reader.stop()
        self._readers = []
        self._reader_keys = ()

    @staticmethod
    def _handle_key(handle: Any) -> int:
        return int(getattr(handle, "value", None) or 0)

    def _uncorrectable(self, card: _Card) -> int:
        total = self._optional(lambda: self._smi.amdsmi_get_gpu_total_ecc_count(card.primary.handle), {})
        return _number(total.get("uncorrectable_count"), 0)

    def _ras_events(self) -> None:
        for card in self._cards():
            now = self._uncorrectable(card)
            before = self._ecc_seen.get(card.uuid, now)
            self._ecc_seen[card.uuid] = now
            if now > before:
                self._pending.append(
                    HealthEvent(card.uuid, AMD_RAS_UNCORRECTABLE, f"uncorrectable ECC errors {before} -> {now}")
                )

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        with self._lock:
            if not self._pending:
                with contextlib.suppress(DiscoveryError):
                    self._ras_events()
            if self._pending:
                return self._pending.popleft()
            reader = self._readers[0] if self._readers else None
        if reader is None:
            threading.Event().wait(timeout_s)
            return None
        try:
            events = reader.read(int(timeout_s * 1000))
        except self._error as e:
            if self.status_of(e) == STATUS_NO_DATA:
                return None
            return HealthEvent(None, -1, f"AMD SMI event read failed: {e}")
        with self._lock:
            owners = self._owners()
            for event in events:
                name = str(event.get("event", ""))
                code = AMD_EVENT_CODE_BASE + _number(getattr(self._smi.AmdSmiEvtNotificationType, name, -1), -1)
                uuid = owners.get(self._handle_key(event.get("processor_handle")))
                self._pending.append(HealthEvent(uuid, code, f"AMD SMI event {name}: {event.get('message', '')}"))
            return self._pending.popleft() if self._pending else None

    def _owners(self) -> dict[int, str]:
        """Processor handle -> the card UUID it belongs to."""
        try:
            return {self._handle_key(p.handle): c.uuid for c in self._cards() for p in c.processors}
        except DiscoveryError:
            return {}

    # --- processes ------------------------------------------------------------------------------------------
    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        """Processes of every partition of the card, host PIDs with the VRAM each holds."""
        card = self._card(uuid)
        held: dict[int, float] = {}
        for p in card.processors:
            try:
                listed = self._smi.amdsmi_get_gpu_process_list(p.handle)
            except self._error as e:
                raise DiscoveryError(f"AMD SMI cannot list the processes of {uuid}: {e}") from None
            for proc in listed:
                pid = _number(proc.get("pid"), 0)
                vram = _number(proc.get("memory_usage", {}).get("vram_mem"), 0) / MIB
                held[pid] = held.get(pid, 0.0) + vram
        return tuple(GpuProcess(pid, mib) for pid, mib in sorted(held.items()))

    def partition_processes(self, uuid: str) -> dict[str, int]:
        """Partition UUID -> how many processes run on it."""
        card = self._card(uuid)
        counts: dict[str, int] = {}
        for p in card.processors:
            try:
                counts[p.uuid] = len(self._smi.amdsmi_get_gpu_process_list(p.handle))
            except self._error as e:
                raise DiscoveryError(f"AMD SMI cannot list the processes of {p.uuid}: {e}") from None
        return counts

    def process_utilization(self, uuid: str, since_us: int) -> tuple[UtilizationSample, ...]:
        """Always empty: AMD SMI's process list gives cumulative engine time per process, not time-stamped
        samples of a share, so there is nothing to report in NVML's form."""
        self._card(uuid)
        return ()

    def close(self) -> None:
        with self._lock:
            self._stop_readers()
            if self._initialised:
                with contextlib.suppress(self._error):
                    self._smi.amdsmi_shut_down()
                self._initialised = False


class AmdPartitions:
    """Compute x memory partition modes as partitions (PartitionBackend).

    A mode is the whole card's: "CPX/NPS4" makes eight partitions at once. So:
    - `profiles`: the "<COMPUTE>/<MEMORY>" pairs amdgpu accepts (SPX/NPS1, DPX/NPS1-2, QPX and CPX with
      NPS1/NPS4) among the memory modes the card reports, smallest partitions first; () for MI210.
    - `partitions`: every partition of the card's current mode; () in SPX/NPS1 (the card whole) and on MI210.
      Partition k of an N-partition mode starts at XCC k*8/N.
    - `create(profile, start)`: on a card already in that mode, the partition at `start` (it exists); otherwise
      the card is switched to the mode, only while no process runs on any of its partitions (else IN_USE).
    - `destroy`: AMD cannot remove one partition of a mode, so destroy releases it (IN_USE while a process
      runs on it); when every partition of the mode is released and no process runs on the card, the card
      returns to SPX/NPS1. A later `create` in the same mode hands a released partition out again.
    The released set lives in this object: after an agent restart the card keeps its mode until the agent
    destroys its partitions again.
    """

    def __init__(self, backend: AmdBackend) -> None:
        self._backend = backend
        self._smi: Any = backend._smi
        self._error = backend._error
        self._lock = threading.RLock()
        self._released: dict[str, set[int]] = {}  # card UUID -> partition indices released in its current mode

    def _call(self, what: str, uuid: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self._error as e:
            status = self._backend.status_of(e)
            if status == STATUS_NOT_SUPPORTED:
                raise PartitionError("NOT_SUPPORTED", f"{uuid} has no partition modes ({what})") from None
            if status == STATUS_BUSY:
                raise PartitionError("IN_USE", f"{uuid} is busy ({what})") from None
            if status == STATUS_SETTING_UNAVAILABLE:
                raise PartitionError("INVALID_ARGUMENT", f"{uuid} refuses {what} (AMD SMI status 55)") from None
            raise PartitionError("INVALID_ARGUMENT", f"{what} on {uuid} failed: {e}") from None

    def _card(self, uuid: str) -> _Card:
        try:
            return self._backend._card(uuid)
        except DiscoveryError as e:
            raise PartitionError("NOT_FOUND", str(e)) from None

    def _memory_modes(self, card: _Card) -> tuple[str, ...] | None:
        """The memory modes the card supports; None when it has no partition modes."""
        try:
            config = self._smi.amdsmi_get_gpu_memory_partition_config(card.primary.handle)
        except self._error as e:
            if self._backend.status_of(e) == STATUS_NOT_SUPPORTED:
                return None
            raise PartitionError("INVALID_ARGUMENT", f"memory partition caps of {card.uuid}: {e}") from None
        return tuple(m for m in config.get("partition_caps", ()) if m != "N/A")

    def _mode(self, card: _Card) -> str | None:
        h = card.primary.handle
        try:
            compute = self._smi.amdsmi_get_gpu_compute_partition(h)
            memory = self._smi.amdsmi_get_gpu_memory_partition(h)
        except self._error as e:
            if self._backend.status_of(e) == STATUS_NOT_SUPPORTED:
                return None
            raise PartitionError("INVALID_ARGUMENT", f"partition mode of {card.uuid}: {e}") from None
        return f"{compute}/{memory}"

    def profiles(self, gpu_uuid: str) -> tuple[str, ...]:
        memory_modes = self._memory_modes(self._card(gpu_uuid))
        if memory_modes is None:
            return ()
        out: list[str] = []
        for compute, _count in sorted(COMPUTE_MODES.items(), key=lambda kv: -kv[1]):
            out.extend(f"{compute}/{m}" for m in AMD_COMPATIBLE_MEMORY[compute] if m in memory_modes)
        return tuple(out)

    def _partition(self, card: _Card, profile: str, p: _Processor) -> Partition:
        s = self._smi
        try:
            memory = _number(s.amdsmi_get_gpu_vram_info(p.handle)["vram_size"])
            units = _number(s.amdsmi_get_gpu_asic_info(p.handle)["num_compute_units"])
        except self._error as e:
            raise PartitionError("NOT_FOUND", f"partition {p.uuid} of {card.uuid}: {e}") from None
        count = len(card.processors)
        nodes: tuple[str, ...] = ()
        with contextlib.suppress(DiscoveryError):
            nodes = (self._backend._render_node(p),)
        return Partition(card.uuid, p.uuid, profile, p.partition * XCC_SLOTS // count, memory, units, nodes)

    def partitions(self, gpu_uuid: str) -> tuple[Partition, ...]:
        card = self._card(gpu_uuid)
        mode = self._mode(card)
        if mode is None or mode == REST_PROFILE:
            return ()
        return tuple(self._partition(card, mode, p) for p in card.processors)

    def busy(self, gpu_uuid: str) -> bool:
        try:
            return any(self._backend.partition_processes(gpu_uuid).values())
        except DiscoveryError as e:
            raise PartitionError("NOT_FOUND", str(e)) from None

    def create(self, gpu_uuid: str, profile: str, start: int) -> Partition:
        with self._lock:
            card = self._card(gpu_uuid)
            profiles = self.profiles(gpu_uuid)
            if not profiles:
                raise PartitionError("NOT_SUPPORTED", f"{gpu_uuid} has no partition modes")
            if profile not in profiles:
                raise PartitionError("INVALID_ARGUMENT", f"{gpu_uuid} has no profile {profile!r} (has {profiles})")
            compute, memory = profile.split("/")
            count = COMPUTE_MODES[compute]
            width = XCC_SLOTS // count
            if start < 0 or start >= XCC_SLOTS or start % width:
                starts = list(range(0, XCC_SLOTS, width))
                raise PartitionError("INVALID_ARGUMENT", f"{profile} partitions start at XCCs {starts}, not {start}")
            if self._mode(card) != profile:
                if self.busy(gpu_uuid):
                    raise PartitionError("IN_USE", f"{gpu_uuid} runs work: its partition mode cannot change")
                self._switch(card, compute, memory)
                self._released[gpu_uuid] = set()
                card = self._card(gpu_uuid)
                self._backend.watch_new_processors()
            k = start // width
            self._released.setdefault(gpu_uuid, set()).discard(k)
            match = [p for p in card.processors if p.partition == k]
            if not match:
                raise PartitionError("NOT_FOUND", f"{gpu_uuid} shows no partition {k} in {profile}")
            return self._partition(card, profile, match[0])

    def _switch(self, card: _Card, compute: str, memory: str) -> None:
        """Every compute mode pairs with NPS1, so the way from any pair to any other goes through
        <target compute>/NPS1: leave the current memory mode for NPS1 first when it changes."""
        s = self._smi
        current = self._mode(card) or REST_PROFILE
        now_compute, now_memory = current.split("/")
        memory_type = s.AmdSmiMemoryPartitionType
        if now_memory != memory and now_memory != "NPS1":
            self._call("NPS1", card.uuid, lambda: s.amdsmi_set_gpu_memory_partition(
                self._card(card.uuid).primary.handle, memory_type.NPS1))
        if now_compute != compute:
            self._call(f"{compute}", card.uuid, lambda: s.amdsmi_set_gpu_compute_partition(
                self._card(card.uuid).primary.handle, getattr(s.AmdSmiComputePartitionType, compute)))
        if memory != "NPS1" and now_memory != memory:
            self._call(f"{compute}/{memory}", card.uuid, lambda: s.amdsmi_set_gpu_memory_partition(
                self._card(card.uuid).primary.handle, getattr(memory_type, memory)))

    def destroy(self, gpu_uuid: str, partition_id: str) -> None:
        with self._lock:
            card = self._card(gpu_uuid)
            mode = self._mode(card)
            if mode is None:
                raise PartitionError("NOT_SUPPORTED", f"{gpu_uuid} has no partition modes")
            match = [p for p in card.processors if p.uuid == partition_id]
            if mode == REST_PROFILE or not match:
                raise PartitionError("NOT_FOUND", f"{gpu_uuid} has no partition {partition_id} (mode {mode})")
            running = self._backend.partition_processes(gpu_uuid)
            if running.get(partition_id):
                raise PartitionError("IN_USE", f"partition {partition_id} of {gpu_uuid} runs work")
            released = self._released.setdefault(gpu_uuid, set())
            released.add(match[0].partition)
            every = {p.partition for p in card.processors}
            if every <= released and not any(running.values()):
                self._switch(card, *REST_PROFILE.split("/"))
                released.clear()
                self._backend.watch_new_processors()


class AmdVendor:
    """AMD Instinct cards on a node (Vendor)."""

    name = AMD
    resource_name = "amd.com/gpu"

    def __init__(self, backend: AmdBackend | None = None) -> None:
        self._backend = backend if backend is not None else AmdBackend()
        self._partitions = AmdPartitions(self._backend)

    @property
    def discovery(self) -> DiscoveryBackend:
        return self._backend

    @property
    def partitioning(self) -> PartitionBackend | None:
        return self._partitions

    def isolation_modes(self) -> frozenset[IsolationMode]:
        """Whole cards (NONE), compute partitions (MIG, the hardware-partition mode of every vendor) and the HIP
        interception library's memory cap and CU mask (HOOK)."""
        return frozenset({IsolationMode.NONE, IsolationMode.MIG, IsolationMode.HOOK})

    def container_devices(self, device: DeviceInfo, partition: Partition | None = None) -> ContainerDevices:
        """/dev/kfd (the compute interface every ROCm process opens) and the render node(s): the partition's
        own, or every partition's of the card when it is handed whole."""
        if partition is not None and partition.device_nodes:
            nodes = partition.device_nodes
        else:
            nodes = self._backend.render_nodes(device.uuid)
        return ContainerDevices(("/dev/kfd", *nodes))
