"""The pod annotation `gpupool.io/allocation`: which node and GPUs the scheduler granted, versioned JSON.

Example (version 1):
{"version": 1, "pod_uid": "…", "node": "gpu-7", "policy": "gpupool", "isolation": "hook",
 "time": "2026-11-21T06:00:00Z", "gpus": [{"uuid": "GPU-…", "index": 3, "memory_mib": 8192, "cores": 30.0}]}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpupool.api.errors import first_problem
from gpupool.api.names import ANN_ALLOCATION
from gpupool.core.model import Allocation, GPUGrant

ALLOCATION_VERSION = 1


class AllocationError(ValueError):
    pass


class GrantDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    uuid: str = Field(min_length=1)
    index: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    cores: float = Field(gt=0, le=100)  # percent of the GPU's compute


class AllocationDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = ALLOCATION_VERSION
    pod_uid: str
    node: str = Field(min_length=1)
    policy: str = ""
    isolation: str = "hook"
    time: str = ""  # RFC 3339, when the scheduler decided
    gpus: list[GrantDoc]

    def allocation(self, pod_key: str) -> Allocation:
        grants = tuple(
            GPUGrant(uuid=g.uuid, index=g.index, milli=round(g.cores * 10), memory_mib=g.memory_mib)
            for g in self.gpus
        )
        return Allocation(pod=pod_key, node=self.node, grants=grants, policy=self.policy)


def encode_allocation(allocation: Allocation, pod_uid: str, isolation: str, time: str) -> str:
    doc = AllocationDoc(
        pod_uid=pod_uid,
        node=allocation.node,
        policy=allocation.policy,
        isolation=isolation,
        time=time,
        gpus=[GrantDoc(uuid=g.uuid, index=g.index, memory_mib=g.memory_mib, cores=g.milli / 10)
              for g in allocation.grants],
    )
    return doc.model_dump_json()


def decode_allocation(text: str) -> AllocationDoc:
    """Parse the annotation; raises AllocationError saying what is wrong."""
    try:
        return AllocationDoc.model_validate_json(text)
    except ValidationError as e:
        raise AllocationError(first_problem(ANN_ALLOCATION, e)) from None
