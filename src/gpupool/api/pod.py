"""Reading what a Kubernetes pod asks of gpupool (its resources and annotations) into a PodRequest.

Errors are collected, not raised: the webhook shows them all at once and the scheduler rejects the pod
on every node with the same text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.names import (
    ANN_EXCLUDE,
    ANN_ISOLATION,
    ANN_MODEL,
    ANN_POLICY,
    ANN_UUID,
    DEFAULT_ISOLATION,
    ISOLATION_MODES,
    RESOURCE_CORES,
    RESOURCE_GPU,
    RESOURCE_MEMORY,
)
from gpupool.core.model import MILLI_PER_GPU, GPURequest, PodRequest
from gpupool.core.quantity import QuantityError, parse_memory_mib

_GPUPOOL_RESOURCES = (RESOURCE_GPU, RESOURCE_MEMORY, RESOURCE_CORES)


@dataclass(frozen=True, slots=True)
class ParsedPod:
    request: PodRequest | None  # None when errors is not empty
    isolation: str = DEFAULT_ISOLATION
    errors: list[str] = field(default_factory=list)
    container: str | None = None  # the container that asks for GPUs


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def _resources(container: Mapping[str, Any]) -> dict[str, Any]:
    res = container.get("resources") or {}
    merged: dict[str, Any] = dict(res.get("requests") or {})
    merged.update(res.get("limits") or {})  # extended resources: limits are authoritative
    return merged


def wants_gpu(pod: Mapping[str, Any]) -> bool:
    """Whether any container asks for a gpupool resource."""
    spec = pod.get("spec") or {}
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        if any(r in _resources(c) for r in _GPUPOOL_RESOURCES):
            return True
    return False


def parse_cpu_milli(value: Any) -> int:
    text = str(value).strip()
    try:
        if text.endswith("m"):
            return int(float(text[:-1]))
        return int(float(text) * 1000)
    except ValueError:
        raise QuantityError(f"cpu {value!r}: expected cores such as 2 or 500m") from None


def _int(value: Any, what: str, errors: list[str]) -> int | None:
    try:
        text = str(value).strip().removesuffix("%")
        number = float(text)
    except ValueError:
        errors.append(f"{what} {value!r} is not a number")
        return None
    if number != int(number):
        errors.append(f"{what} {value!r} must be a whole number")
        return None
    return int(number)


def _csv(annotations: Mapping[str, str], key: str) -> frozenset[str]:
    raw = annotations.get(key, "")
    return frozenset(p.strip() for p in str(raw).split(",") if p.strip())


def parse_pod(pod: Mapping[str, Any]) -> ParsedPod:
    """Translate a pod object (Kubernetes JSON shape) into a PodRequest, or the list of what is wrong."""
    errors: list[str] = []
    meta = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    containers = list(spec.get("containers") or [])

    cpu = mem = 0
    gpu_containers: list[tuple[str, dict[str, Any]]] = []
    for c in containers:
        requests = (c.get("resources") or {}).get("requests") or {}
        name = c.get("name", "?")
        try:
            cpu += parse_cpu_milli(requests["cpu"]) if "cpu" in requests else 0
            mem += parse_memory_mib(str(requests["memory"])) if "memory" in requests else 0
        except QuantityError as e:
            errors.append(f"container {name}: {e}")
        res = _resources(c)
        if any(r in res for r in _GPUPOOL_RESOURCES):
            gpu_containers.append((name, res))

    isolation = str(annotations.get(ANN_ISOLATION, DEFAULT_ISOLATION)).strip() or DEFAULT_ISOLATION
    if isolation not in ISOLATION_MODES:
        errors.append(f"annotation {ANN_ISOLATION}={isolation!r}: use one of {', '.join(ISOLATION_MODES)}")

    gpu = GPURequest(count=0)
    container_name: str | None = None
    if len(gpu_containers) > 1:
        names = ", ".join(n for n, _ in gpu_containers)
        errors.append(f"only one container per pod may ask for {RESOURCE_GPU} (found: {names})")
    elif gpu_containers:
        container_name, res = gpu_containers[0]
        where = f"container {container_name}"
        count = _int(res[RESOURCE_GPU], f"{where}: {RESOURCE_GPU}", errors) if RESOURCE_GPU in res else None
        if count is None and RESOURCE_GPU not in res:
            errors.append(f"{where}: {RESOURCE_MEMORY}/{RESOURCE_CORES} need {RESOURCE_GPU} (how many GPUs)")
        elif count is not None and count <= 0:
            errors.append(f"{where}: {RESOURCE_GPU} must be at least 1, got {count}")
        milli = MILLI_PER_GPU
        if RESOURCE_CORES in res:
            cores = _int(res[RESOURCE_CORES], f"{where}: {RESOURCE_CORES}", errors)
            if cores is not None and not 0 < cores <= 100:
                errors.append(f"{where}: {RESOURCE_CORES}={cores} must be between 1 and 100 (percent of one GPU)")
            elif cores is not None:
                milli = cores * 10
        memory: int | None = None
        if RESOURCE_MEMORY in res:
            memory = _int(res[RESOURCE_MEMORY], f"{where}: {RESOURCE_MEMORY}", errors)
            if memory is not None and memory <= 0:
                errors.append(f"{where}: {RESOURCE_MEMORY}={memory} must be a positive number of MiB")
            if memory is not None and memory > 0 and RESOURCE_CORES not in res:
                # A memory-only share takes no fixed compute slice: it competes for compute (soft).
                milli = 1
        if count is not None and count > 1 and (milli < MILLI_PER_GPU or memory is not None):
            errors.append(f"{where}: a share (cores/memory) can only be asked for with {RESOURCE_GPU}: 1")
        if not errors and count is not None:
            gpu = GPURequest(
                count=count,
                milli=milli,
                memory_mib=memory,
                models=_csv(annotations, ANN_MODEL),
                include_uuids=_csv(annotations, ANN_UUID),
                exclude_uuids=_csv(annotations, ANN_EXCLUDE),
            )
    if errors:
        return ParsedPod(None, isolation, errors, container_name)
    policy = annotations.get(ANN_POLICY)
    request = PodRequest(key=pod_key(pod), cpu_milli=cpu, memory_mib=mem, gpu=gpu, policy=policy or None)
    return ParsedPod(request, isolation, [], container_name)
