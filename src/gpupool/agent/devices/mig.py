"""The agent's MIG manager: carves the GPU instance a pod was planned on, hands out its MIG UUID, and
destroys instances that no pod has used for a while so that larger profiles fit again.

Steps for a pod (NVML call sequence of reference §4.7): an idle instance of the profile is reused if
there is one; otherwise idle instances in the way are destroyed (compute instance, then GPU instance),
a GPU instance is created at the planned start (`CreateGpuInstanceWithPlacement`), then its full-size
compute instance, whose device handle gives the `MIG-...` UUID.

Crash safety: every step is written to a checkpoint file (atomic replace) *before* it is taken, so a
restart knows what may have half-happened. `reconcile` then compares NVML's instances with the
checkpoint and with the pods on the node: half-made instances are finished (pod still there) or removed
(pod gone), half-destroyed ones are destroyed, instances nobody recorded are adopted (owned by the pod
whose record names their UUID, else idle).

Never touching an instance in use: only instances without a pod are destroyed, and only after
`idle_after_s`; NVML's IN_USE (processes still running) keeps the instance and is reported. MIG mode is
switched only when the node allows it (label) and the GPU runs nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol, cast

from gpupool.agent.devices.discovery import DiscoveryBackend
from gpupool.core.geometry import Geometry, geometry
from gpupool.core.mig import PlacedInstance, mig_model
from gpupool.core.mig_placement import MigGPU, MigInstance, observed_demand

# Node label an administrator sets to let the agent switch MIG mode on idle GPUs of that node.
MODE_SWITCH_LABEL = "gpupool.io/mig-mode-switch"
MODE_SWITCH_ALLOWED = "allowed"
CHECKPOINT_VERSION = 1
PRIOR = 0.1  # share of the local planning demand spread evenly over all profiles


class MigError(Exception):
    """An NVML answer, by name: IN_USE, INSUFFICIENT_RESOURCES, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True, slots=True)
class BackendInstance:
    gi_id: int
    profile: str
    start: int
    uuid: str | None  # the compute instance's MIG device UUID; None while it has no compute instance


class MigBackend(Protocol):
    """What the manager needs from the driver (NVML, or gpupool.agent.devices.fake_mig)."""

    def gpu_uuids(self) -> list[str]: ...
    def model(self, gpu: str) -> str: ...
    def mig_enabled(self, gpu: str) -> bool: ...
    def busy(self, gpu: str) -> bool: ...
    def set_mig_mode(self, gpu: str, enabled: bool) -> None: ...
    def instances(self, gpu: str) -> list[BackendInstance]: ...
    def create_gpu_instance(self, gpu: str, profile: str, start: int) -> int: ...
    def create_compute_instance(self, gpu: str, gi_id: int) -> str: ...
    def destroy_compute_instance(self, gpu: str, gi_id: int) -> None: ...
    def destroy_gpu_instance(self, gpu: str, gi_id: int) -> None: ...


State = Literal["creating", "ready", "destroying"]


@dataclass(slots=True)
class Entry:
    """One instance the manager knows of, as written in the checkpoint."""

    gpu: str
    profile: str
    start: int
    state: State
    gi: int | None = None
    uuid: str | None = None
    pod: str | None = None  # UID of the pod holding it; None = idle
    idle_since: float | None = None


@dataclass(frozen=True, slots=True)
class MigGranted:
    uuid: str
    gpu: str
    profile: str
    start: int
    created: bool  # False when an idle instance was reused


@dataclass(frozen=True, slots=True)
class MigRefused:
    reason: str


@dataclass(slots=True)
class MigReport:
    """What a reap or a reconcile did, for logs and the inventory."""

    destroyed: list[str] = field(default_factory=list)
    kept_in_use: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # a pod's instance that NVML no longer has (GPU reset)


class CheckpointError(RuntimeError):
    pass


def _where(e: Entry) -> str:
    return f"{e.gpu} {e.profile}@{e.start}"


