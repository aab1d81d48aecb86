"""What a container gets for its allocation: visible GPUs, limits as environment, MPS pipe mount.

Pure: takes the decoded allocation and the node's devices, returns a `ContainerGrant` (or the reason it
cannot be served); the gRPC servicer turns it into a ContainerAllocateResponse. The checks and the answer
common to every mode are here; what differs by mode is the mode's strategy (gpupool.agent.isolation.base).

Environment contract (read by the interception shim and by users):
- NVIDIA_VISIBLE_DEVICES: the granted GPU UUIDs, comma-separated (`void` when CDI devices are used, so an
  image default of `all` cannot widen the grant), as NVIDIA's vendor module says (gpupool.agent.devices.nvidia);
- GPUPOOL_MEMORY_LIMIT_MIB / GPUPOOL_CORES_PERCENT: one value per visible GPU, comma-separated, in the
  order of NVIDIA_VISIBLE_DEVICES (a single number for the usual one-GPU share);
- isolation `hook`: the interception library (gpupool/native) and /etc/ld.so.preload naming it, both mounted
  read-only, so every dynamically linked process of the container loads it; the container's limits file
  (<hook_root>/pods/<pod UID>/<container>/limits/limits.v1, written by the agent before it answers) mounted
  read-only at /run/gpupool/limits, from which alone the library takes its caps; the container's accounting
  directory (.../<container>/hook) mounted read-write at GPUPOOL_HOOK_DIR (each GPU container of a pod is
  held to its own share); GPUPOOL_CORES_MODE (hard or elastic, from the pod's `gpupool.io/cores-mode`
  annotation) beside the limits above, which the library lets lower its limits, never raise them;
- isolation `mps` on a shared GPU: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
  (`0=<MiB>M`) and CUDA_MPS_PIPE_DIRECTORY, with the GPU's pipe directory (<mps_root>/<UUID>, one MPS
  control daemon per GPU, so one tenant's fault cannot stall other GPUs) mounted there;
- isolation `mig`: NVIDIA_VISIBLE_DEVICES names the MIG device (`MIG-<uuid>`, carved by the agent's MIG
  manager before the answer) instead of the GPU, GPUPOOL_MIG_PROFILE its profile; no interception library
  and no MPS (MIG is hardware isolation).

Cards of another vendor (AMD, Ascend: `DeviceInfo.vendor`, decided in gpupool.agent.isolation.vendors): no
NVIDIA_VISIBLE_DEVICES and no CDI names; the vendor's device nodes (`devices`: DeviceSpecs of the device
plugin's answer, deviceNodes of a claim's CDI spec) and its variables (ASCEND_VISIBLE_DEVICES, ...), beside
the GPUPOOL_* limits above. A share of an AMD card under isolation hook gets the HIP library instead of the
CUDA library (memory cap, and a CU mask from `cu_masks.v1`; same limits file and mounts); modes a vendor's
cards cannot be held in are refused there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo
from gpupool.agent.devices.nvidia import nvidia_visible
from gpupool.agent.isolation.base import (
    ISOLATION_MODES,
    DeviceNode,
    GrantRequest,
    Isolation,
    MountSpec,
    Prepared,
    Refused,
    mode_of,
)
from gpupool.agent.isolation.strategies import node_strategies
from gpupool.agent.isolation.vendors import NO_VENDOR_DEVICES, VendorDevices, request_vendor, vendor_mode, vendor_part
from gpupool.agent.state.hookdir import HookPod
from gpupool.api.allocation import AllocationDoc, GrantDoc
from gpupool.api.dra import ClaimShares, DeviceShare
from gpupool.api.isolation import IsolationMode
from gpupool.core.vendors import NVIDIA

__all__ = ["ContainerGrant", "DeviceNode", "MountSpec", "Refused", "build_grant", "grant_request", "answer"]

CLAIM_CONTAINER = "claim"  # a DRA claim's grant's container name: one share per claim, whatever container uses it


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    envs: dict[str, str]
    mounts: list[MountSpec] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    hook_pod: HookPod | None = None  # isolation hook: the host directory to prepare before answering
    mps_gpu: str | None = None  # isolation mps on a shared GPU: the GPU whose MPS daemon serves the container
    devices: list[DeviceNode] = field(default_factory=list)  # device nodes (non-NVIDIA cards; none on NVIDIA)


def _num(value: float) -> str:
    return f"{value:g}"


def grant_request(
    doc: AllocationDoc,
    container: str,
    devices: Mapping[str, DeviceInfo],
    unhealthy: Mapping[str, str],
    config: AgentConfig,
    pod_label: str,
    strategies: Mapping[str, Isolation],
    cores_mode: str = "hard",
    gpu_containers: int = 1,
    pods_on_node: Sequence[Mapping[str, Any]] = (),
    claim: bool = False,
) -> tuple[Isolation, GrantRequest] | Refused:
    """The checks every mode shares, then the mode's own (`Isolation.check`): the strategy that serves the
    container and its request, or why it cannot be served."""
    gpus = doc.container_gpus(container)
    if not gpus:
        return Refused(f"pod {pod_label}: its allocation grants no GPUs to container {container}")
    for g in gpus:
        if g.uuid not in devices:
            return Refused(
                f"pod {pod_label} was granted GPU {g.uuid}, which this node ({config.node_name}) does not have"
            )
        if g.uuid in unhealthy:
            return Refused(f"pod {pod_label} was granted GPU {g.uuid}, which is unhealthy ({unhealthy[g.uuid]})")
        if g.memory_mib > devices[g.uuid].memory_mib:
            return Refused(
                f"pod {pod_label} was granted {g.memory_mib} MiB on GPU {g.uuid}, which has "
                f"{devices[g.uuid].memory_mib} MiB"
            )
    isolation = mode_of(doc, config.isolation)
    strategy = strategies.get(isolation)
    if strategy is None:
        return Refused(f"pod {pod_label}: unknown isolation {isolation!r} (use {', '.join(sorted(ISOLATION_MODES))})")
    request = GrantRequest(doc, container, tuple(gpus), devices, config, pod_label, cores_mode, gpu_containers,
                           tuple(pods_on_node), claim)
    served = vendor_mode(request, isolation)  # the mode on the cards' vendor (on NVIDIA: the one asked for)
    if isinstance(served, Refused):
        return served
    if served != isolation:
        whole = strategies.get(served)
        if whole is None:
            return Refused(f"pod {pod_label}: its cards are served whole here, but the node has no {served} mode")
        strategy = whole
    refused = strategy.check(request)
    return refused if refused is not None else (strategy, request)


def answer(strategy: Isolation, request: GrantRequest, prepared: Prepared,
           vendors: VendorDevices = NO_VENDOR_DEVICES) -> ContainerGrant | Refused:
    """The container's answer: the limits of every mode plus the mode's own part (non-NVIDIA cards: the devices
    the node's vendor object, in `vendors`, hands out)."""
    mode = strategy.grant(request, prepared)
    if isinstance(mode, Refused):
        return mode
    gpus = request.gpus
    envs = {
        "GPUPOOL_MEMORY_LIMIT_MIB": ",".join(str(g.memory_mib) for g in gpus),
        "GPUPOOL_CORES_PERCENT": ",".join(_num(g.cores) for g in gpus),
        "GPUPOOL_ISOLATION": str(strategy.name),
    }
    vendor = request_vendor(request)
    if isinstance(vendor, Refused):
        return vendor
    if vendor != NVIDIA:
        part = vendor_part(request, vendor, vendors)
        if isinstance(part, Refused):
            return part
        envs.update(part.envs)
        envs.update(mode.envs)
        return ContainerGrant(envs=envs, mounts=list(mode.mounts), hook_pod=mode.hook_pod, mps_gpu=mode.mps_gpu,
                              devices=part.devices)
    # NVIDIA's vendor says what its cards are handed as (the same answer as NvidiaVendor.container_devices)
    nvidia = nvidia_visible(mode.visible, request.config.cdi_kind if request.config.cdi else None)
    envs.update(nvidia.env)
    envs.update(mode.envs)
    return ContainerGrant(envs=envs, mounts=list(mode.mounts), cdi_devices=nvidia.cdi_devices,
                          hook_pod=mode.hook_pod, mps_gpu=mode.mps_gpu)


def build_grant(
    doc: AllocationDoc,
    container: str,
    devices: Mapping[str, DeviceInfo],
    unhealthy: Mapping[str, str],
    config: AgentConfig,
    pod_label: str,
    cores_mode: str = "hard",
    mig_devices: Mapping[str, str] | None = None,
    vendors: VendorDevices = NO_VENDOR_DEVICES,
) -> ContainerGrant | Refused:
    """The grant of container `container` of the pod, without touching the node: its own part of the
    allocation (version 2), or the pod's whole grant (version 1: one GPU container). Isolation `mig` needs
    `mig_devices`: the MIG device UUID the MIG manager gave each granted GPU (what its `prepare` carves); other
    vendors' cards need their vendor object in `vendors` (unless the backend is fake)."""
    found = grant_request(doc, container, devices, unhealthy, config, pod_label, node_strategies(config), cores_mode)
    if isinstance(found, Refused):
        return found
    strategy, request = found
    return answer(strategy, request, Prepared(visible=dict(mig_devices or {})), vendors)


def share_grant(dev: DeviceInfo, s: DeviceShare, shares: ClaimShares) -> GrantDoc | str:
    """The grant of a claim's share `s` of the shared GPU `dev` (not a MIG partition), or why it cannot be
    one: what a `hook` claim's container is held to here, and what a remote share's server holds it to."""
    label = shares.label
    if dev.mig_enabled:
        return f"claim {label}: GPU {s.device} is in MIG mode; it serves MIG partitions only"
    memory = dev.memory_mib if s.memory_mib is None else s.memory_mib
    # 0 cores consumed: a memory-only share, which competes for compute without a cap (100)
    cores = 100 if not s.cores else s.cores
    if shares.isolation == IsolationMode.NONE and (memory < dev.memory_mib or cores < 100):
        return (f"claim {label}: its class gives isolation none, which serves whole GPUs only, but it holds "
                f"{memory} MiB and {cores} % of {s.device}; nothing would hold it to that share")
    return GrantDoc(uuid=dev.uuid, index=dev.index, memory_mib=memory, cores=cores,
                    oversub_mib=shares.oversub_mib(memory) or None)
