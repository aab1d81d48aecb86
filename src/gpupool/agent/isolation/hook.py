"""Isolation `hook`: the interception library, the container's read-only limits file and its accounting
directory (gpupool.agent.state.hookdir)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gpupool.agent.config import AgentConfig
from gpupool.agent.isolation.base import GrantRequest, ModeGrant, MountSpec, Prepared, Refused, plain_gpus
from gpupool.agent.isolation.vendors import CuMaskProblem, amd_cu_masks, cu_lock, request_vendor
from gpupool.agent.state.hookdir import (
    ANN_CORES_MODE,
    CONTAINER_HIP_LIBRARY,
    CONTAINER_HOOK_DIR,
    CONTAINER_LIBRARY,
    CONTAINER_LIMITS_DIR,
    CONTAINER_PRELOAD,
    CORES_MODES,
    HookLimits,
    HookPod,
    NvmlScales,
    accounting_dir,
    claim_dir,
    container_dir,
    hip_paths,
    hook_paths,
    limits_dir,
    prepare_hook_pod,
    prepare_pod,
    remove_gone,
    valid_container,
    valid_uid,
    write_cu_masks,
)
from gpupool.api.isolation import IsolationMode
from gpupool.core.vendors import AMD


class HookIsolation:
    """`hook`: the interception library and the preload list (read-only), the container's limits file
    (limits.v1, written by the agent before the answer and mounted read-only: the library takes its caps
    from there, never from what the tenant can change) and the container's own accounting directory
    (read-write; one per GPU container: each is held to its own share). On AMD cards the limits directory also
    holds cu_masks.v1, the CUs of each card the container's queues may use (gpupool.agent.isolation.vendors)."""

    name = IsolationMode.HOOK
    second_line = True  # interception misses static binaries and direct ioctls: the watchdog backs it

    def __init__(self, config: AgentConfig, nvml_scales: NvmlScales | None = None) -> None:
        self.config = config
        self.nvml_scales = nvml_scales or NvmlScales()  # none measured: the libraries learn the scale alone

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
        gpus = plain_gpus(request)
        limits = HookLimits(
            memory_mib=tuple(g.memory_mib for g in request.gpus),
            cores=tuple(g.cores for g in request.gpus),
            mode=request.cores_mode,
            gpus=gpus,
            accounting_dir=CONTAINER_HOOK_DIR,
            oversub_mib=tuple(g.oversub_mib or 0 for g in request.gpus) if any(g.oversub_mib for g in request.gpus)
            else (),
            nvml_scale_ppm=self.nvml_scales.of(gpus),
        )
        root, uid = request.config.hook_root, request.doc.pod_uid
        directory = claim_dir(root, uid) if request.claim else container_dir(root, uid, request.container)
        return HookPod(uid, request.pod_label, request.container, gpus, directory, limits)

    def _prepare_files(self, request: GrantRequest, hook_pod: HookPod) -> bool:
        """The container's directory and limits file; whether they were written (an embedded agent, without the
        library installed, writes nothing for a pod's container)."""
        if request.claim:
            prepare_pod(hook_pod)
            return True
        return prepare_hook_pod(request.config.hook_root, hook_pod, request.pods_on_node)

    def _prepare_amd(self, request: GrantRequest, hook_pod: HookPod) -> None:
        """An AMD container: its CUs chosen from what the card's other holders leave (gpupool.agent.isolation
        .vendors.amd_cu_masks) and written to cu_masks.v1 beside limits.v1, all under the CU lock so no other
        prepare picks the same CUs in between."""
        with cu_lock():
            masks = amd_cu_masks(request, hook_pod.dir)
            if self._prepare_files(request, hook_pod):
                write_cu_masks(limits_dir(hook_pod.dir), masks)

    async def prepare(self, request: GrantRequest) -> Prepared | Refused:
        # the container's directories and limits file must exist before kubelet mounts them
        try:
            hook_pod = self._hook_pod(request)  # in the try, as before: a name it cannot use is a refusal
            if request_vendor(request) == AMD:
                await asyncio.to_thread(self._prepare_amd, request, hook_pod)
            else:
                await asyncio.to_thread(self._prepare_files, request, hook_pod)
        except CuMaskProblem as e:
            return Refused(f"pod {request.pod_label}: its compute share cannot be held: {e.reason}", retry=e.retry)
        except OSError as e:
            return Refused(f"cannot prepare the hook directory of pod {request.pod_label}: {e}", retry=True)
        except ValueError as e:  # limits the file cannot hold (too many GPUs for one container, say)
            return Refused(f"pod {request.pod_label}: its limits cannot be written for the library: {e}")
        return Prepared()

    def grant(self, request: GrantRequest, prepared: Prepared) -> ModeGrant | Refused:
        paths = hook_paths(request.config.hook_root)
        library, preload = (CONTAINER_LIBRARY, str(paths.library)), str(paths.preload)
        if request_vendor(request) == AMD:  # the HIP library: memory cap and CU mask (isolation.vendors let it through)
            hip = hip_paths(request.config.hook_root)
            library, preload = (CONTAINER_HIP_LIBRARY, str(hip.library)), str(hip.preload)
        hook_pod = self._hook_pod(request)
        return ModeGrant(
            envs={"GPUPOOL_HOOK_DIR": CONTAINER_HOOK_DIR, "GPUPOOL_CORES_MODE": request.cores_mode},
            mounts=[
                MountSpec(*library, read_only=True),
                MountSpec(CONTAINER_PRELOAD, preload, read_only=True),
                # siblings on the host: nothing the container may write lies above the limits file
                MountSpec(CONTAINER_LIMITS_DIR, str(limits_dir(hook_pod.dir)), read_only=True),
                MountSpec(CONTAINER_HOOK_DIR, str(accounting_dir(hook_pod.dir))),
            ],
            visible=plain_gpus(request),
            hook_pod=hook_pod,
        )

    async def release(self, pods: Sequence[Mapping[str, Any]], node: str, claims: Collection[str] = ()) -> None:
        # the rule of prepare_hook_pod: a directory stays while its pod is on the node in any phase
        listed = {str((p.get("metadata") or {}).get("uid")) for p in pods}
        await asyncio.to_thread(remove_gone, self.config.hook_root, listed)

    def inventory_fields(self) -> dict[str, dict[str, Any]]:
        return {}