class MigManager:
    def __init__(self, backend: MigBackend, checkpoint: Path, clock: Callable[[], float],
                 idle_after_s: float = 600.0, allow_mode_switch: bool = False) -> None:
        self.backend = backend
        self.path = checkpoint
        self.clock = clock
        self.idle_after_s = idle_after_s
        self.allow_mode_switch = allow_mode_switch
        self.entries: list[Entry] = self._load()
        self._asked: list[str] = []  # profiles asked for on this node: the demand local planning keeps room for

    # --- checkpoint ------------------------------------------------------------------------------
    def _load(self) -> list[Entry]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        except OSError as e:
            raise CheckpointError(f"MIG checkpoint {self.path}: cannot read: {e}") from None
        try:
            doc = json.loads(text)
            if doc.get("version") != CHECKPOINT_VERSION:
                raise ValueError(f"version {doc.get('version')!r}, expected {CHECKPOINT_VERSION}")
            return [Entry(**item) for item in doc["instances"]]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"MIG checkpoint {self.path}: unreadable ({e}); move it away to start "
                                  "afresh (reconcile then adopts NVML's instances)") from None

    def _save(self) -> None:
        """Write-then-rename, so a crash leaves either the old or the new checkpoint, never half of one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"version": CHECKPOINT_VERSION, "instances": [asdict(e) for e in self.entries]}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".mig-checkpoint-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    # --- views -----------------------------------------------------------------------------------
    def view(self, gpu: str) -> MigGPU:
        """The GPU as the scheduler's placement sees it (instances used or idle)."""
        return MigGPU(self._model(gpu).name, tuple(sorted(
            MigInstance(e.profile, e.start, e.pod is not None) for e in self.entries if e.gpu == gpu)))

    def holder(self, pod: str) -> Entry | None:
        return next((e for e in self.entries if e.pod == pod and e.state == "ready"), None)

    def _model(self, gpu: str) -> Geometry:
        """The card's partition geometry (gpupool.core.geometry decides which: MIG, AMD modes, Ascend vNPUs)."""
        model = geometry(self.backend.model(gpu))
        if model is None:
            raise MigError("NOT_SUPPORTED", f"{gpu}: model {self.backend.model(gpu)!r} has no partition geometry")
        return model

    # --- a pod's instance ------------------------------------------------------------------------
    def ensure(self, pod: str, gpu: str, profile: str, start: int | None = None) -> MigGranted | MigRefused:
        """The MIG device for `pod` on `gpu`: its instance if it has one (Allocate is retried), an idle
        instance of `profile` (at `start` when the scheduler planned one), or a new one carved there."""
        held = self.holder(pod)
        if held is not None and held.uuid is not None:
            return MigGranted(held.uuid, held.gpu, held.profile, held.start, created=False)
        if any(e.pod == pod for e in self.entries):  # half-made before a crash: reconcile decides, not a 2nd one
            return MigRefused(f"pod {pod}: its instance was being made when the agent stopped; reconcile first")
        if gpu not in self.backend.gpu_uuids():
            return MigRefused(f"pod {pod}: no GPU {gpu} on this node")
        if not self.backend.mig_enabled(gpu):
            return MigRefused(f"pod {pod}: GPU {gpu} is not in MIG mode")
        model = self._model(gpu)
        if not model.has(profile):
            return MigRefused(f"pod {pod}: profile {profile} does not exist on {model.name}")
        self._asked.append(profile)
        if model.one_mode:  # partitions of the card's mode released by a reap stay on the card: take them back
            self._adopt_siblings(gpu)
        for e in self.entries:
            if (e.gpu == gpu and e.profile == profile and e.pod is None and e.state == "ready"
                    and e.uuid is not None and start in (None, e.start)):
                e.pod, e.idle_since = pod, None
                self._save()
                return MigGranted(e.uuid, gpu, profile, e.start, created=False)
        plan = self._plan(gpu, model, profile, [start] if start is not None else list(model.starts(profile)))
        if isinstance(plan, MigRefused):
            return MigRefused(f"pod {pod}: {plan.reason}")
        chosen, in_the_way = plan
        for e in in_the_way:
            report = MigReport()
            if not self._destroy(e, report):
                return MigRefused(f"pod {pod}: idle instance {_where(e)} is still in use (NVML IN_USE); "
                                  "cannot carve the new one there yet")
        return self._create(pod, gpu, profile, chosen)

    def _plan(self, gpu: str, model: Geometry, profile: str, starts: list[int]) -> tuple[int, list[Entry]] | MigRefused:
        """The start to carve at, and the idle instances to destroy first. Starts that need fewer
        destructions win, then those that leave the node's asked-for profiles most room."""
        mine = [e for e in self.entries if e.gpu == gpu]
        known = {(e.profile, e.start) for e in mine}
        foreign = [PlacedInstance(i.profile, i.start) for i in self.backend.instances(gpu)
                   if (i.profile, i.start) not in known]  # made outside gpupool: never destroyed here
        # what this node was asked for, plus a little of every profile so that one not asked yet still counts
        seen = observed_demand(self._asked)
        names = model.profiles
        demand = {q: PRIOR / len(names) + (1 - PRIOR) * seen.get(q, 0.0) for q in names}
        best: tuple[tuple[int, float, int], int, list[Entry]] | None = None
        for s in starts:
            overlap = [e for e in mine if model.in_the_way(profile, s, e.profile, e.start)]
            if any(e.pod is not None or e.state != "ready" for e in overlap):
                continue
            keep = [PlacedInstance(e.profile, e.start) for e in mine if e not in overlap]
            after = [*keep, *foreign, PlacedInstance(profile, s)]
            if model.problems(after):
                continue
            used = [MigInstance(i.profile, i.start, True) for i in after]
            key = (len(overlap), model.fragmentation(used, demand), s)
            if best is None or key < best[0]:
                best = (key, s, overlap)
        if best is None:
            return MigRefused(f"no free slices for {profile} on {gpu} at start(s) {starts} "
                              "(instances in use, or not made by gpupool, are in the way)")
        return best[1], best[2]

    def _create(self, pod: str, gpu: str, profile: str, start: int) -> MigGranted | MigRefused:
        entry = Entry(gpu, profile, start, "creating", pod=pod)
        self.entries.append(entry)
        self._save()  # intent first: a crash from here on is finished or undone by reconcile
        try:
            entry.gi = self.backend.create_gpu_instance(gpu, profile, start)
            self._save()
            entry.uuid = self.backend.create_compute_instance(gpu, entry.gi)
        except MigError as e:
            if entry.gi is not None:  # no compute instance yet, so nobody can be using it
                try:
                    self.backend.destroy_gpu_instance(gpu, entry.gi)
                except MigError:
                    entry.state, entry.pod, entry.idle_since = "ready", None, self.clock()
                    self._save()
                    return MigRefused(f"pod {pod}: creating {profile}@{start} on {gpu} failed: {e}")
            self.entries.remove(entry)
            self._save()
            return MigRefused(f"pod {pod}: creating {profile}@{start} on {gpu} failed: {e}")
        entry.state = "ready"
        if self._model(gpu).one_mode:
            self._adopt_siblings(gpu)
        self._save()
        return MigGranted(entry.uuid, gpu, profile, start, created=True)

    def _adopt_siblings(self, gpu: str) -> None:
        """An AMD card's mode change made every partition of the mode, and destroying one only releases it
        (the card leaves the mode when all are released): those the manager does not know are recorded idle
        (reused by the next claim of the mode, reaped like any idle instance) rather than left unknown, where
        they would stand in the way of the next carving."""
        known = {(e.profile, e.start) for e in self.entries if e.gpu == gpu}
        now = self.clock()
        for inst in self.backend.instances(gpu):
            if (inst.profile, inst.start) not in known:
                self.entries.append(Entry(gpu, inst.profile, inst.start, "ready", inst.gi_id, inst.uuid, None, now))

    def release(self, pod: str) -> None:
        """The pod is gone: its instance becomes idle from now (kept for reuse until reaped)."""
        changed = False
        for e in self.entries:
            if e.pod == pod:
                e.pod, e.idle_since = None, self.clock()
                changed = True
        if changed:
            self._save()

    # --- tearing down ----------------------------------------------------------------------------
    def _destroy(self, e: Entry, report: MigReport) -> bool:
        """Destroy an idle instance (compute instance, then GPU instance). False when NVML says IN_USE."""
        assert e.pod is None, "an instance held by a pod is never destroyed"
        e.state = "destroying"
        self._save()
        try:
            live = {i.gi_id: i for i in self.backend.instances(e.gpu)}
            if e.gi is not None and e.gi in live:
                if live[e.gi].uuid is not None:
                    self.backend.destroy_compute_instance(e.gpu, e.gi)
                self.backend.destroy_gpu_instance(e.gpu, e.gi)
        except MigError as err:
            if err.code != "IN_USE":
                raise
            e.state = "ready"
            self._save()
            report.kept_in_use.append(_where(e))
            return False
        self.entries.remove(e)
        self._save()
        report.destroyed.append(_where(e))
        return True

    def reap(self) -> MigReport:
        """Destroy instances idle for at least `idle_after_s`; keep (and report) those NVML says are in use."""
        report = MigReport()
        now = self.clock()
        for e in list(self.entries):
            if (e.pod is None and e.state == "ready" and e.idle_since is not None
                    and now - e.idle_since >= self.idle_after_s):
                self._destroy(e, report)
        return report

    # --- restart ---------------------------------------------------------------------------------
    def reconcile(self, pods: Mapping[str, str | None]) -> MigReport:
        """Bring checkpoint and NVML into agreement after a (re)start. `pods`: UID of every pod on this
        node -> the MIG UUID its record names (None if it names none)."""
        report = MigReport()
        now = self.clock()
        by_uuid = {uuid: uid for uid, uuid in pods.items() if uuid}
        for gpu in self.backend.gpu_uuids():
            if not self.backend.mig_enabled(gpu):
                continue
            nvml = {(i.profile, i.start): i for i in self.backend.instances(gpu)}
            for e in [e for e in self.entries if e.gpu == gpu]:
                inst = nvml.pop((e.profile, e.start), None)
                self._reconcile_entry(e, inst, pods, now, report)
            for inst in nvml.values():  # instances nobody recorded: made by hand, or before a checkpoint
                owner = by_uuid.get(inst.uuid) if inst.uuid else None
                self.entries.append(Entry(gpu, inst.profile, inst.start, "ready", inst.gi_id, inst.uuid, owner,
                                          None if owner else now))
                report.adopted.append(f"{gpu} {inst.profile}@{inst.start}")
        for e in [e for e in self.entries if e.gpu not in self.backend.gpu_uuids()]:
            self.entries.remove(e)
        # a pod whose record names an instance's UUID owns it, whatever the checkpoint said
        for e in self.entries:
            if e.uuid in by_uuid and e.pod is None:
                e.pod, e.idle_since = by_uuid[e.uuid], None
        self._save()
        return report

    def _reconcile_entry(self, e: Entry, inst: BackendInstance | None, pods: Mapping[str, str | None], now: float,
                         report: MigReport) -> None:
        live = e.pod is not None and e.pod in pods
        if inst is None:
            if e.state == "ready" and live:
                report.lost.append(f"{_where(e)} of pod {e.pod}")
            self.entries.remove(e)
            return
        e.gi = inst.gi_id
        if e.state == "destroying":
            e.pod = None
            e.uuid = inst.uuid
            self._destroy(e, report)
            return
        if inst.uuid is None and live:  # crashed between the GPU instance and its compute instance
            e.uuid = self.backend.create_compute_instance(e.gpu, inst.gi_id)
            e.state = "ready"
            report.finished.append(_where(e))
            return
        e.uuid, e.state = inst.uuid, "ready"
        if not live:
            e.pod = None
            e.idle_since = e.idle_since if e.idle_since is not None else now
            if inst.uuid is None:  # a half-made instance nobody waits for: nobody can be using it
                self._destroy(e, report)

    # --- MIG mode ----------------------------------------------------------------------------------
    def enable_mig(self, gpu: str) -> MigRefused | None:
        """Switch `gpu` to MIG mode, only where the node's label allows it and the GPU runs nothing."""
        if self.backend.mig_enabled(gpu):
            return None
        if not self.allow_mode_switch:
            return MigRefused(f"{gpu}: MIG mode is off and node label {MODE_SWITCH_LABEL}={MODE_SWITCH_ALLOWED} "
                              "is not set, so gpupool does not switch it")
        if self.backend.busy(gpu):
            return MigRefused(f"{gpu}: processes are running; MIG mode is switched only on an idle GPU")
        try:
            self.backend.set_mig_mode(gpu, True)
        except MigError as e:
            return MigRefused(f"{gpu}: switching MIG mode failed: {e}")
        return None

    def switch_idle_gpus(self) -> tuple[list[str], list[MigRefused]]:
        """Where the node's label allows it, every GPU of a MIG-capable model not yet in MIG mode that runs
        nothing is switched to MIG mode (enable_mig); the busy ones are refused with the reason and tried
        again on the next pass. Nothing is ever switched off MIG mode. (switched, refused)"""
        switched: list[str] = []
        refused: list[MigRefused] = []
        if not self.allow_mode_switch:
            return switched, refused
        for gpu in self.backend.gpu_uuids():
            if self.backend.mig_enabled(gpu) or mig_model(self.backend.model(gpu)) is None:
                continue
            why = self.enable_mig(gpu)
            if why is None:
                switched.append(gpu)
            else:
                refused.append(why)
        return switched, refused


