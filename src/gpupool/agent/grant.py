"""What a container gets for its allocation: visible GPUs, limits as environment, MPS pipe mount.

Pure: takes the decoded allocation and the node's devices, returns a `ContainerGrant` (or the reason it
cannot be served); the gRPC servicer turns it into a ContainerAllocateResponse.

Environment contract (read by the interception shim and by users):
- NVIDIA_VISIBLE_DEVICES: the granted GPU UUIDs, comma-separated (`void` when CDI devices are used, so an
  image default of `all` cannot widen the grant);
- GPUPOOL_MEMORY_LIMIT_MIB / GPUPOOL_CORES_PERCENT: one value per visible GPU, comma-separated, in the
  order of NVIDIA_VISIBLE_DEVICES (a single number for the usual one-GPU share);
- isolation `hook`: the interception library (gpupool/native) and /etc/ld.so.preload naming it, both mounted
  read-only, so every dynamically linked process of the container loads it; the container's own hook
  directory (<hook_root>/pods/<pod UID>/<container>, created by the agent before it answers) mounted
  read-write at GPUPOOL_HOOK_DIR for the accounting of that container's processes (each GPU container of a
  pod is held to its own share); GPUPOOL_CORES_MODE (hard or elastic, from the pod's
  `gpupool.io/cores-mode` annotation) beside the limits above;
- isolation `mps` on a shared GPU: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
  (`0=<MiB>M`) and CUDA_MPS_PIPE_DIRECTORY, with the GPU's pipe directory (<mps_root>/<UUID>, one MPS
  control daemon per GPU, so one tenant's fault cannot stall other GPUs) mounted there;
- isolation `mig`: NVIDIA_VISIBLE_DEVICES names the MIG device (`MIG-<uuid>`, carved by the agent's MIG
  manager before the answer) instead of the GPU, GPUPOOL_MIG_PROFILE its profile; no interception library
  and no MPS (MIG is hardware isolation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices import DeviceInfo
from gpupool.agent.hookdir import (
    ANN_CORES_MODE,
    CONTAINER_HOOK_DIR,
    CONTAINER_LIBRARY,
    CONTAINER_PRELOAD,
    CORES_MODES,
    HookPod,
    container_dir,
    hook_paths,
    valid_container,
    valid_uid,
)
from gpupool.api.allocation import AllocationDoc


@dataclass(frozen=True, slots=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    envs: dict[str, str]
    mounts: list[MountSpec] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    hook_pod: HookPod | None = None  # isolation hook: the host directory to prepare before answering
    mps_gpu: str | None = None  # isolation mps on a shared GPU: the GPU whose MPS daemon serves the container


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str


def _num(value: float) -> str:
    return f"{value:g}"


def build_grant(
    doc: AllocationDoc,
    container: str,
    devices: Mapping[str, DeviceInfo],
    unhealthy: Mapping[str, str],
    config: AgentConfig,
    pod_label: str,
    cores_mode: str = "hard",
    mig_devices: Mapping[str, str] | None = None,
) -> ContainerGrant | Refused:
    """The grant of container `container` of the pod: its own part of the allocation (version 2), or the
    pod's whole grant (version 1: one GPU container). Isolation `mig` needs `mig_devices`: the MIG device
    UUID the MIG manager gave each granted GPU."""
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
    isolation = doc.isolation or config.isolation
    if isolation not in ("mps", "hook", "none", "mig"):
        return Refused(f"pod {pod_label}: unknown isolation {isolation!r} (use mps, hook, none or mig)")
    uuids = [g.uuid for g in gpus]
    if isolation == "mig":
        missing = [g.uuid for g in gpus if g.mig is None or g.uuid not in (mig_devices or {})]
        if missing:
            return Refused(f"pod {pod_label}: isolation mig, but no MIG device for GPU(s) {', '.join(missing)}")
        uuids = [(mig_devices or {})[g.uuid] for g in gpus]
    envs = {
        "GPUPOOL_MEMORY_LIMIT_MIB": ",".join(str(g.memory_mib) for g in gpus),
        "GPUPOOL_CORES_PERCENT": ",".join(_num(g.cores) for g in gpus),
        "GPUPOOL_ISOLATION": isolation,
    }
    if isolation == "mig":
        envs["GPUPOOL_MIG_PROFILE"] = ",".join(g.mig.profile for g in gpus if g.mig is not None)
    cdi: list[str] = []
    if config.cdi:
        cdi = [f"{config.cdi_kind}={u}" for u in uuids]
        envs["NVIDIA_VISIBLE_DEVICES"] = "void"
    else:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
    mounts: list[MountSpec] = []
    mps_gpu = None
    shared = [g for g in gpus if g.cores < 100 or g.memory_mib < devices[g.uuid].memory_mib]
    if isolation == "mps" and shared:
        if len(gpus) != 1:
            return Refused(
                f"pod {pod_label}: MPS sharing serves one GPU per container (one MPS daemon per GPU), "
                f"but {len(gpus)} shared GPUs were granted to container {container}"
            )
        g = gpus[0]
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = _num(g.cores)
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={g.memory_mib}M"
        envs["CUDA_MPS_PIPE_DIRECTORY"] = config.mps_container_dir
        mounts.append(MountSpec(config.mps_container_dir, str(config.mps_root / g.uuid)))
        mps_gpu = g.uuid
    hook_pod = None
    if isolation == "hook":
        if cores_mode not in CORES_MODES:
            return Refused(f"pod {pod_label}: {ANN_CORES_MODE}={cores_mode!r} is not one of {', '.join(CORES_MODES)}")
        if not valid_uid(doc.pod_uid):
            return Refused(f"pod {pod_label}: its allocation names pod UID {doc.pod_uid!r}, which is not a UID")
        if not valid_container(container):
            return Refused(f"pod {pod_label}: container name {container!r} is not an RFC 1123 label")
        paths = hook_paths(config.hook_root)
        # one hook directory per GPU container: its file holds this container's limits, by its own GPUs
        hook_pod = HookPod(doc.pod_uid, pod_label, container, tuple(g.uuid for g in gpus),
                           container_dir(config.hook_root, doc.pod_uid, container))
        envs["GPUPOOL_HOOK_DIR"] = CONTAINER_HOOK_DIR
        envs["GPUPOOL_CORES_MODE"] = cores_mode
        mounts += [
            MountSpec(CONTAINER_LIBRARY, str(paths.library), read_only=True),
            MountSpec(CONTAINER_PRELOAD, str(paths.preload), read_only=True),
            MountSpec(CONTAINER_HOOK_DIR, str(hook_pod.dir)),
        ]
    return ContainerGrant(envs=envs, mounts=mounts, cdi_devices=cdi, hook_pod=hook_pod, mps_gpu=mps_gpu)
