"""The node annotation `gpupool.io/inventory`: the GPUs a node has, written by the node agent.

Example (version 1):
{"version": 1, "node": "gpu-7", "split": 10, "driver": "570.86", "cuda": "12.8", "time": "…",
 "gpus": [{"uuid": "GPU-…", "index": 0, "model": "H100-80GB", "memory_mib": 81559, "sm_count": 132,
           "numa_node": 0, "nvlink_peers": [1, 2], "vendor": "nvidia", "healthy": true, "mig": false,
           "pci_bus_id": "0000:3b:00.0"}]}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpupool.api.errors import first_problem
from gpupool.api.names import ANN_INVENTORY
from gpupool.api.quantity import QuantityError, bytes_to_mib, parse_quantity
from gpupool.core.model import GPU, Node

INVENTORY_VERSION: Literal[1] = 1


class InventoryError(ValueError):
    pass


class MigInstanceDoc(BaseModel):
    """A MIG instance that exists on a MIG-mode GPU, as the node agent reports it."""

    model_config = ConfigDict(extra="ignore")
    profile: str = Field(min_length=1)
    start: int = Field(ge=0)
    used: bool = False  # a pod holds it
    uuid: str = ""  # MIG-<uuid> once the compute instance exists


class GPUDoc(BaseModel):
    model_config = ConfigDict(extra="ignore")  # newer agents may add fields; old schedulers ignore them
    uuid: str = Field(min_length=1)
    index: int = Field(ge=0)
    model: str = Field(min_length=1)
    memory_mib: int = Field(gt=0)
    sm_count: int = Field(default=0, ge=0)
    numa_node: int = 0
    nvlink_peers: list[int] = Field(default_factory=list)
    vendor: str = "nvidia"
    healthy: bool = True
    mig: bool = False
    mig_instances: list[MigInstanceDoc] = Field(default_factory=list)  # only when `mig`
    mps: Literal["", "up", "down"] = ""  # the GPU's MPS daemon ("" where the agent runs none)
    mps_restarts: int = Field(default=0, ge=0)
    pci_bus_id: str = ""

    def gpu(self) -> GPU:
        return GPU(
            uuid=self.uuid,
            index=self.index,
            model=self.model,
            memory_mib=self.memory_mib,
            sm_count=self.sm_count,
            numa_node=self.numa_node,
            nvlink_peers=tuple(self.nvlink_peers),
            vendor=self.vendor,
            healthy=self.healthy,
        )


class ValidationStepDoc(BaseModel):
    """One node validation step as the agent last saw it (docs/agent.md, "Node validation")."""

    model_config = ConfigDict(extra="ignore")
    step: str = Field(min_length=1)
    state: Literal["pending", "true", "false"]
    reason: str = ""


class InventoryDoc(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: Literal[1] = INVENTORY_VERSION
    node: str = Field(min_length=1)
    split: int = Field(default=10, ge=1)  # device-plugin slots per GPU
    driver: str = ""
    cuda: str = ""
    time: str = ""
    gpus: list[GPUDoc]
    validation: list[ValidationStepDoc] = Field(default_factory=list)  # empty: an agent without validation
    # The node's GPU server for remote shares (docs/remote.md) while it is up ("": none) and how many remote
    # shares it serves. Added within version 1: older readers ignore them, older agents leave the defaults.
    remote_server: str = ""
    remote_shares: int = Field(default=0, ge=0)


def encode_inventory(
    node: str, gpus: list[GPU], split: int, driver: str = "", cuda: str = "", time: str = "",
    extra: Mapping[int, Mapping[str, Any]] | None = None,
    validation: Sequence[Mapping[str, str]] = (),
    remote_server: str = "",
    remote_shares: int = 0,
) -> str:
    """`extra` adds per-GPU fields by index (e.g. mig, pci_bus_id); `validation`: the node's validation
    steps in order ({step, state, reason}); `remote_server`/`remote_shares`: the node's GPU server."""
    docs = []
    for g in sorted(gpus, key=lambda g: g.index):
        fields: dict[str, Any] = {
            "uuid": g.uuid, "index": g.index, "model": g.model, "memory_mib": g.memory_mib,
            "sm_count": g.sm_count, "numa_node": g.numa_node, "nvlink_peers": list(g.nvlink_peers),
            "vendor": g.vendor, "healthy": g.healthy,
        }
        fields.update((extra or {}).get(g.index, {}))
        docs.append(GPUDoc(**fields))
    steps = [ValidationStepDoc.model_validate(v) for v in validation]
    return InventoryDoc(node=node, split=split, driver=driver, cuda=cuda, time=time, gpus=docs,
                        validation=steps, remote_server=remote_server,
                        remote_shares=remote_shares).model_dump_json()


def decode_inventory(text: str) -> InventoryDoc:
    try:
        doc = InventoryDoc.model_validate_json(text)
    except ValidationError as e:
        raise InventoryError(first_problem(ANN_INVENTORY, e)) from None
    indices = [g.index for g in doc.gpus]
    if sorted(indices) != list(range(len(indices))):
        raise InventoryError(f"invalid {ANN_INVENTORY}: GPU indices {indices} must be 0..{len(indices) - 1}")
    return doc


def node_from_object(obj: Mapping[str, Any]) -> Node | None:
    """Build a core Node from a Kubernetes Node object (JSON shape): allocatable CPU/memory from its
    status, GPUs from its inventory annotation. None when the node has no inventory (not a gpupool
    node); raises InventoryError for a malformed one."""
    read = read_node(obj)
    return None if read is None else read[0]


def read_node(obj: Mapping[str, Any]) -> tuple[Node, InventoryDoc] | None:
    """`node_from_object`, with the decoded inventory beside it for callers that need more of it (split,
    MIG instances, MPS states) without decoding the annotation again."""
    from gpupool.api.pod import parse_cpu_milli  # local: pod.py is the one CPU parser

    meta = obj.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(ANN_INVENTORY)
    if not text:
        return None
    doc = decode_inventory(text)
    alloc = (obj.get("status") or {}).get("allocatable") or {}
    try:
        cpu = parse_cpu_milli(alloc.get("cpu", "0"))
        # Kubernetes writes node memory in bytes (usually with Ki); rounded down: never promise more.
        mem = bytes_to_mib(parse_quantity(alloc.get("memory", "0"), "allocatable memory")[0], round_up=False)
    except QuantityError as e:
        raise InventoryError(f"node {meta.get('name')}: {e}") from None
    return Node(
        name=str(meta.get("name", doc.node)),
        cpu_milli=cpu,
        memory_mib=mem,
        gpus=tuple(g.gpu() for g in sorted(doc.gpus, key=lambda g: g.index)),
        labels=dict(meta.get("labels") or {}),
    ), doc
