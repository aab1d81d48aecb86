"""The pod annotation `gpupool.io/allocation`: which node and GPUs the scheduler granted, versioned JSON.

Example (version 1):
{"version": 1, "pod_uid": "…", "node": "gpu-7", "policy": "gpupool", "isolation": "hook",
 "time": "2026-11-21T06:00:00Z", "gpus": [{"uuid": "GPU-…", "index": 3, "memory_mib": 8192, "cores": 30.0}]}

Version 2 adds `containers`: which container holds which part of `gpus`, for pods where several
containers ask for GPUs (see gpupool.api.pod.GPU_CONTAINERS_DOC):
  "containers": [{"name": "train", "kind": "container",
                  "gpus": [{"uuid": "GPU-…", "index": 3, "memory_mib": 4096, "cores": 15.0}]}, …]
The encoder writes version 1 whenever one container asks for GPUs (the pod's grant is that container's),
so agents that read only version 1 keep working; the decoder reads both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpupool.api.errors import first_problem
from gpupool.api.isolation import IsolationMode
from gpupool.api.names import ANN_ALLOCATION
from gpupool.api.pod import INIT, SIDECAR, ContainerGPU
from gpupool.core.model import MILLI_PER_GPU, Allocation, GPUGrant, MigSlot

ALLOCATION_VERSION: Literal[1] = 1  # what single-container pods get (readable by every agent release)
ALLOCATION_VERSION_CONTAINERS: Literal[2] = 2  # adds the per-container field


class AllocationError(ValueError):
    pass


class MigGrantDoc(BaseModel):
    """The MIG instance a grant is served by (isolation `mig`): its profile and start slot on the GPU, as
    the scheduler's mig_placement chose them; the agent carves (or reuses) exactly that instance."""

    model_config = ConfigDict(extra="forbid")
    profile: str = Field(min_length=1)
    start: int = Field(ge=0)


class GrantDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    uuid: str = Field(min_length=1)
    index: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    cores: float = Field(gt=0, le=100)  # percent of the GPU's compute
    mig: MigGrantDoc | None = None  # only for isolation `mig`; left out of the JSON otherwise
    # memory oversubscription (isolation hook): MiB beyond memory_mib served from host memory; left out when none
    oversub_mib: int | None = Field(default=None, ge=0)


class ContainerDoc(BaseModel):
    """One container's part of the pod's grant (version 2)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    kind: Literal["container", "init container", "sidecar"] = "container"
    gpus: list[GrantDoc]


class AllocationDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1, 2] = ALLOCATION_VERSION
    pod_uid: str
    node: str = Field(min_length=1)
    policy: str = ""
    isolation: str = IsolationMode.HOOK.value
    time: str = ""  # RFC 3339, when the scheduler decided
    gpus: list[GrantDoc]
    containers: list[ContainerDoc] = Field(default_factory=list)

    @model_validator(mode="after")
    def _containers_match(self) -> AllocationDoc:
        if self.version == 1 and self.containers:
            raise ValueError("containers is a version 2 field")
        pod_gpus = {(g.uuid, g.index) for g in self.gpus}
        for c in self.containers:
            for g in c.gpus:
                if (g.uuid, g.index) not in pod_gpus:
                    raise ValueError(f"container {c.name} holds GPU {g.index} ({g.uuid}), not granted to the pod")
        return self

    def container_gpus(self, name: str) -> list[GrantDoc]:
        """What container `name` holds: its own part in version 2, the whole grant in version 1 (where
        exactly one container asks for GPUs)."""
        if not self.containers:
            return list(self.gpus)
        return next((list(c.gpus) for c in self.containers if c.name == name), [])

    def allocation(self, pod_key: str) -> Allocation:
        grants = tuple(
            GPUGrant(uuid=g.uuid, index=g.index, milli=round(g.cores * 10), memory_mib=g.memory_mib,
                     mig=MigSlot(g.mig.profile, g.mig.start) if g.mig is not None else None)
            for g in self.gpus
        )
        return Allocation(pod=pod_key, node=self.node, grants=grants, policy=self.policy)


def _grant(g: GPUGrant) -> GrantDoc:
    mig = MigGrantDoc(profile=g.mig.profile, start=g.mig.start) if g.mig is not None else None
    return GrantDoc(uuid=g.uuid, index=g.index, memory_mib=g.memory_mib, cores=g.milli / 10, mig=mig)


def split_by_container(containers: Sequence[ContainerGPU], grants: Sequence[GPUGrant]) -> list[ContainerDoc]:
    """Which container holds which part of the pod's grant.

    Whole GPUs: containers that run at the same time get disjoint GPUs (sidecars first, in start order,
    then app containers); an init container runs beside the sidecars started before it only, so it gets
    the GPUs after theirs, which app containers reuse once it has finished. Shares: the pod holds one GPU,
    and each container gets its own compute and memory on it (memory given per container, else the same
    fraction of the pod's memory as of its compute)."""
    if not containers:
        return []
    if all(c.whole for c in containers):
        out: list[ContainerDoc] = []
        sidecars = apps = 0
        total_sidecars = sum(c.count for c in containers if c.kind == SIDECAR)
        for c in containers:
            if c.kind == SIDECAR:
                start, sidecars = sidecars, sidecars + c.count
            elif c.kind == INIT:
                start = sidecars
            else:
                start, apps = total_sidecars + apps, apps + c.count
            part = grants[start:start + c.count]
            if len(part) != c.count:
                raise AllocationError(f"{c.kind} {c.name} needs {c.count} GPU(s) but the pod holds {len(grants)}")
            out.append(ContainerDoc(name=c.name, kind=c.kind, gpus=[_grant(g) for g in part]))  # type: ignore[arg-type]
        return out
    if len(grants) != 1:
        raise AllocationError(f"containers sharing a GPU need one GPU, but the pod holds {len(grants)}")
    g = grants[0]
    pod_milli = max(1, g.milli)
    docs = []
    for c in containers:
        memory = c.memory_mib if c.memory_mib is not None else g.memory_mib * c.milli // pod_milli
        share = GPUGrant(uuid=g.uuid, index=g.index, milli=min(c.milli, MILLI_PER_GPU), memory_mib=memory)
        docs.append(ContainerDoc(name=c.name, kind=c.kind, gpus=[_grant(share)]))  # type: ignore[arg-type]
    return docs


def encode_allocation(
    allocation: Allocation, pod_uid: str, isolation: str, time: str, containers: Sequence[ContainerGPU] = ()
) -> str:
    """The annotation text. Give `containers` (ParsedPod.containers) so that a pod with several GPU
    containers records which holds what (version 2); with one or none it is version 1."""
    parts = split_by_container(containers, allocation.grants) if len(containers) > 1 else []
    version: Literal[1, 2] = ALLOCATION_VERSION_CONTAINERS if parts else ALLOCATION_VERSION
    doc = AllocationDoc(
        version=version,
        pod_uid=pod_uid,
        node=allocation.node,
        policy=allocation.policy,
        isolation=isolation,
        time=time,
        gpus=[_grant(g) for g in allocation.grants],
        containers=parts,
    )
    return doc.model_dump_json(exclude_none=True, exclude={"containers"} if not parts else set())


def decode_allocation(text: str) -> AllocationDoc:
    """Parse the annotation; raises AllocationError saying what is wrong."""
    try:
        return AllocationDoc.model_validate_json(text)
    except ValidationError as e:
        raise AllocationError(first_problem(ANN_ALLOCATION, e)) from None
