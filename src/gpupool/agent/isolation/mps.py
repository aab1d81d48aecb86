"""Isolation `mps`: the MPS client limits and the pipe directory of the GPU's daemon
(gpupool.agent.devices.mps)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.mps import MpsSupervisor, inventory_fields
from gpupool.agent.isolation.base import GrantRequest, ModeGrant, MountSpec, Prepared, Refused, number, plain_gpus
from gpupool.api.isolation import IsolationMode


class MpsIsolation:
    """`mps`: on a shared GPU, the MPS client limits and the pipe directory of the GPU's daemon (one daemon
    per GPU, run by the agent: without one answering, the limits would be handed out and not apply)."""

    name = IsolationMode.MPS
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
            return ModeGrant(visible=plain_gpus(request))
        g = request.gpus[0]
        directory = request.config.mps_container_dir
        return ModeGrant(
            envs={
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": number(g.cores),
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={g.memory_mib}M",
                "CUDA_MPS_PIPE_DIRECTORY": directory,
            },
            mounts=[MountSpec(directory, str(request.config.mps_root / g.uuid))],
            visible=plain_gpus(request),
            mps_gpu=g.uuid,
        )

    async def release(self, pods: Sequence[Mapping[str, Any]], node: str, claims: Collection[str] = ()) -> None:
        return None  # an MPS client leaves nothing behind on the node

    def inventory_fields(self) -> dict[str, dict[str, Any]]:
        return dict(inventory_fields(dict(self.supervisor.health))) if self.supervisor is not None else {}