def agent_mig_manager(source: object, directory: Path, idle_after_s: float,
                      clock: Callable[[], float] = time.time,
                      allow_mode_switch: bool = False) -> MigManager | None:
    """The agent's MIG manager, when its discovery backend (`source.mig_backend()`) has a GPU in MIG mode,
    or when the node's label allows switching (`allow_mode_switch`) and a GPU's model has MIG geometry;
    checkpoint `<directory>/mig.json`. On an AMD or Ascend node the manager carves that vendor's partitions,
    when a card has partitions or the label allows partitioning (gpupool.agent.devices.partitions).
    Wall-clock time: an instance's idle time counts across agent restarts.
    None: isolation mig is refused on this node."""
    make = getattr(source, "mig_backend", None)
    driver: MigBackend | None = make() if make is not None else None
    if driver is None:
        # an AMD or Ascend node: the same manager carves the vendor's partitions (gpupool.agent.devices.partitions)
        from gpupool.agent.devices.partitions import PartitionMigBackend, vendor_partitions

        found = vendor_partitions(source)
        if found is None:
            return None
        driver = PartitionMigBackend(cast(DiscoveryBackend, source), found, partition_mode=allow_mode_switch)
        if not any(driver.mig_enabled(g) for g in driver.gpu_uuids()):
            return None
        return MigManager(driver, directory / "mig.json", clock, idle_after_s=idle_after_s)
    gpus = driver.gpu_uuids()
    if not any(driver.mig_enabled(g) for g in gpus) and not (
            allow_mode_switch and any(mig_model(driver.model(g)) is not None for g in gpus)):
        return None
    return MigManager(driver, directory / "mig.json", clock, idle_after_s=idle_after_s,
                      allow_mode_switch=allow_mode_switch)


def mig_inventory_fields(manager: MigManager) -> dict[str, dict[str, object]]:
    """Per MIG-mode GPU, what the node inventory shows (gpupool.api.inventory GPUDoc): `mig: true` and its
    instances (profile, start, whether a pod holds it, MIG UUID once its compute instance exists). An
    instance being made or destroyed counts as used: its slices are not free."""
    out: dict[str, dict[str, object]] = {}
    for gpu in manager.backend.gpu_uuids():
        if not manager.backend.mig_enabled(gpu):
            continue
        instances = [
            {"profile": e.profile, "start": e.start, "used": e.pod is not None or e.state != "ready",
             "uuid": e.uuid or ""}
            for e in sorted(manager.entries, key=lambda e: e.start) if e.gpu == gpu
        ]
        out[gpu] = {"mig": True, "mig_instances": instances}
    return out


def mode_switch_allowed(labels: Mapping[str, str]) -> bool:
    return labels.get(MODE_SWITCH_LABEL) == MODE_SWITCH_ALLOWED
