"""The one reader of what a Kubernetes pod asks of gpupool: its resources and its annotations.

Webhook, scheduler, agent and exporter all read pods through `parse_pod`, so that a pod means the same
thing to each of them. The rules:

* Quantities are read as the API server writes them (`gpupool.api.quantity`): `10Gi`, `16G`, `10240`,
  `1e3`, `500m`. `gpupool.io/gpu-memory` without a unit is MiB (gpupool's unit for it); container
  `memory` without a unit is bytes (Kubernetes' unit).
* For extended resources (gpupool.io/*) limits are authoritative (Kubernetes requires requests to equal
  them); for cpu and memory the request counts, and a limit stands in for a missing request (the API
  server defaults it so).
* The pod's effective request is Kubernetes' rule (KEP-753, as the scheduler and kubelet compute it), for
  each resource separately: max(sum over app containers and sidecars, for each init container: its
  request plus the sidecars started before it). A sidecar is an init container with
  `restartPolicy: Always`: it keeps running beside the app containers, so it adds to their sum.
* The runtime a pod's image needs is the annotation `gpupool.io/runtime` (cuda, rocm, cann or any; see
  `RUNTIME_DOC` below for what a pod that says nothing gets). Placement puts the pod only on cards whose
  vendor runs it (gpupool.core.fit).
* Several containers may ask for GPUs (see `GPU_CONTAINERS_DOC` below for what is supported without the
  placement engine knowing about containers); each GPU container's own request is kept in
  `ParsedPod.containers` so that the allocation can say which container holds what.

Errors are collected, not raised: the webhook shows them all at once and the scheduler rejects the pod
on every node with the same text. Every error starts with where it is (`container main: ...`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from gpupool.api.isolation import IsolationMode
from gpupool.api.names import (
    ANN_EXCLUDE,
    ANN_ISOLATION,
    ANN_MIG_PROFILE,
    ANN_MODEL,
    ANN_POLICY,
    ANN_RUNTIME,
    ANN_UUID,
    DEFAULT_ISOLATION,
    ISOLATION_MODES,
    RESOURCE_CORES,
    RESOURCE_GPU,
    RESOURCE_MEMORY,
)
from gpupool.api.quantity import QuantityError, cpu_milli, gpu_memory_mib, memory_mib, whole_number
from gpupool.core.model import MILLI_PER_GPU, RUNTIMES, GPURequest, PodRequest
from gpupool.core.vendors import AMD, ASCEND, NVIDIA, RUNTIME_OF_VENDOR, vendor_of_model

GPUPOOL_RESOURCES = (RESOURCE_GPU, RESOURCE_MEMORY, RESOURCE_CORES)


# The vendors' own device-plugin resources: a pod that asks for one of them runs that vendor's runtime.
# Ascend's names carry the chip (huawei.com/Ascend910, huawei.com/Ascend310P, ...): matched by prefix.
VENDOR_RESOURCES: tuple[tuple[str, str], ...] = (
    ("nvidia.com/gpu", NVIDIA),
    ("amd.com/gpu", AMD),
    ("huawei.com/Ascend", ASCEND),
)

RUNTIME_DOC = """\
A pod says the runtime its image needs with the annotation gpupool.io/runtime: cuda (NVIDIA cards), rocm
(AMD Instinct), cann (Ascend) or any (an image that carries several). A pod without it gets, in this order:
- the runtime of the vendor whose own resource a container asks for (nvidia.com/gpu: cuda, amd.com/gpu:
  rocm, huawei.com/Ascend*: cann), when all such resources are of one vendor;
- else the runtime of the models gpupool.io/gpu-model names, when every one is in gpupool's catalogue and
  all are of one vendor (A100-80GB: cuda, MI300X: rocm);
- else none: the pod may use any card, as every pod could before AMD and Ascend cards joined (a cluster of
  NVIDIA cards places it exactly as before). In a cluster with several vendors, say the runtime."""

# Kinds of container, as they are named in errors and in the allocation annotation.
APP = "container"
INIT = "init container"
SIDECAR = "sidecar"

GPU_CONTAINERS_DOC = """\
Several containers of one pod may ask for GPUs when either
- every GPU container asks for whole GPUs (no gpu-cores below 100, no gpu-memory): the pod takes as many
  GPUs as its effective request says (app containers and sidecars add up, init containers reuse them),
  and each running container gets its own GPUs; or
- every GPU container asks for a share of one GPU (gpu: 1 with gpu-cores and/or gpu-memory), all with
  gpu-memory or all without it: the pod takes one GPU with the effective share (running containers add
  up, at most 100 % of the GPU) and each container gets its own part of it.
