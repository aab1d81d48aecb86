"""The NVML MIG backend against a stand-in pynvml module that keeps MIG state with A100-40GB geometry
(profile indices and IDs as in reference §1.2), driven through the MIG manager."""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpupool.agent.devices.mig import MigError, MigGranted, MigManager
from gpupool.agent.devices.mig_nvml import NvmlMigBackend
from gpupool.core.mig import MODELS, PlacedInstance, layout_problems

A100 = MODELS["A100-40GB"]
# NVML GPU-instance profile index -> (profile name, nvidia-smi ID)
GI_INDEX = {0: ("1g.5gb", 19), 7: ("1g.5gb+me", 20), 9: ("1g.10gb", 15), 1: ("2g.10gb", 14), 2: ("3g.20gb", 9),
            3: ("4g.20gb", 5), 4: ("7g.40gb", 0)}
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 7: 1}  # compute-instance profile index -> compute slices


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class StandIn:
    NVMLError = NVMLError
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND = 2, 3, 6
    NVML_ERROR_INSUFFICIENT_RESOURCES, NVML_ERROR_IN_USE = 7, 19
    NVML_GPU_INSTANCE_PROFILE_COUNT, NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x12, 9
    NVML_DEVICE_MIG_ENABLE, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 1, 0
    c_nvmlGpuInstance_t = ctypes.c_uint64
    c_nvmlComputeInstance_t = ctypes.c_uint64
    c_nvmlGpuInstancePlacement_t = Placement

    def __init__(self) -> None:
        self.gis: dict[int, dict[str, Any]] = {}  # GI id -> profile, start, ci (uuid or None)
        self.busy: set[str] = set()
        self.refuse_ci_index = {15: 0}  # on a 1g.10gb GI (ID 15) only the REV1 compute profile (index 7) works

    def _profile(self, pid: int) -> str:
        return next(name for name, ident in GI_INDEX.values() if ident == pid)

    # devices
    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return 0

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        if uuid != "GPU-nvml-0":
            raise NVMLError(self.NVML_ERROR_NOT_FOUND)
        return 0

    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:
        return (handle[1] if isinstance(handle, tuple) else "GPU-nvml-0").encode()

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA A100-SXM4-40GB"

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        return [1, 1]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return list(self.busy)

    # GPU instances
    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: int, index: int) -> Any:
        if index not in GI_INDEX:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        name, ident = GI_INDEX[index]
        p = A100.profile(name)
        assert p is not None
        return SimpleNamespace(id=ident, name=f"MIG {name}".encode(), instanceCount=p.max_count,
                               sliceCount=p.compute_slices)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h: int, pid: int, array: Any, count: Any) -> None:
        p = A100.profile(self._profile(pid))
        assert p is not None
        for k, s in enumerate(p.starts):
            array[k].start, array[k].size = s, p.memory_slices
        count._obj.value = len(p.starts)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: int, pid: int, placement: Any) -> int:
        name, start = self._profile(pid), int(placement._obj.start)
        layout = [PlacedInstance(g["profile"], g["start"]) for g in self.gis.values()]
        if layout_problems(A100, [*layout, PlacedInstance(name, start)]):
            raise NVMLError(self.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = max(self.gis, default=0) + 1
        self.gis[gi] = {"profile": name, "start": start, "ci": None}
        return gi

    def nvmlDeviceGetGpuInstances(self, h: int, pid: int, array: Any, count: Any) -> None:
        mine = [gi for gi, g in sorted(self.gis.items()) if g["profile"] == self._profile(pid)]
        for k, gi in enumerate(mine):
            array[k] = gi
        count._obj.value = len(mine)

    def nvmlDeviceGetGpuInstanceById(self, h: int, gi: int) -> int:
        if gi not in self.gis:
            raise NVMLError(self.NVML_ERROR_NOT_FOUND)
        return gi

    def nvmlGpuInstanceGetInfo(self, gi: int) -> Any:
        g = self.gis[gi]
        ident = next(i for n, i in GI_INDEX.values() if n == g["profile"])
        return SimpleNamespace(id=gi, profileId=ident, placement=SimpleNamespace(start=g["start"]))

    def nvmlGpuInstanceDestroy(self, gi: int) -> None:
        if self.gis[gi]["ci"] is not None:
            raise NVMLError(self.NVML_ERROR_IN_USE)
        del self.gis[gi]

    # compute instances (handle = GI id; one per GI)
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: int, index: int, engines: int) -> Any:
        if index not in CI_SLICES:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=index, sliceCount=CI_SLICES[index], instanceCount=1)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: int, ci_pid: int) -> int:
        ident = self.nvmlGpuInstanceGetInfo(gi).profileId
        if self.refuse_ci_index.get(ident) == ci_pid:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        self.gis[gi]["ci"] = (ci_pid, f"MIG-nvml-{gi}")
        return gi

    def nvmlGpuInstanceGetComputeInstances(self, gi: int, ci_pid: int, array: Any, count: Any) -> None:
        ci = self.gis[gi]["ci"]
        found = ci is not None and ci[0] == ci_pid
        if found:
            array[0] = gi
        count._obj.value = int(found)

    def nvmlComputeInstanceGetInfo(self, ci: int) -> Any:
        return SimpleNamespace(device=("mig", self.gis[ci]["ci"][1]))

    def nvmlComputeInstanceDestroy(self, ci: int) -> None:
        if self.gis[ci]["ci"][1] in self.busy:
            raise NVMLError(self.NVML_ERROR_IN_USE)
        self.gis[ci]["ci"] = None


