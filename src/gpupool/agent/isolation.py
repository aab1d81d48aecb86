"""Isolation modes as strategies on the node: `none`, `hook`, `mps` and `mig` are one object each, with the
same small protocol, used by Allocate (gpupool.agent.plugin), the host-side watchdog
(gpupool.agent.watchdog) and the inventory (gpupool.agent.service):

- `check(request)`: pure. Can this share be served in this mode at all (one MPS GPU per container, a valid
  cores mode and container name for the hook, ...)? A refusal names the pod.
- `prepare(request)`: the node-side work before the answer, which may refuse: the MIG instance is carved,
  the hook directory created, the MPS daemon of the GPU must answer. Runs under the Allocate lock.
- `grant(request, prepared)`: pure. The mode's part of the container's answer (environment, mounts and the
  devices the container sees).
- `release(pods, node)`: what the node holds for pods that no longer need it, given the pods bound to the
  node (each mode's own rule: a MIG instance goes when its pod finishes or is being deleted, a hook
  directory when its pod has left the node, since a terminating container may still be running).
- `second_line`: whether the watchdog holds this mode's containers to their grant from the host (the hook
  only: MIG is hardware isolation, MPS limits are enforced by its server, `none` promises nothing).
- `inventory_fields()`: what the node inventory shows per GPU about this mode (MPS daemon, MIG instances).

A new mode is one new class here and one line in `node_strategies`; nothing else branches on the name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices import DeviceInfo
from gpupool.agent.hookdir import (
    ANN_CORES_MODE,
    CONTAINER_HOOK_DIR,
    CONTAINER_LIBRARY,
    CONTAINER_LIMITS_DIR,
    CONTAINER_PRELOAD,
    CORES_MODES,
    HookLimits,
    HookPod,
    accounting_dir,
    claim_dir,
    container_dir,
    hook_paths,
    limits_dir,
    prepare_hook_pod,
    prepare_pod,
    remove_gone,
    valid_container,
    valid_uid,
)
from gpupool.agent.identify import is_alive_on
from gpupool.agent.mig import MigError, MigManager, MigRefused, mig_inventory_fields
from gpupool.agent.mps import MpsSupervisor, inventory_fields
from gpupool.api.allocation import AllocationDoc, GrantDoc
from gpupool.api.names import ANN_ALLOCATION

# The Allocate step after which the MIG instance exists (before the checkpoint; tests inject crashes there).
STEP_CARVED = "carved"
ISOLATION_MODES = ("none", "hook", "mps", "mig")


@dataclass(frozen=True, slots=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str
    retry: bool = False  # True: the node may serve it shortly (a daemon restarting, MIG not reconciled yet)


@dataclass(frozen=True, slots=True)
class GrantRequest:
    """One container's Allocate, as every strategy sees it."""

    doc: AllocationDoc
    container: str
    gpus: tuple[GrantDoc, ...]  # the container's GPUs, in the order it sees them
    devices: Mapping[str, DeviceInfo]
    config: AgentConfig
    pod_label: str
    cores_mode: str = "hard"
    gpu_containers: int = 1  # how many GPU containers the pod has
    pods_on_node: Sequence[Mapping[str, Any]] = ()
    # A DRA claim's share (gpupool.agent.dra): doc.pod_uid is the claim's UID, and the hook directory is
    # the claim's own (claims/<UID>), which the pods' clean-up never removes.
    claim: bool = False

    def shared(self) -> list[GrantDoc]:
        """The GPUs of which the container gets less than the whole card."""
        return [g for g in self.gpus if g.cores < 100 or g.memory_mib < self.devices[g.uuid].memory_mib]


@dataclass(frozen=True, slots=True)
class Prepared:
    """What `prepare` made on the node for the answer."""

    visible: Mapping[str, str] = field(default_factory=dict)  # GPU UUID -> the device to show instead (MIG)
    step: str | None = None  # the Allocate step that now lies behind (crash injection in tests)


