"""Helpers for the watchdog tests: a host /proc tree in a temporary directory (cgroup files only), pods as
the scheduler and kubelet leave them (allocation annotation, container IDs in the status), and a killer
that records what it was asked to stop and makes the fake driver forget the process, as a real kill does."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.fake import FakeBackend, parse_fake_description
from gpupool.agent.enforce.procs import ProcRef
from gpupool.agent.enforce.watchdog import Watchdog
from gpupool.agent.isolation.strategies import node_strategies
from gpupool.agent.port import ClusterPortAgent
from gpupool.api.allocation import AllocationDoc, ContainerDoc, GrantDoc
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION, RESOURCE_GPU
from gpupool.cluster.memory import MemoryCluster

NODE = "gpu-node-1"
_n = itertools.count(1)


def pod_uid() -> str:
    return f"6b1e0d2c-8e0a-4a4c-9d1e-{next(_n):012x}"


def container_id() -> str:
    return f"{next(_n):064x}"


def write_proc(root: Path, pid: int, uid: str, cid: str | None) -> None:
    """/proc/<pid>/cgroup as the systemd cgroup driver and containerd write it (cgroup v2); `cid` None: the
    pod's own cgroup; `uid` "": a host process outside any pod."""
    if not uid:
        path = "/system.slice/sshd.service"
    else:
        slice_ = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice"
        path = slice_ + (f"/cri-containerd-{cid}.scope" if cid else "")
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(f"0::{path}\n")


@dataclass
class Container:
    name: str
    grants: list[tuple[str, int, float]]  # (GPU UUID, MiB, cores %); [] for a container without GPUs
    cid: str = field(default_factory=container_id)


def pod(name: str, containers: list[Container], isolation: str = "hook", cores_mode: str | None = None,
        uid: str | None = None, phase: str = "Running") -> dict[str, Any]:
    """A pod bound to NODE and served: a v2 allocation (each GPU container its own part), every container
    running with its ID in the status."""
    uid = uid or pod_uid()
    gpu_containers = [c for c in containers if c.grants]
    every = [GrantDoc(uuid=u, index=0, memory_mib=m, cores=p) for c in gpu_containers for u, m, p in c.grants]
    doc = AllocationDoc(
        version=2, pod_uid=uid, node=NODE, isolation=isolation, time="2026-11-27T06:00:00Z", gpus=every,
        containers=[ContainerDoc(name=c.name, gpus=[GrantDoc(uuid=u, index=0, memory_mib=m, cores=p)
                                                   for u, m, p in c.grants]) for c in gpu_containers],
    )
    annotations = {ANN_ALLOCATION: doc.model_dump_json(), ANN_ALLOCATED: "{}"}
    if cores_mode is not None:
        annotations["gpupool.io/cores-mode"] = cores_mode
    return {
        "metadata": {"name": name, "namespace": "team", "uid": uid, "annotations": annotations},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": c.name, "resources": {"limits": {RESOURCE_GPU: str(len(c.grants))}} if c.grants else {}}
                for c in containers
            ],
        },
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": c.name, "containerID": f"containerd://{c.cid}"} for c in containers],
        },
    }


@dataclass
class RecordingKiller:
    """Stops processes of the fake driver. `driver_forgets` False: the driver keeps listing a killed
    process for a while (its context is still being torn down)."""

    backend: FakeBackend
    driver_forgets: bool = True
    killed: list[tuple[int, ProcRef]] = field(default_factory=list)

    def kill(self, pid: int, expected: ProcRef) -> bool:
        self.killed.append((pid, expected))
        if self.driver_forgets:
            self.backend.end_process(pid)
        return True

    @property
    def pids(self) -> list[int]:
        return [pid for pid, _ in self.killed]


G0, G1 = "GPU-w-0", "GPU-w-1"


class Node:
    """One node: two 40 GiB GPUs, its pods in the cluster, its processes in the fake driver and /proc."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        self.proc = tmp_path / "proc"
        self.proc.mkdir(parents=True)
        self.backend = FakeBackend(parse_fake_description(
            {"gpus": [{"uuid": G0, "model": "A100", "memory_mib": 40960},
                      {"uuid": G1, "model": "A100", "memory_mib": 40960}]}, "test"))
        self.cluster = MemoryCluster()
        self.config = AgentConfig(node_name=NODE, watchdog_proc_root=self.proc, **settings)
        self.killer = RecordingKiller(self.backend)
        self.watchdog = Watchdog(self.config, self.backend, ClusterPortAgent(self.cluster),
                                 node_strategies(self.config), lambda: [G0, G1], killer=self.killer,
                                 wall_clock=lambda: 1_800_000_000.0)

    async def add(self, p: dict[str, Any]) -> dict[str, Any]:
        return await self.cluster.create_pod(p)

    def run(self, p: dict[str, Any], container: Container | None, pid: int, gpu: str, mib: float,
            sm: float = 0.0) -> None:
        """Process `pid` of `container` of pod `p` (None: in the pod's own cgroup) holds `mib` on `gpu`."""
        write_proc(self.proc, pid, p["metadata"]["uid"], container.cid if container else None)
        self.backend.run_process(gpu, pid, mib, sm)

    def events(self) -> list[tuple[str, str, str]]:
        return [(e["involvedObject"]["name"], e["reason"], e["message"]) for e in self.cluster.events]
