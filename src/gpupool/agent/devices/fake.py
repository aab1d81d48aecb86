"""The fake discovery backend: GPUs described in a YAML or JSON file, with faults injected by tests.

Used by the tests, `gpupool demo` and scale tests, so every code path above discovery runs without a GPU.

File format (YAML or JSON; every field checked, errors name the field):

    vendor: nvidia              # optional, default nvidia
    driver_version: "570.86"    # optional
    cuda_version: "12.8"        # optional
    gpus:                       # required, at least one entry
      - uuid: GPU-0b6f...       # required unless `count` is given
        model: H100-80GB        # required
        memory_mib: 81559       # required, > 0
        pci_bus_id: "0000:3b:00.0"
        numa_node: 0
        sm_count: 132
        nvlink_peers: [1]       # indices of the other GPUs joined by NVLink
        mig: false
        healthy: true           # false: probes fail until `heal` is called
        compute_capability: "9.0"
      - count: 4                # shorthand: four identical GPUs, UUIDs derived from uuid_prefix
        uuid_prefix: GPU-fake-node1
        model: A10
        memory_mib: 23028
      - count: 2                # {node} in uuid or uuid_prefix: the agent's node name, so one file (a
        uuid_prefix: GPU-{node} #   chart's ConfigMap) gives every node GPUs of its own (GPU-<node>-0, ...)
        model: L40S
        memory_mib: 46068
    validation:                 # optional: node validation steps that fail, with the reason shown
      toolkit: "toolkit 1.17.3 is older than 1.17.8"   # driver, toolkit, isolation, workload

With `vendor: amd` or `vendor: ascend` the cards stand for that vendor's (discovery, inventory, routing by
runtime), and a container granted them gets what `FakeContainerDevices` hands out: environment only.

Only `validation` is read again when the file changes (each validation pass looks at the file's size
and modification time): tests inject a validation fault by rewriting the file and fix it the same way.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpupool.agent.devices.ascend import SHARED_NODES
from gpupool.agent.devices.discovery import (
    DeviceInfo,
    Discovered,
    DiscoveryError,
    GpuProcess,
    HealthEvent,
    UtilizationSample,
)
from gpupool.agent.devices.mig import MigBackend
from gpupool.agent.devices.vendor import ContainerDevices, Partition
from gpupool.core.vendors import AMD, ASCEND

MAX_UUID_LEN = 58  # device IDs are "<uuid>::<slot>" and kubelet allows 63 characters
NODE_FIELD = "{node}"  # in a uuid or uuid_prefix: replaced by the agent's node name


# What a fake non-NVIDIA card's container is told it would have been given: the device nodes a node of that
# vendor hands out, comma-separated (see FakeContainerDevices).
FAKE_DEVICE_NODES_ENV = "GPUPOOL_FAKE_DEVICE_NODES"
AMD_RENDER_BASE = 128  # DRM render minors start at 128 (/dev/dri/renderD128 is the first card's)


class FakeContainerDevices:
    """The fake's ContainerDevices for a card of a non-NVIDIA vendor: environment only.

    The host running fake cards (a testbed, a kind node) has no /dev/kfd, /dev/dri/renderD* or /dev/davinci*,
    so a container given them as device nodes would not start. Instead the nodes the vendor's real provider
    would hand out for the card (AmdVendor / AscendVendor: the same shapes, numbered by the card's index) are
    named in GPUPOOL_FAKE_DEVICE_NODES, and the vendor's own variables (ASCEND_VISIBLE_DEVICES) are set as the
    real provider sets them, so tests see what a real node's container would get. Only for `backend: fake`.
    """

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor

    def container_devices(self, device: DeviceInfo, partition: Partition | None = None) -> ContainerDevices:
        env: dict[str, str] = {}
        if self.vendor == AMD:
            nodes: tuple[str, ...] = ("/dev/kfd", f"/dev/dri/renderD{AMD_RENDER_BASE + device.index}")
        elif self.vendor == ASCEND and partition is not None:
            nodes = (f"/dev/vdavinci{partition.partition_id}", *SHARED_NODES)
            env = {"ASCEND_VISIBLE_DEVICES": partition.partition_id, "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"}
        elif self.vendor == ASCEND:
            nodes = (f"/dev/davinci{device.index}", *SHARED_NODES)
            env = {"ASCEND_VISIBLE_DEVICES": str(device.index)}
        else:  # a vendor the fake has no shapes for: the card's UUID, so a test still sees which card it got
            nodes = ()
            env = {"GPUPOOL_FAKE_VISIBLE_DEVICES": device.uuid}
        return ContainerDevices((), {**env, FAKE_DEVICE_NODES_ENV: ",".join(nodes)} if nodes else env)


class FakeGPUFileError(DiscoveryError):
    """A malformed fake GPU description; the message names the file and the field."""


class _GPUEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    uuid: str | None = Field(default=None, min_length=1, max_length=MAX_UUID_LEN, pattern=r"^[A-Za-z0-9._-]+$")
    count: int | None = Field(default=None, ge=1, le=64)
    uuid_prefix: str = Field(default="GPU-fake", max_length=48, pattern=r"^[A-Za-z0-9._-]+$")
    model: str = Field(min_length=1)
    memory_mib: int = Field(gt=0)
    pci_bus_id: str = ""
    numa_node: int = Field(default=-1, ge=-1)
    sm_count: int = Field(default=0, ge=0)
    nvlink_peers: list[int] = Field(default_factory=list)
    mig: bool = False
    healthy: bool = True
    compute_capability: str = Field(default="", pattern=r"^(\d+\.\d+)?$")

    @model_validator(mode="after")
    def _uuid_or_count(self) -> _GPUEntry:
        if self.uuid is None and self.count is None:
            raise ValueError("give either uuid (one GPU) or count (several identical GPUs)")
        if self.uuid is not None and self.count is not None:
            raise ValueError("give uuid or count, not both")
        return self


class _FakeFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vendor: str = Field(default="nvidia", min_length=1)
    driver_version: str = "fake"
    cuda_version: str = "fake"
    gpus: list[_GPUEntry] = Field(min_length=1)
    validation: dict[Literal["driver", "toolkit", "isolation", "workload"], str] = Field(default_factory=dict)


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "document"


def _with_node(data: Any, node: str) -> Any:
    """`data` with NODE_FIELD in each GPU's uuid and uuid_prefix replaced by `node` (unchanged without one)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("gpus"), list):
        return data
    gpus = [
        {k: v.replace(NODE_FIELD, node) if k in ("uuid", "uuid_prefix") and isinstance(v, str) else v
         for k, v in entry.items()} if isinstance(entry, Mapping) else entry
        for entry in data["gpus"]
    ]
    return {**data, "gpus": gpus}


def parse_fake_description(data: Any, source: str, node: str = "") -> Discovered:
    """Validate a parsed description into devices; raises FakeGPUFileError naming `source` and the field.
    `node` fills NODE_FIELD in UUIDs (left in, it fails the UUID's pattern, which names the field)."""
    data = _with_node(data, node) if node else data
    try:
        doc = _FakeFile.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{_where(err['loc'])}: {err['msg']}" for err in e.errors())
        raise FakeGPUFileError(f"fake GPU file {source}: {problems}") from None
    devices: list[DeviceInfo] = []
    for entry in doc.gpus:
        uuids = [entry.uuid] if entry.uuid else [f"{entry.uuid_prefix}-{i}" for i in range(entry.count or 0)]
        for uuid in uuids:
            assert uuid is not None
            devices.append(
                DeviceInfo(
                    uuid=uuid,
                    index=len(devices),
                    model=entry.model,
                    memory_mib=entry.memory_mib,
                    pci_bus_id=entry.pci_bus_id,
                    numa_node=entry.numa_node,
                    sm_count=entry.sm_count,
                    nvlink_peers=tuple(entry.nvlink_peers),
                    mig_enabled=entry.mig,
                    vendor=doc.vendor,
                    compute_capability=entry.compute_capability,
                )
            )
    seen: set[str] = set()
    for d in devices:
        if d.uuid in seen:
            raise FakeGPUFileError(f"fake GPU file {source}: gpus: UUID {d.uuid!r} appears twice")
        seen.add(d.uuid)
        bad = [p for p in d.nvlink_peers if not 0 <= p < len(devices) or p == d.index]
        if bad:
            raise FakeGPUFileError(
                f"fake GPU file {source}: gpus[{d.index}].nvlink_peers: {bad} are not other GPU indices "
                f"(0..{len(devices) - 1})"
            )
    return Discovered(doc.vendor, doc.driver_version, doc.cuda_version, tuple(devices))


def load_fake_file(path: Path, node: str = "") -> tuple[Discovered, set[str]]:
    """Read and validate the file; returns the devices and the UUIDs declared unhealthy."""
    data = _read(path)
    discovered = parse_fake_description(data, str(path), node)
    unhealthy = _declared_unhealthy(data, discovered)
    return discovered, unhealthy


def validation_faults(data: Any, source: str, node: str = "") -> dict[str, str]:
    """The `validation` section of a parsed description: failing step -> reason."""
    parse_fake_description(data, source, node)  # the whole file must stay valid
    doc = _FakeFile.model_validate(_with_node(data, node) if node else data)
    return {str(step): reason for step, reason in doc.validation.items()}


def _read(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as e:
        raise FakeGPUFileError(f"fake GPU file {path}: cannot read: {e.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise FakeGPUFileError(f"fake GPU file {path}: not valid {kind}: {e}") from None
    return data


def _declared_unhealthy(data: Mapping[str, Any], discovered: Discovered) -> set[str]:
    out: set[str] = set()
    position = 0
    for entry in data.get("gpus", []):
        n = int(entry.get("count") or 1)
        if entry.get("healthy") is False:
            out.update(d.uuid for d in discovered.devices[position : position + n])
        position += n
    return out


class FakeBackend:
    """Discovery from a description, plus fault injection: Xids, failing probes, vanished GPUs."""

    name = "fake"

    def __init__(self, discovered: Discovered, unhealthy: set[str] | None = None, path: Path | None = None,
                 validation: Mapping[str, str] | None = None, node: str = "") -> None:
        self._discovered = discovered
        self._path = path  # re-read for `validation` when it changes (None: built in memory)
        self._node = node  # fills {node} in the file's UUIDs when it is read again
        self._stamp = _stamp(path)
        self._validation: dict[str, str] = dict(validation or {})
        self._lock = threading.Lock()
        self._broken: dict[str, str] = {u: "declared unhealthy in the fake GPU file" for u in unhealthy or set()}
        self._missing: set[str] = set()
        self._events: queue.Queue[HealthEvent] = queue.Queue()
        self.discover_calls = 0
        # processes by host PID: (GPU UUID, MiB held, SM percent), as NVML would list them from the host
        self._procs: dict[int, tuple[str, float, float]] = {}
        self._sample_time_us = 0  # the fake driver's sample clock: one tick per utilisation query

    @classmethod
    def from_file(cls, path: Path, node: str = "") -> FakeBackend:
        """The GPUs described in `path`; `node` (the agent's node name) fills {node} in their UUIDs."""
        data = _read(path)
        discovered = parse_fake_description(data, str(path), node)
        return cls(discovered, _declared_unhealthy(data, discovered), path, validation_faults(data, str(path), node),
                   node)

    def mig_backend(self) -> MigBackend | None:
        """A fake MIG driver for the GPUs described with `mig: true` (same geometry and NVML answers;
        gpupool.agent.devices.fake_mig), so that isolation mig runs without a GPU; None when there are none."""
        from gpupool.agent.devices.fake_mig import FakeMigDriver

        mig = {d.uuid: d.model for d in self._discovered.devices if d.mig_enabled}
        return FakeMigDriver(mig) if mig else None

    # --- DiscoveryBackend ---------------------------------------------------------------------------------
    def discover(self) -> Discovered:
        with self._lock:
            self.discover_calls += 1
            devices = tuple(d for d in self._discovered.devices if d.uuid not in self._missing)
        d = self._discovered
        return Discovered(d.vendor, d.driver_version, d.cuda_version, devices)

    def probe(self, uuid: str) -> str | None:
        with self._lock:
            if uuid in self._missing:
                return "GPU is not present"
            return self._broken.get(uuid)

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        with self._lock:
            if uuid in self._missing:
                raise DiscoveryError(f"GPU {uuid} is not present")
            return tuple(GpuProcess(pid, mib) for pid, (gpu, mib, _) in sorted(self._procs.items()) if gpu == uuid)

    def process_utilization(self, uuid: str, since_us: int) -> tuple[UtilizationSample, ...]:
        """One sample per running process, stamped with the next tick of the fake sample clock (as NVML,
        only samples newer than `since_us`)."""
        with self._lock:
            self._sample_time_us += 1
            now = self._sample_time_us
            procs = sorted((pid, sm) for pid, (gpu, _, sm) in self._procs.items() if gpu == uuid)
        return tuple(UtilizationSample(pid, now, sm) for pid, sm in procs) if now > since_us else ()

    def close(self) -> None:
        pass

    # --- processes (what the driver reports per process, by host PID) ------------------------------------
    def run_process(self, uuid: str, pid: int, used_memory_mib: float, sm_percent: float = 0.0) -> None:
        """A process with host PID `pid` holds a context on GPU `uuid` (or changes what it holds)."""
        with self._lock:
            self._procs[pid] = (uuid, used_memory_mib, sm_percent)

    def end_process(self, pid: int) -> None:
        """The process exited (or was killed): the driver stops listing it."""
        with self._lock:
            self._procs.pop(pid, None)

    # --- fault injection ----------------------------------------------------------------------------------
    def inject_xid(self, uuid: str | None, xid: int, *, breaks: bool = True) -> None:
        """Report Xid `xid` on a GPU; with `breaks`, probes of that GPU fail until `heal`."""
        if breaks and uuid is not None:
            with self._lock:
                self._broken[uuid] = f"Xid {xid}"
        self._events.put(HealthEvent(uuid, xid, "injected"))

    def heal(self, uuid: str) -> None:
        """The GPU answers probes again (as after a reset)."""
        with self._lock:
            self._broken.pop(uuid, None)
            self._missing.discard(uuid)

    def remove(self, uuid: str) -> None:
        """The GPU disappears from discovery without an Xid (fell off the bus silently)."""
        with self._lock:
            self._missing.add(uuid)

    # --- node validation faults (gpupool.agent.checks.fake) -----------------------------------------------
    def fail_validation(self, step: str, reason: str) -> None:
        """The validation check of `step` fails with `reason` until `fix_validation`."""
        with self._lock:
            self._validation[step] = reason

    def fix_validation(self, step: str) -> None:
        with self._lock:
            self._validation.pop(step, None)

    def validation_fault(self, step: str) -> str | None:
        """Why `step` fails now (None: it passes). Reads the file's `validation` again when the file changed;
        a file that no longer parses fails every step with the parse error (a test's mistake must show)."""
        stamp = _stamp(self._path)
        if self._path is not None and stamp != self._stamp:
            try:
                faults = validation_faults(_read(self._path), str(self._path), self._node)
            except FakeGPUFileError as e:
                return str(e)
            with self._lock:
                self._validation, self._stamp = faults, stamp
        with self._lock:
            return self._validation.get(step)


def _stamp(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size