def test_the_manager_carves_reuses_and_reaps_through_nvml(tmp_path: Path) -> None:
    nvml = StandIn()
    backend = NvmlMigBackend(nvml)
    assert backend.gpu_uuids() == ["GPU-nvml-0"] and backend.mig_enabled("GPU-nvml-0")
    now = [0.0]
    mgr = MigManager(backend, tmp_path / "mig.json", lambda: now[0], idle_after_s=60)
    g = mgr.ensure("pod-a", "GPU-nvml-0", "3g.20gb", start=4)
    assert isinstance(g, MigGranted) and g.uuid == "MIG-nvml-1"
    assert nvml.gis[1]["start"] == 4 and nvml.gis[1]["ci"] == (2, "MIG-nvml-1")  # CI profile index 2 = 3 slices
    # 1g.10gb: the plain 1-slice compute profile is refused, the REV1 one (index 7) is taken
    h = mgr.ensure("pod-b", "GPU-nvml-0", "1g.10gb", start=0)
    assert isinstance(h, MigGranted) and nvml.gis[2]["ci"] == (7, "MIG-nvml-2")
    listed = [(i.profile, i.start, i.uuid) for i in backend.instances("GPU-nvml-0")]
    assert listed == [("1g.10gb", 0, "MIG-nvml-2"), ("3g.20gb", 4, "MIG-nvml-1")]
    # a process outlives pod-b: NVML's IN_USE keeps the instance
    nvml.busy.add("MIG-nvml-2")
    mgr.release("pod-b")
    now[0] = 100
    assert mgr.reap().kept_in_use == ["GPU-nvml-0 1g.10gb@0"]
    nvml.busy.clear()
    assert mgr.reap().destroyed == ["GPU-nvml-0 1g.10gb@0"] and sorted(nvml.gis) == [1]
    r = mgr.ensure("pod-c", "GPU-nvml-0", "4g.20gb", start=0)
    assert isinstance(r, MigGranted)  # slots 0-3 are free again
    # an occupied placement: NVML's INSUFFICIENT_RESOURCES, by name
    with pytest.raises(MigError) as err:
        backend.create_gpu_instance("GPU-nvml-0", "2g.10gb", 0)
    assert err.value.code == "INSUFFICIENT_RESOURCES"
    with pytest.raises(MigError) as err:
        backend.create_gpu_instance("GPU-nvml-0", "4g.20gb", 4)  # not a placement NVML offers
    assert err.value.code == "INVALID_ARGUMENT"


def test_restart_reads_instances_back_from_nvml(tmp_path: Path) -> None:
    nvml = StandIn()
    backend = NvmlMigBackend(nvml)
    first = MigManager(backend, tmp_path / "mig.json", lambda: 0.0)
    g = first.ensure("pod-a", "GPU-nvml-0", "2g.10gb", start=2)
    assert isinstance(g, MigGranted)
    (tmp_path / "mig.json").unlink()  # checkpoint lost: NVML and the pod's record still tell
    again = MigManager(NvmlMigBackend(nvml), tmp_path / "mig.json", lambda: 0.0)
    report = again.reconcile({"pod-a": g.uuid})
    assert report.adopted == ["GPU-nvml-0 2g.10gb@2"]
    assert again.holder("pod-a") is not None and again.holder("pod-a").uuid == g.uuid  # type: ignore[union-attr]
