"""A fake MIG driver: GPUs in MIG mode with GPU instances and compute instances, the same geometry as
gpupool.core.mig and the NVML answers the MIG manager must handle, so that the manager runs without a GPU.

Modelled NVML behaviour (reference §1.1, §2.4, §4.7):
- creating a GPU instance at a placement that is not allowed for the profile: INVALID_ARGUMENT;
  at one that overlaps an existing instance, or beyond the profile's count: INSUFFICIENT_RESOURCES;
- destroying a GPU instance that still has a compute instance, or a compute instance with processes
  running on it: IN_USE;
- switching MIG mode while any instance exists or any process runs: IN_USE;
- instances do not survive `reset()` (a GPU reset or reboot).

Tests start and stop "processes" on a MIG device to make it busy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.agent.devices.mig import BackendInstance, MigError
from gpupool.core.mig import PlacedInstance, layout_problems, mig_model


@dataclass(slots=True)
class _GI:
    gi_id: int
    profile: str
    start: int
    ci_uuid: str | None = None


@dataclass(slots=True)
class _FakeGPU:
    uuid: str
    model: str
    mig_enabled: bool
    instances: dict[int, _GI] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)  # MIG UUID (or GPU UUID) -> process count
    next_gi: int = 1


class FakeMigDriver:
    """In-memory MIG state of a node's GPUs; implements the manager's MigBackend protocol."""

    def __init__(self, gpus: dict[str, str], mig_enabled: bool = True) -> None:
        """`gpus`: GPU UUID -> model name (a model gpupool.core.mig knows)."""
        self._gpus: dict[str, _FakeGPU] = {}
        for uuid, model in gpus.items():
            if mig_model(model) is None:
                raise ValueError(f"fake GPU {uuid}: model {model!r} has no MIG geometry")
            self._gpus[uuid] = _FakeGPU(uuid, model, mig_enabled)
        self._uuids = 0
        self.destroyed: list[tuple[str, str, int]] = []  # (GPU, profile, start) of each destroyed instance
        self.calls: list[str] = []

    # --- what tests use to act on the "hardware" -------------------------------------------------
    def start_process(self, device_uuid: str) -> None:
        gpu = self._owner(device_uuid)
        gpu.processes[device_uuid] = gpu.processes.get(device_uuid, 0) + 1

    def stop_process(self, device_uuid: str) -> None:
        gpu = self._owner(device_uuid)
        left = gpu.processes.get(device_uuid, 0) - 1
        if left <= 0:
            gpu.processes.pop(device_uuid, None)
        else:
            gpu.processes[device_uuid] = left

    def clear_processes(self, device_uuid: str) -> None:
        self._owner(device_uuid).processes.pop(device_uuid, None)

    def reset(self, gpu: str) -> None:
        """A GPU reset: every instance is gone (they are not persistent)."""
        self._gpu(gpu).instances.clear()
        self._gpu(gpu).processes.clear()

    def layout(self, gpu: str) -> list[PlacedInstance]:
        return sorted(PlacedInstance(gi.profile, gi.start) for gi in self._gpu(gpu).instances.values())

    # --- MigBackend ----------------------------------------------------------------------------
    def gpu_uuids(self) -> list[str]:
        return sorted(self._gpus)

    def model(self, gpu: str) -> str:
        return self._gpu(gpu).model

    def mig_enabled(self, gpu: str) -> bool:
        return self._gpu(gpu).mig_enabled

    def busy(self, gpu: str) -> bool:
        return bool(self._gpu(gpu).processes)

    def set_mig_mode(self, gpu: str, enabled: bool) -> None:
        g = self._gpu(gpu)
        self.calls.append(f"set_mig_mode {gpu} {enabled}")
        if g.instances or g.processes:
            raise MigError("IN_USE", f"{gpu}: MIG mode can only change on an idle GPU without instances")
        g.mig_enabled = enabled

    def instances(self, gpu: str) -> list[BackendInstance]:
        g = self._gpu(gpu)
        return [BackendInstance(gi.gi_id, gi.profile, gi.start, gi.ci_uuid) for gi in sorted(
            g.instances.values(), key=lambda x: x.start)]

    def create_gpu_instance(self, gpu: str, profile: str, start: int) -> int:
        g = self._gpu(gpu)
        self.calls.append(f"create_gi {gpu} {profile}@{start}")
        if not g.mig_enabled:
            raise MigError("NOT_SUPPORTED", f"{gpu}: MIG mode is off")
        model = mig_model(g.model)
        assert model is not None
        p = model.profile(profile)
        if p is None or start not in p.starts:
            raise MigError("INVALID_ARGUMENT", f"{gpu}: no placement {profile}@{start}")
        layout = [PlacedInstance(gi.profile, gi.start) for gi in g.instances.values()]
        if layout_problems(model, [*layout, PlacedInstance(profile, start)]):
            raise MigError("INSUFFICIENT_RESOURCES", f"{gpu}: {profile}@{start} overlaps or exceeds a count")
        gi_id = g.next_gi
        g.next_gi += 1
        g.instances[gi_id] = _GI(gi_id, profile, start)
        return gi_id

    def create_compute_instance(self, gpu: str, gi_id: int) -> str:
        g = self._gpu(gpu)
        self.calls.append(f"create_ci {gpu} {gi_id}")
        gi = g.instances.get(gi_id)
        if gi is None:
            raise MigError("NOT_FOUND", f"{gpu}: no GPU instance {gi_id}")
        if gi.ci_uuid is not None:
            raise MigError("INSUFFICIENT_RESOURCES", f"{gpu}: GPU instance {gi_id} already has its compute instance")
        self._uuids += 1
        gi.ci_uuid = f"MIG-fake-{gpu[-8:]}-{self._uuids:04d}"
        return gi.ci_uuid

    def destroy_compute_instance(self, gpu: str, gi_id: int) -> None:
        g = self._gpu(gpu)
        self.calls.append(f"destroy_ci {gpu} {gi_id}")
        gi = g.instances.get(gi_id)
        if gi is None or gi.ci_uuid is None:
            raise MigError("NOT_FOUND", f"{gpu}: GPU instance {gi_id} has no compute instance")
        if g.processes.get(gi.ci_uuid):
            raise MigError("IN_USE", f"{gpu}: processes run on {gi.ci_uuid}")
        gi.ci_uuid = None

    def destroy_gpu_instance(self, gpu: str, gi_id: int) -> None:
        g = self._gpu(gpu)
        self.calls.append(f"destroy_gi {gpu} {gi_id}")
        gi = g.instances.get(gi_id)
        if gi is None:
            raise MigError("NOT_FOUND", f"{gpu}: no GPU instance {gi_id}")
        if gi.ci_uuid is not None:
            raise MigError("IN_USE", f"{gpu}: GPU instance {gi_id} still has a compute instance")
        del g.instances[gi_id]
        self.destroyed.append((gpu, gi.profile, gi.start))

    # --- helpers -------------------------------------------------------------------------------
    def _gpu(self, uuid: str) -> _FakeGPU:
        g = self._gpus.get(uuid)
        if g is None:
            raise MigError("NOT_FOUND", f"no GPU {uuid}")
        return g

    def _owner(self, device_uuid: str) -> _FakeGPU:
        for g in self._gpus.values():
            if device_uuid == g.uuid or any(gi.ci_uuid == device_uuid for gi in g.instances.values()):
                return g
        raise MigError("NOT_FOUND", f"no device {device_uuid}")