Anything else (whole GPUs in one container and a share in another, memory given in some containers only)
is refused with the reason."""


@dataclass(frozen=True, slots=True)
class ContainerGPU:
    """One container's own GPU request (per GPU: `milli` compute, `memory_mib` memory or None = the
    same fraction of the card as the compute)."""

    name: str
    kind: str  # APP, INIT or SIDECAR
    count: int
    milli: int = MILLI_PER_GPU
    memory_mib: int | None = None

    @property
    def whole(self) -> bool:
        return self.milli >= MILLI_PER_GPU and self.memory_mib is None

    @property
    def runs_with_app(self) -> bool:
        """Whether it runs beside the app containers (app containers and sidecars do; init ones finish first)."""
        return self.kind != INIT


@dataclass(frozen=True, slots=True)
class ParsedPod:
    request: PodRequest | None  # None when errors is not empty
    isolation: str = DEFAULT_ISOLATION
    errors: list[str] = field(default_factory=list)
    container: str | None = None  # the (first) container that asks for GPUs
    containers: tuple[ContainerGPU, ...] = ()  # every container that asks for GPUs, in start order


@dataclass(frozen=True, slots=True)
class Container:
    """A container of a pod, in start order: its kind (APP, INIT or SIDECAR) and where it stands in the
    spec (`spec.<field>[index]`, the path a patch of it names)."""

    name: str
    kind: str
    field: str  # "initContainers" or "containers"
    index: int
    body: Mapping[str, Any]


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def pod_annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def _is_map(value: object) -> TypeGuard[Mapping[str, Any]]:
    # dict first: pods are decoded JSON, and an ABC isinstance check costs several times more.
    return type(value) is dict or isinstance(value, Mapping)


def _is_sidecar(container: Mapping[str, Any]) -> bool:
    return container.get("restartPolicy") == "Always"


def containers(pod: Mapping[str, Any]) -> list[Container]:
    """Init containers (with sidecars among them, in order), then app containers: the order kubelet starts
    them and calls Allocate for them. Entries that are not objects are passed over."""
    spec = pod.get("spec") or {}
    out: list[Container] = []
    for field_name in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(field_name) or []):
            if _is_map(c):
                kind = APP if field_name == "containers" else SIDECAR if _is_sidecar(c) else INIT
                out.append(Container(str(c.get("name", "?")), kind, field_name, i, c))
    return out


def resource_section(container: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A container's `resources.<name>` ("requests" or "limits"), {} when absent or not an object."""
    res = container.get("resources") or {}
    value = res.get(name) if _is_map(res) else None
    return value if _is_map(value) else {}


def gpupool_resources(container: Mapping[str, Any]) -> dict[str, Any]:
    """gpupool resources of a container: limits are authoritative (requests must equal them)."""
    merged: dict[str, Any] = dict(resource_section(container, "requests"))
    merged.update(resource_section(container, "limits"))
    return {k: v for k, v in merged.items() if k in GPUPOOL_RESOURCES}


def gpu_count(container: Container) -> int | None:
    """How many gpupool.io/gpu the container asks for (what kubelet's Allocate for it carries), None when it
    asks for none; QuantityError when the value is not a whole number."""
    value = gpupool_resources(container.body).get(RESOURCE_GPU)
    return None if value is None else whole_number(value, RESOURCE_GPU)


def _request(container: Mapping[str, Any], resource: str) -> Any:
    """A cpu/memory request, or the limit when no request is written (the API server's defaulting)."""
    requests = resource_section(container, "requests")
    return requests[resource] if resource in requests else resource_section(container, "limits").get(resource)


def wants_gpu(pod: Mapping[str, Any]) -> bool:
    """Whether any container (init containers and sidecars included) asks for a gpupool resource."""
    return any(gpupool_resources(c.body) for c in containers(pod))


def effective(values: Sequence[tuple[str, int]]) -> int:
    """Kubernetes' effective request of one resource from (kind, amount) in start order: max(sum of app
    containers and sidecars, each init container plus the sidecars started before it)."""
    running = sidecars = init_peak = 0
    for kind, amount in values:
        if kind == SIDECAR:
            running += amount
            sidecars += amount
            init_peak = max(init_peak, sidecars)
        elif kind == INIT:
            init_peak = max(init_peak, amount + sidecars)
        else:
            running += amount
    return max(running, init_peak)


def parse_cpu_milli(value: Any) -> int:
    """CPU in milli-cores (`2`, `500m`, `0.5`); kept for callers that read a node's allocatable."""
    return cpu_milli(value)


def annotation_set(annotations: Mapping[str, Any], key: str) -> frozenset[str]:
    """A comma-separated annotation (GPU models, UUIDs) as a set; blank entries and a missing key: none."""
    raw = annotations.get(key) or ""
    return frozenset(p.strip() for p in str(raw).split(",") if p.strip())