@dataclass(frozen=True, slots=True)
class ModeGrant:
    """A strategy's part of the answer; the common part (limits, visible devices, CDI) is added around it."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[MountSpec] = field(default_factory=list)
    visible: tuple[str, ...] = ()  # the device IDs the container sees, in the order of its GPUs
    hook_pod: HookPod | None = None
    mps_gpu: str | None = None


def _num(value: float) -> str:
    return f"{value:g}"


class Isolation(Protocol):
    name: str
    second_line: bool

    def check(self, request: GrantRequest) -> Refused | None: ...

    async def prepare(self, request: GrantRequest) -> Prepared | Refused: ...

    def grant(self, request: GrantRequest, prepared: Prepared) -> ModeGrant | Refused: ...

    async def release(self, pods: Sequence[Mapping[str, Any]], node: str, claims: Collection[str] = ()) -> None:
        """Let go of what pods no longer on the node (`pods`: those that are) and no prepared DRA claim
        (`claims`: their UIDs) hold."""

    def inventory_fields(self) -> dict[str, dict[str, Any]]: ...


def _plain(request: GrantRequest) -> tuple[str, ...]:
    return tuple(g.uuid for g in request.gpus)


class NoIsolation:
    """`none`: the GPUs and their limits as environment, nothing enforced (whole GPUs, trusted tenants)."""

    name = "none"
    second_line = False

    def check(self, request: GrantRequest) -> Refused | None:
        return None

    async def prepare(self, request: GrantRequest) -> Prepared | Refused:
        return Prepared()

    def grant(self, request: GrantRequest, prepared: Prepared) -> ModeGrant | Refused:
        return ModeGrant(visible=_plain(request))

    async def release(self, pods: Sequence[Mapping[str, Any]], node: str, claims: Collection[str] = ()) -> None:
        return None

    def inventory_fields(self) -> dict[str, dict[str, Any]]:
        return {}


class HookIsolation:
    """`hook`: the interception library and the preload list (read-only), the container's limits file
    (limits.v1, written by the agent before the answer and mounted read-only: the library takes its caps
    from there, never from what the tenant can change) and the container's own accounting directory
    (read-write; one per GPU container: each is held to its own share)."""

    name = "hook"
    second_line = True  # interception misses static binaries and direct ioctls: the watchdog backs it

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    def check(self, request: GrantRequest) -> Refused | None:
        label = request.pod_label
        if request.cores_mode not in CORES_MODES:
            modes = ", ".join(CORES_MODES)
            return Refused(f"pod {label}: {ANN_CORES_MODE}={request.cores_mode!r} is not one of {modes}")
        if not valid_uid(request.doc.pod_uid):
            return Refused(f"pod {label}: its allocation names pod UID {request.doc.pod_uid!r}, which is not a UID")
        if not valid_container(request.container):
            return Refused(f"pod {label}: container name {request.container!r} is not an RFC 1123 label")
        return None

    def _hook_pod(self, request: GrantRequest) -> HookPod:
        gpus = _plain(request)
        limits = HookLimits(
            memory_mib=tuple(g.memory_mib for g in request.gpus),
            cores=tuple(g.cores for g in request.gpus),
            mode=request.cores_mode,
            gpus=gpus,
            accounting_dir=CONTAINER_HOOK_DIR,
            oversub_mib=tuple(g.oversub_mib or 0 for g in request.gpus) if any(g.oversub_mib for g in request.gpus)
            else (),
        )
        root, uid = request.config.hook_root, request.doc.pod_uid
        directory = claim_dir(root, uid) if request.claim else container_dir(root, uid, request.container)
        return HookPod(uid, request.pod_label, request.container, gpus, directory, limits)

    async def prepare(self, request: GrantRequest) -> Prepared | Refused:
        # the container's directories and limits file must exist before kubelet mounts them
        try:
            if request.claim:
                await asyncio.to_thread(prepare_pod, self._hook_pod(request))
            else:
                await asyncio.to_thread(prepare_hook_pod, request.config.hook_root, self._hook_pod(request),
                                        request.pods_on_node)
        except OSError as e:
            return Refused(f"cannot prepare the hook directory of pod {request.pod_label}: {e}", retry=True)
        except ValueError as e:  # limits the file cannot hold (too many GPUs for one container, say)
            return Refused(f"pod {request.pod_label}: its limits cannot be written for the library: {e}")
        return Prepared()

    def grant(self, request: GrantRequest, prepared: Prepared) -> ModeGrant | Refused:
        paths = hook_paths(request.config.hook_root)
        hook_pod = self._hook_pod(request)
        return ModeGrant(
            envs={"GPUPOOL_HOOK_DIR": CONTAINER_HOOK_DIR, "GPUPOOL_CORES_MODE": request.cores_mode},
            mounts=[
                MountSpec(CONTAINER_LIBRARY, str(paths.library), read_only=True),
                MountSpec(CONTAINER_PRELOAD, str(paths.preload), read_only=True),
                # siblings on the host: nothing the container may write lies above the limits file
                MountSpec(CONTAINER_LIMITS_DIR, str(limits_dir(hook_pod.dir)), read_only=True),
                MountSpec(CONTAINER_HOOK_DIR, str(accounting_dir(hook_pod.dir))),
            ],
            visible=_plain(request),
            hook_pod=hook_pod,
        )

    async def release(self, pods: Sequence[Mapping[str, Any]], node: str, claims: Collection[str] = ()) -> None:
        # the rule of prepare_hook_pod: a directory stays while its pod is on the node in any phase
        listed = {str((p.get("metadata") or {}).get("uid")) for p in pods}
        await asyncio.to_thread(remove_gone, self.config.hook_root, listed)

    def inventory_fields(self) -> dict[str, dict[str, Any]]:
        return {}


class MpsIsolation:
    """`mps`: on a shared GPU, the MPS client limits and the pipe directory of the GPU's daemon (one daemon
    per GPU, run by the agent: without one answering, the limits would be handed out and not apply)."""

    name = "mps"
    second_line = False  # the MPS server enforces the pinned memory limit; NVML lists the server, not clients

    def __init__(self, config: AgentConfig, supervisor: MpsSupervisor | None) -> None:
        self.config = config
        self.supervisor = supervisor

    def check(self, request: GrantRequest) -> Refused | None:
        if request.shared() and len(request.gpus) != 1:
            return Refused(
                f"pod {request.pod_label}: MPS sharing serves one GPU per container (one MPS daemon per GPU), "
                f"but {len(request.gpus)} shared GPUs were granted to container {request.container}"
            )
        return None

    async def prepare(self, request: GrantRequest) -> Prepared | Refused:
        if not request.shared():
            return Prepared()
        gpu = request.gpus[0].uuid
        if self.supervisor is None:
            return Refused(
                f"pod {request.pod_label} asks for isolation mps, but the agent on {self.config.node_name} runs no "
                "MPS daemons (agent setting mps_daemons, or default isolation mps), so its MPS limits would not apply"
            )
        down = self.supervisor.refuses(gpu)
        if down is None:
            return Prepared()
        # a daemon that is down is being restarted (worth a retry); a GPU without one is not
        return Refused(f"pod {request.pod_label} asks for isolation mps: {down}", retry=gpu in self.supervisor.health)

    def grant(self, request: GrantRequest, prepared: Prepared) -> ModeGrant | Refused:
        if not request.shared():
            return ModeGrant(visible=_plain(request))
        g = request.gpus[0]
        directory = request.config.mps_container_dir
        return ModeGrant(
            envs={
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": _num(g.cores),
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={g.memory_mib}M",
                "CUDA_MPS_PIPE_DIRECTORY": directory,
            },
            mounts=[MountSpec(directory, str(request.config.mps_root / g.uuid))],
            visible=_plain(request),
            mps_gpu=g.uuid,
        )

    async def release(self, pods: Sequence[Mapping[str, Any]], node: str, claims: Collection[str] = ()) -> None:
        return None  # an MPS client leaves nothing behind on the node

    def inventory_fields(self) -> dict[str, dict[str, Any]]:
        return dict(inventory_fields(dict(self.supervisor.health))) if self.supervisor is not None else {}


class MigIsolation:
    """`mig`: the container sees the MIG device the MIG manager carved for the pod's planned instance; no
    interception library and no MPS (MIG is hardware isolation)."""

    name = "mig"
    second_line = False

    def __init__(self, config: AgentConfig, manager: MigManager | None, reconciled: Callable[[], bool],
                 changed: Callable[[], None]) -> None:
        self.config = config
        self.manager = manager
        self.reconciled = reconciled  # whether the manager was reconciled with the node's pods since start
        self.changed = changed  # the inventory should be published again (an instance was carved)

    def check(self, request: GrantRequest) -> Refused | None:
        return None  # what is missing is only known when carving (prepare) or answering (grant)

    async def prepare(self, request: GrantRequest) -> Prepared | Refused:
        """Carve the pod's planned instance now (or find the one it already holds when kubelet asks again).
        Done before the checkpoint: a crash after it leaves an instance the pod holds, which the retry gets
        again and the pod's deletion releases."""
        label = request.pod_label
        if self.manager is None:
            return Refused(
                f"pod {label} asks for isolation mig, but the agent on {self.config.node_name} manages no MIG "
                "devices (no GPU of the node is in MIG mode)"
            )
        if request.gpu_containers != 1 or len(request.gpus) != 1:
            return Refused(
                f"pod {label}: isolation mig serves one MIG instance per pod (one GPU container asking for one "
                f"GPU); it has {request.gpu_containers} GPU container(s) and this one was granted "
                f"{len(request.gpus)} GPU(s)"
            )
        g = request.gpus[0]
        if g.mig is None:
            return Refused(f"pod {label}: its {ANN_ALLOCATION} names no MIG instance (profile, start) for GPU {g.uuid}")
        if not self.reconciled():
            return Refused(f"pod {label}: the MIG state of node {self.config.node_name} is not reconciled yet "
                           "(API unreachable at start?); retry", retry=True)
        try:
            got = await asyncio.to_thread(self.manager.ensure, request.doc.pod_uid, g.uuid, g.mig.profile,
                                          g.mig.start)
        except (MigError, OSError) as e:
            return Refused(f"pod {label}: the MIG manager failed on GPU {g.uuid}: {e}", retry=True)
        if isinstance(got, MigRefused):
            return Refused(got.reason)
        self.changed()
        return Prepared(visible={g.uuid: got.uuid}, step=STEP_CARVED)

    def grant(self, request: GrantRequest, prepared: Prepared) -> ModeGrant | Refused:
        missing = [g.uuid for g in request.gpus if g.mig is None or g.uuid not in prepared.visible]
        if missing:
            return Refused(f"pod {request.pod_label}: isolation mig, but no MIG device for GPU(s) {', '.join(missing)}")
        return ModeGrant(
            envs={"GPUPOOL_MIG_PROFILE": ",".join(g.mig.profile for g in request.gpus if g.mig is not None)},
            visible=tuple(prepared.visible[g.uuid] for g in request.gpus),
        )

    async def release(self, pods: Sequence[Mapping[str, Any]], node: str, claims: Collection[str] = ()) -> None:
        """The instances of pods gone, finished or being deleted go back to the pool (idle, destroyed later
        by reap, which keeps an instance NVML reports in use)."""
        manager = self.manager
        if manager is None:
            return
        alive = {str(p["metadata"].get("uid")) for p in pods if is_alive_on(dict(p), node) and p.get("metadata")}
        alive |= set(claims)  # a claim's instance goes back when the claim is unprepared (gpupool.agent.dra)
        for uid in sorted({e.pod for e in manager.entries if e.pod is not None} - alive):
            await asyncio.to_thread(manager.release, uid)

    def inventory_fields(self) -> dict[str, dict[str, Any]]:
        return dict(mig_inventory_fields(self.manager)) if self.manager is not None else {}


def node_strategies(
    config: AgentConfig,
    mps: MpsSupervisor | None = None,
    mig: MigManager | None = None,
    mig_reconciled: Callable[[], bool] = lambda: True,
    changed: Callable[[], None] = lambda: None,
) -> dict[str, Isolation]:
    """The node's strategies by mode name (what a pod's allocation or the agent's default names)."""
    strategies: list[Isolation] = [
        NoIsolation(),
        HookIsolation(config),
        MpsIsolation(config, mps),
        MigIsolation(config, mig, mig_reconciled, changed),
    ]
    return {s.name: s for s in strategies}


def mode_of(doc: AllocationDoc, default: str) -> str:
    """The isolation mode of a pod's allocation: its own, else the agent's default (`isolation`)."""
    return doc.isolation or default


def merged_inventory(strategies: Iterable[Isolation]) -> dict[str, dict[str, Any]]:
    """Per GPU UUID, the inventory fields of every strategy together."""
    out: dict[str, dict[str, Any]] = {}
    for s in strategies:
        for uuid, fields in s.inventory_fields().items():
            out.setdefault(uuid, {}).update(fields)
    return out
