"""The GPUQueue custom resource (`gpupool.io/v1alpha1`, cluster-scoped) and how pods join queues.

Example:
  apiVersion: gpupool.io/v1alpha1
  kind: GPUQueue
  metadata: {name: team-a}
  spec:
    parent: research            # optional: queues form a tree; pods join leaf queues
    guaranteed: {gpus: "3", gpuMemory: 240Gi, gpuCores: 300}
    maximum: {gpus: "6"}        # a dimension left out is unlimited
    maxGPUsByVendor: {amd: "2"} # optional: at most this many GPUs of one vendor's cards (nvidia, amd, ascend)
    weight: 1
    lend: true                  # idle guarantee may be used by others (and is reclaimed when needed)
    borrow: true                # may go beyond its guarantee into what others lend

A namespace joins a queue with the label `gpupool.io/queue: <name>`; other namespaces join the default
queue (scheduler configuration). The CRD's schema (deploy/helm/gpupool/crds/) rejects most bad objects at
the API server; this module reads what the server stored and says what is wrong with anything left.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpupool.api.errors import first_problem
from gpupool.api.names import DOMAIN
from gpupool.core.model import MILLI_PER_GPU
from gpupool.core.quantity import QuantityError, parse_memory_mib
from gpupool.core.queues import DIMENSIONS, UNLIMITED, QueueConfigError, QueueSpec, QueueTree, Quota
from gpupool.core.vendors import VENDORS

GROUP = DOMAIN
VERSION = "v1alpha1"
KIND = "GPUQueue"
PLURAL = "gpuqueues"
LABEL_QUEUE = f"{DOMAIN}/queue"  # on a namespace: the queue its pods join
DEFAULT_QUEUE = "default"

_GPUS_RE = re.compile(r"^\d+(\.\d{1,3})?$")  # whole GPUs with up to three decimals (milli-GPU)


def _gpus_text(value: Any) -> Any:
    """A number of GPUs as the CRD stores it (a string such as "2" or "0.5"); ValueError names the value."""
    text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    if text is not None and (not isinstance(text, str) or not _GPUS_RE.match(text)):
        raise ValueError(f"{value!r} is not a number of GPUs such as 2 or 0.5 (at most 3 decimals)")
    return text


class QueueError(ValueError):
    pass


class AmountDoc(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)  # the server prunes unknown fields too
    gpus: str | None = None
    gpu_memory: str | None = Field(default=None, alias="gpuMemory")
    gpu_cores: int | None = Field(default=None, alias="gpuCores", ge=0)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        return _gpus_text(value)

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if value is None:
            return None
        try:
            parse_memory_mib(value if isinstance(value, int) else str(value))
        except QuantityError as e:
            raise ValueError(str(e)) from None
        return str(value)

    def declared(self) -> set[str]:
        names = {"gpus": "gpu_milli", "gpu_memory": "memory_mib", "gpu_cores": "cores"}
        return {d for f, d in names.items() if getattr(self, f) is not None}

    def quota(self, unset: int) -> Quota:
        """The amount, with `unset` for every dimension left out."""
        gpus = unset if self.gpus is None else round(float(self.gpus) * MILLI_PER_GPU)
        memory = unset if self.gpu_memory is None else parse_memory_mib(self.gpu_memory)
        cores = unset if self.gpu_cores is None else self.gpu_cores
        return Quota(gpus, memory, cores)


class QueueSpecDoc(BaseModel):
    model_config = ConfigDict(extra="ignore")
    parent: str | None = Field(default=None, min_length=1, max_length=253)
    guaranteed: AmountDoc = Field(default_factory=AmountDoc)
    maximum: AmountDoc = Field(default_factory=AmountDoc)
    weight: int = Field(default=1, ge=0, le=65535)
    lend: bool = True
    borrow: bool = True
    # At most this many GPUs on one vendor's cards (the queue's subtree together), beside `maximum`.
    max_gpus_by_vendor: dict[str, str] = Field(default_factory=dict, alias="maxGPUsByVendor")

    @field_validator("max_gpus_by_vendor", mode="before")
    @classmethod
    def _by_vendor(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(f"expected a map of vendor to GPUs such as {{amd: \"2\"}}, got {type(value).__name__}")
        out: dict[str, str] = {}
        for vendor, gpus in value.items():
            if vendor not in VENDORS:
                raise ValueError(f"vendor {str(vendor)[:40]!r} is unknown (use {', '.join(VENDORS)})")
            try:
                out[vendor] = _gpus_text(gpus)
            except ValueError as e:
                raise ValueError(f"{vendor}: {e}") from None
        return out

    def vendor_maximum(self) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((v, round(float(g) * MILLI_PER_GPU)) for v, g in self.max_gpus_by_vendor.items()))


def queue_spec(obj: Mapping[str, Any]) -> QueueSpec:
    """A GPUQueue object (as the API returns it) as a QueueSpec; QueueError names the field at fault."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    if not name:
        raise QueueError("GPUQueue without metadata.name")
    try:
        doc = QueueSpecDoc.model_validate(obj.get("spec") or {})
    except ValidationError as e:
        raise QueueError(f"GPUQueue {name}: {first_problem('spec', e)}") from None
    return QueueSpec(
        name=name,
        guaranteed=doc.guaranteed.quota(0),
        maximum=doc.maximum.quota(UNLIMITED),
        parent=doc.parent,
        weight=doc.weight,
        lend=doc.lend,
        borrow=doc.borrow,
        # The dimensions its object declares; none declared: all (a zero guarantee, borrowing only).
        dims=frozenset(doc.guaranteed.declared() | doc.maximum.declared() or DIMENSIONS),
        vendor_maximum=doc.vendor_maximum(),
    )


@dataclass(frozen=True)
class Queues:
    """The queue tree the cluster defines, with the objects that could not be read and why."""

    tree: QueueTree
    errors: Mapping[str, str]  # queue name -> problem
    default: str = DEFAULT_QUEUE

    def queue_of(self, namespace_labels: Mapping[str, str]) -> str:
        return str(namespace_labels.get(LABEL_QUEUE) or self.default)


def read_queues(objects: Iterable[Mapping[str, Any]], capacity: Quota | None = None,
                default: str = DEFAULT_QUEUE) -> Queues:
    """The tree from GPUQueue objects. Unreadable objects are left out with their reason; if the rest do not
    form a valid tree, no queue applies (every object is reported) rather than a half-enforced one. The
    default queue exists even when nobody created it (no guarantee, no maximum: it only borrows)."""
    specs: list[QueueSpec] = []
    errors: dict[str, str] = {}
    for obj in objects:
        try:
            specs.append(queue_spec(obj))
        except QueueError as e:
            errors[str((obj.get("metadata") or {}).get("name") or "?")] = str(e)
    if default not in {s.name for s in specs}:
        specs.append(QueueSpec(default))
    try:
        tree = QueueTree.build(specs, capacity)
    except QueueConfigError as e:
        errors.update({s.name: str(e) for s in specs})
        tree = QueueTree.build([QueueSpec(default)], capacity)
    return Queues(tree, errors, default)