def vendor_resources(pod: Mapping[str, Any]) -> dict[str, str]:
    """The vendors' own device-plugin resources any container (init and sidecars included) asks for, by
    resource name -> vendor."""
    out: dict[str, str] = {}
    for c in containers(pod):
        for section in ("requests", "limits"):
            for name in resource_section(c.body, section):
                for prefix, vendor in VENDOR_RESOURCES:
                    if str(name).startswith(prefix):
                        out[str(name)] = vendor
    return out


def pod_runtime(pod: Mapping[str, Any], errors: list[str]) -> str | None:
    """The runtime the pod needs (RUNTIME_DOC): its annotation, else what its vendor resources or models
    imply, else None (any card). An unknown annotation value is appended to `errors`."""
    raw = pod_annotations(pod).get(ANN_RUNTIME)
    said = str(raw).strip().lower() if raw is not None else ""
    if said:
        if said not in RUNTIMES:
            errors.append(f"annotation {ANN_RUNTIME}={str(raw)[:40]!r}: use one of {', '.join(RUNTIMES)}")
            return None
        return said
    vendors = set(vendor_resources(pod).values())
    if not vendors:
        models = annotation_set(pod_annotations(pod), ANN_MODEL)
        of_models = {vendor_of_model(m) for m in models}
        vendors = {v for v in of_models if v is not None} if models and None not in of_models else set()
    return RUNTIME_OF_VENDOR.get(vendors.pop()) if len(vendors) == 1 else None


def _container_gpu(s: Container, res: Mapping[str, Any], errors: list[str]) -> ContainerGPU | None:
    """One container's GPU request, or None with the problems appended to `errors`."""
    where = f"{s.kind} {s.name}"
    before = len(errors)
    count: int | None = None
    if RESOURCE_GPU not in res:
        errors.append(f"{where}: {RESOURCE_MEMORY}/{RESOURCE_CORES} need {RESOURCE_GPU} (how many GPUs)")
    else:
        try:
            count = whole_number(res[RESOURCE_GPU], RESOURCE_GPU)
        except QuantityError as e:
            errors.append(f"{where}: {e}")
        if count is not None and count <= 0:
            errors.append(f"{where}: {RESOURCE_GPU} must be at least 1, got {count}")
    milli = MILLI_PER_GPU
    if RESOURCE_CORES in res:
        try:
            cores = whole_number(res[RESOURCE_CORES], RESOURCE_CORES)
        except QuantityError as e:
            errors.append(f"{where}: {e}")
        else:
            if not 0 < cores <= 100:
                errors.append(f"{where}: {RESOURCE_CORES}={cores} must be between 1 and 100 (percent of one GPU)")
            else:
                milli = cores * 10
    memory: int | None = None
    if RESOURCE_MEMORY in res:
        try:
            memory = gpu_memory_mib(res[RESOURCE_MEMORY], RESOURCE_MEMORY)
        except QuantityError as e:
            errors.append(f"{where}: {e}")
        else:
            if memory <= 0:
                errors.append(f"{where}: {RESOURCE_MEMORY}={memory} must be a positive number of MiB")
            elif RESOURCE_CORES not in res:
                # A memory-only share takes no fixed compute slice: it competes for compute (soft).
                milli = 1
    if count is not None and count > 1 and (milli < MILLI_PER_GPU or memory is not None):
        errors.append(f"{where}: a share (cores/memory) can only be asked for with {RESOURCE_GPU}: 1")
    if len(errors) > before or count is None:
        return None
    return ContainerGPU(s.name, s.kind, count, milli, memory)


def _pod_gpu(containers: Sequence[ContainerGPU], errors: list[str]) -> tuple[int, int, int | None] | None:
    """The pod's one uniform request (count, milli, memory) that covers every GPU container, or None
    with the reason why the placement engine cannot express it (see GPU_CONTAINERS_DOC)."""
    if len(containers) == 1:
        c = containers[0]
        return c.count, c.milli, c.memory_mib
    names = ", ".join(f"{c.kind} {c.name}" for c in containers)
    if all(c.whole for c in containers):
        return effective([(c.kind, c.count) for c in containers]), MILLI_PER_GPU, None
    if any(c.whole for c in containers):
        errors.append(
            f"containers asking for GPUs ({names}) mix whole GPUs and shares of a GPU; a pod's containers "
            "must all ask for whole GPUs or all for shares of one GPU"
        )
        return None
    with_memory = [c.memory_mib is not None for c in containers]
    if any(with_memory) and not all(with_memory):
        errors.append(
            f"containers asking for GPU shares ({names}): give {RESOURCE_MEMORY} in all of them or in none "
            "(they share one GPU, and a share without memory means a fraction of the card)"
        )
        return None
    milli = effective([(c.kind, c.milli) for c in containers])
    if milli > MILLI_PER_GPU:
        errors.append(
            f"containers asking for GPU shares ({names}) run together with {milli / 10:g} % of one GPU's "
            "compute, more than 100 %; the shares of one pod are placed on one GPU"
        )
        return None
    memory = effective([(c.kind, c.memory_mib or 0) for c in containers]) if all(with_memory) else None
    return 1, milli, memory


