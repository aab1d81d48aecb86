"""Isolation modes as strategies on the node: `none`, `hook`, `mps`, `mig` and `remote` (DRA claims only)
are one object each (one module each in gpupool.agent.isolation), with the same small protocol defined here,
used by Allocate (gpupool.agent.kubelet.device_plugin), DRA prepare (gpupool.agent.dra.driver), the host-side
watchdog (gpupool.agent.enforce.watchdog) and the inventory (gpupool.agent.service):

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

A new mode is one new module of this package and one line in `node_strategies`
(gpupool.agent.isolation.strategies); nothing else branches on the name.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo
from gpupool.agent.state.hookdir import HookPod
from gpupool.api.allocation import AllocationDoc, GrantDoc
from gpupool.api.isolation import IsolationMode

# The Allocate step after which the MIG instance exists (before the checkpoint; tests inject crashes there).
STEP_CARVED = "carved"
ISOLATION_MODES = (IsolationMode.NONE, IsolationMode.HOOK, IsolationMode.MPS, IsolationMode.MIG)


@dataclass(frozen=True, slots=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node the container gets (non-NVIDIA cards: gpupool.agent.isolation.vendors), at `container_path`
    inside; the runtime reads its type and numbers from the host node."""

    container_path: str
    host_path: str
    permissions: str = "rw"  # what the device cgroup allows: read and write, no mknod


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
    # A DRA claim's share (gpupool.agent.dra.driver): doc.pod_uid is the claim's UID, and the hook directory is
    # the claim's own (claims/<UID>), which the pods' clean-up never removes.
    claim: bool = False
    # Isolation remote (a claim's share of another node's GPU): the address its clients dial now, and whether
    # this node's GPU server holds the share (its unix socket is then mounted too).
    remote_server: str = ""
    remote_socket: bool = False

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


def number(value: float) -> str:
    return f"{value:g}"


class Isolation(Protocol):
    name: IsolationMode
    second_line: bool

    def check(self, request: GrantRequest) -> Refused | None: ...

    async def prepare(self, request: GrantRequest) -> Prepared | Refused: ...

    def grant(self, request: GrantRequest, prepared: Prepared) -> ModeGrant | Refused: ...

    async def release(self, pods: Sequence[Mapping[str, Any]], node: str, claims: Collection[str] = ()) -> None:
        """Let go of what pods no longer on the node (`pods`: those that are) and no prepared DRA claim
        (`claims`: their UIDs) hold."""

    def inventory_fields(self) -> dict[str, dict[str, Any]]: ...


def plain_gpus(request: GrantRequest) -> tuple[str, ...]:
    return tuple(g.uuid for g in request.gpus)


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
