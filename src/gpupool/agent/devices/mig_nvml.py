"""The MIG manager's NVML backend (nvidia-ml-py), following the call sequence of reference §4.7.

The pynvml module object is injected (the one gpupool.agent.devices.nvml imported, or a stand-in in tests), so
this module imports no NVML itself. Profiles are read from NVML by index and named by the driver (`MIG
1g.10gb` -> `1g.10gb`), so names follow the SKU and driver as the reference advises; the profile *ID*
NVML returns (19, 15, ...) is what create and query calls take. Where pynvml expects caller-allocated
arrays (instances, placements), ctypes arrays of the module's own struct types are passed.

Not run on a GPU yet (no GPU machine was available when it was written); tests drive it with a stand-in
module that keeps MIG state like the fake driver.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, TypeVar

from gpupool.agent.devices.mig import BackendInstance, MigError

T = TypeVar("T")
_CODES = ("IN_USE", "INSUFFICIENT_RESOURCES", "INVALID_ARGUMENT", "NOT_FOUND", "NOT_SUPPORTED", "NO_PERMISSION")
_MAX_PLACEMENTS = 8  # memory slices on the largest MIG GPU: no profile has more placements


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlMigBackend:
    def __init__(self, nvml: Any) -> None:
        self.n = nvml
        self._error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self._profiles: dict[str, dict[str, Any]] = {}

    # --- plumbing --------------------------------------------------------------------------------
    def _code(self, e: BaseException) -> str:
        value = getattr(e, "value", None)
        for name in _CODES:
            if value is not None and value == getattr(self.n, f"NVML_ERROR_{name}", object()):
                return name
        return "UNKNOWN"

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._error as e:
            raise MigError(self._code(e), f"{what}: {e}") from None

    def _handle(self, gpu: str) -> Any:
        return self._call(f"GPU {gpu}", self.n.nvmlDeviceGetHandleByUUID, gpu)

    def _gi_profiles(self, gpu: str) -> dict[str, Any]:
        """Profile name -> NVML profile info, for the GPU instance profiles this GPU supports."""
        if gpu not in self._profiles:
            h = self._handle(gpu)
            found: dict[str, Any] = {}
            for index in range(int(getattr(self.n, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12))):
                try:
                    info = self.n.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
                except self._error:
                    continue  # NOT_SUPPORTED / INVALID_ARGUMENT: not on this GPU
                found[_text(info.name).removeprefix("MIG ").strip()] = info
            self._profiles[gpu] = found
        return self._profiles[gpu]

    def _compute_instances(self, gi: Any) -> list[Any]:
        n = self.n
        shared = getattr(n, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
        out: list[Any] = []
        for index in range(int(getattr(n, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9))):
            try:
                info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, shared)
            except self._error:
                continue
            array = (n.c_nvmlComputeInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(0)
            self._call("list compute instances", n.nvmlGpuInstanceGetComputeInstances, gi, info.id, array,
                       ctypes.byref(count))
            out.extend(array[k] for k in range(count.value))
        return out

    def _uuid(self, ci: Any) -> str:
        device = self._call("compute instance info", self.n.nvmlComputeInstanceGetInfo, ci).device
        return _text(self._call("MIG device UUID", self.n.nvmlDeviceGetUUID, device))

    def _gi(self, gpu: str, gi_id: int) -> Any:
        return self._call(f"{gpu} GPU instance {gi_id}", self.n.nvmlDeviceGetGpuInstanceById, self._handle(gpu), gi_id)

    # --- MigBackend ------------------------------------------------------------------------------
    def gpu_uuids(self) -> list[str]:
        n = self.n
        count = int(self._call("GPU count", n.nvmlDeviceGetCount))
        return sorted(_text(self._call("GPU UUID", n.nvmlDeviceGetUUID,
                                       self._call("GPU handle", n.nvmlDeviceGetHandleByIndex, i)))
                      for i in range(count))

    def model(self, gpu: str) -> str:
        return _text(self._call(f"{gpu} name", self.n.nvmlDeviceGetName, self._handle(gpu)))

    def mig_enabled(self, gpu: str) -> bool:
        current = self._call(f"{gpu} MIG mode", self.n.nvmlDeviceGetMigMode, self._handle(gpu))[0]
        return int(current) == int(getattr(self.n, "NVML_DEVICE_MIG_ENABLE", 1))

    def busy(self, gpu: str) -> bool:
        return len(self._call(f"{gpu} processes", self.n.nvmlDeviceGetComputeRunningProcesses, self._handle(gpu))) > 0

    def set_mig_mode(self, gpu: str, enabled: bool) -> None:
        mode = getattr(self.n, "NVML_DEVICE_MIG_ENABLE" if enabled else "NVML_DEVICE_MIG_DISABLE", int(enabled))
        self._call(f"{gpu} set MIG mode", self.n.nvmlDeviceSetMigMode, self._handle(gpu), mode)
        self._profiles.pop(gpu, None)

    def instances(self, gpu: str) -> list[BackendInstance]:
        n = self.n
        h = self._handle(gpu)
        out = []
        for name, info in self._gi_profiles(gpu).items():
            array = (n.c_nvmlGpuInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(0)
            self._call(f"{gpu} list {name}", n.nvmlDeviceGetGpuInstances, h, info.id, array, ctypes.byref(count))
            for k in range(count.value):
                gi = array[k]
                gi_info = self._call("GPU instance info", n.nvmlGpuInstanceGetInfo, gi)
                cis = self._compute_instances(gi)
                out.append(BackendInstance(int(gi_info.id), name, int(gi_info.placement.start),
                                           self._uuid(cis[0]) if cis else None))
        return sorted(out, key=lambda i: i.start)

    def create_gpu_instance(self, gpu: str, profile: str, start: int) -> int:
        n = self.n
        h = self._handle(gpu)
        info = self._gi_profiles(gpu).get(profile)
        if info is None:
            raise MigError("INVALID_ARGUMENT", f"{gpu}: NVML offers no profile {profile}")
        placements = (n.c_nvmlGpuInstancePlacement_t * _MAX_PLACEMENTS)()
        count = ctypes.c_uint(_MAX_PLACEMENTS)
        self._call(f"{gpu} placements of {profile}", n.nvmlDeviceGetGpuInstancePossiblePlacements, h, info.id,
                   placements, ctypes.byref(count))
        chosen = next((placements[k] for k in range(count.value) if int(placements[k].start) == start), None)
        if chosen is None:
            raise MigError("INVALID_ARGUMENT", f"{gpu}: {profile} cannot start at slot {start}")
        gi = self._call(f"{gpu} create {profile}@{start}", n.nvmlDeviceCreateGpuInstanceWithPlacement, h, info.id,
                        ctypes.byref(chosen))
        return int(self._call("GPU instance info", n.nvmlGpuInstanceGetInfo, gi).id)

    def create_compute_instance(self, gpu: str, gi_id: int) -> str:
        """The compute instance that spans the whole GPU instance (1g: the 1_SLICE or 1_SLICE_REV1 profile,
        whichever the driver accepts), and its MIG device UUID."""
        n = self.n
        gi = self._gi(gpu, gi_id)
        gi_info = self._call("GPU instance info", n.nvmlGpuInstanceGetInfo, gi)
        slices = next((int(i.sliceCount) for i in self._gi_profiles(gpu).values() if i.id == gi_info.profileId), None)
        shared = getattr(n, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
        last: MigError | None = None
        for index in range(int(getattr(n, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9))):
            try:
                ci_info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, shared)
            except self._error:
                continue
            if slices is not None and int(ci_info.sliceCount) != slices:
                continue
            try:
                ci = self._call(f"{gpu} create compute instance", n.nvmlGpuInstanceCreateComputeInstance, gi,
                                ci_info.id)
            except MigError as e:
                last = e
                continue
            return self._uuid(ci)
        raise last or MigError("NOT_SUPPORTED", f"{gpu}: no full-size compute instance profile for GI {gi_id}")

    def destroy_compute_instance(self, gpu: str, gi_id: int) -> None:
        for ci in self._compute_instances(self._gi(gpu, gi_id)):
            self._call(f"{gpu} destroy compute instance of GI {gi_id}", self.n.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, gpu: str, gi_id: int) -> None:
        self._call(f"{gpu} destroy GPU instance {gi_id}", self.n.nvmlGpuInstanceDestroy, self._gi(gpu, gi_id))