def _mig_problems(annotations: Mapping[str, str], isolation: str, containers: Sequence[ContainerGPU]) -> list[str]:
    """What isolation `mig` cannot serve. A pod gets one MIG instance, handed to one container: the
    instance is a device of its own (several would be several devices, which the grant cannot name per
    container), so more GPUs or several GPU containers are refused rather than half served. Which
    profile fits is the model's question (gpupool.core.mig_request.profile_for), not the reader's."""
    out: list[str] = []
    named = str(annotations.get(ANN_MIG_PROFILE, "")).strip()
    if named and isolation != IsolationMode.MIG:
        out.append(f"annotation {ANN_MIG_PROFILE}={named!r} needs {ANN_ISOLATION}: mig (it is {isolation!r})")
    if isolation != IsolationMode.MIG or not containers:
        return out
    if len(containers) > 1:
        names = ", ".join(f"{c.kind} {c.name}" for c in containers)
        out.append(f"{ANN_ISOLATION}=mig gives a pod one MIG instance for one container, but {names} ask for GPUs")
    elif containers[0].count > 1:
        c = containers[0]
        out.append(f"{c.kind} {c.name}: {RESOURCE_GPU}={c.count} with {ANN_ISOLATION}=mig: a pod gets one MIG "
                   f"instance; ask for {RESOURCE_GPU}: 1 (or use whole GPUs without mig)")
    return out


def parse_pod(pod: Mapping[str, Any]) -> ParsedPod:
    """Translate a pod object (Kubernetes JSON shape) into a PodRequest, or the list of what is wrong."""
    errors: list[str] = []
    annotations = pod_annotations(pod)
    specs = containers(pod)

    cpus: list[tuple[str, int]] = []
    mems: list[tuple[str, int]] = []
    gpu_containers: list[ContainerGPU] = []
    for s in specs:
        where = f"{s.kind} {s.name}"
        try:
            raw_cpu, raw_mem = _request(s.body, "cpu"), _request(s.body, "memory")
            cpus.append((s.kind, 0 if raw_cpu is None else cpu_milli(raw_cpu)))
            mems.append((s.kind, 0 if raw_mem is None else memory_mib(raw_mem)))
        except QuantityError as e:
            errors.append(f"{where}: {e}")
        res = gpupool_resources(s.body)
        if res:
            one = _container_gpu(s, res, errors)
            if one is not None:
                gpu_containers.append(one)

    isolation = str(annotations.get(ANN_ISOLATION, DEFAULT_ISOLATION)).strip() or DEFAULT_ISOLATION
    if isolation not in ISOLATION_MODES:
        errors.append(f"annotation {ANN_ISOLATION}={isolation!r}: use one of {', '.join(ISOLATION_MODES)}")

    errors.extend(_mig_problems(annotations, isolation, gpu_containers))
    runtime = pod_runtime(pod, errors)
    asking = (s.name for s in specs if gpupool_resources(s.body))
    first = gpu_containers[0].name if gpu_containers else next(asking, None)
    shape = _pod_gpu(gpu_containers, errors) if gpu_containers and not errors else None
    if errors:
        return ParsedPod(None, isolation, errors, first, tuple(gpu_containers))
    # The runtime is kept on a pod without gpupool resources too: its DRA claims are placed for it.
    gpu = GPURequest(count=0, runtime=runtime)
    if shape is not None:
        count, milli, memory = shape
        gpu = GPURequest(
            count=count,
            milli=milli,
            memory_mib=memory,
            models=annotation_set(annotations, ANN_MODEL),
            include_uuids=annotation_set(annotations, ANN_UUID),
            exclude_uuids=annotation_set(annotations, ANN_EXCLUDE),
            runtime=runtime,
            isolation=isolation,
        )
    policy = annotations.get(ANN_POLICY)
    request = PodRequest(
        key=pod_key(pod), cpu_milli=effective(cpus), memory_mib=effective(mems), gpu=gpu, policy=policy or None
    )
    return ParsedPod(request, isolation, [], first, tuple(gpu_containers))
