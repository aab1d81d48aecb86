"""Admission decisions for pods, as pure functions of the AdmissionReview (no I/O, no clock).

Mutating (`mutate`): for pods that ask for gpupool resources, route them to the gpupool scheduler, write
GPU memory in MiB (`10Gi` -> `10240`), make a whole-GPU request explicit (`gpu-cores: 100`) and record
the default isolation mode. Validating (`validate`): refuse what could never be scheduled or would
break accounting, with one message that lists every problem and where it is.

Both run the same checks, so a pod is refused by whichever webhook sees it first with the same text.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.names import (
    ANN_ALLOCATED,
    ANN_ALLOCATION,
    ANN_EXCLUDE,
    ANN_ISOLATION,
    ANN_MODEL,
    ANN_POLICY,
    ANN_UUID,
    DOMAIN,
    RESOURCE_CORES,
    RESOURCE_GPU,
    RESOURCE_MEMORY,
)
from gpupool.api.pod import parse_pod, pod_key, wants_gpu
from gpupool.core.model import GPURequest
from gpupool.core.policies import policy_names
from gpupool.core.quantity import QuantityError, parse_memory_mib
from gpupool.webhook.inventory import Limits
from gpupool.webhook.patch import Patcher

API_VERSION = "admission.k8s.io/v1"
# Annotations only gpupool components write: the scheduler's grant and the agent's "devices handed out"
# mark. A user who sets or edits them could make the ledger or the node agent act on a forged record.
RESERVED_ANNOTATIONS = (ANN_ALLOCATION, ANN_ALLOCATED)
# Valid names the node agent cannot serve yet: refusing at admission beats a pod that fails on its node.
UNSUPPORTED_ISOLATION = {
    "mig": "MIG isolation is not implemented by the gpupool node agent yet (use mps, hook or none)"
}
KIND = "AdmissionReview"
DEFAULT_SCHEDULER = "default-scheduler"


class ReviewError(ValueError):
    """The AdmissionReview itself is malformed (answered with HTTP 400, not with a denial)."""


@dataclass(frozen=True, slots=True)
class Settings:
    scheduler_name: str = "gpupool-scheduler"
    default_isolation: str = "hook"  # "" = do not write the annotation
    trusted_users: frozenset[str] = frozenset()
    allow_privileged: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    message: str = ""
    code: int = 200
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _containers(pod: Mapping[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    spec = pod.get("spec") or {}
    out: list[tuple[str, int, dict[str, Any]]] = []
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            out.append((kind, i, c))
    return out


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def touches_gpupool(pod: Mapping[str, Any]) -> bool:
    """Whether the pod asks for a gpupool resource or carries a gpupool annotation (only those pods are
    the webhook's business; the configurations' matchConditions send no others)."""
    return wants_gpu(pod) or any(str(k).startswith(DOMAIN + "/") for k in _annotations(pod))


# --- mutation ---------------------------------------------------------------------------------------------


def _normalise(pod: dict[str, Any], patcher: Patcher, errors: list[str]) -> None:
    """GPU memory in MiB; whole-GPU requests made explicit. Edits `pod` through `patcher`."""
    for kind, i, c in _containers(pod):
        resources = c.get("resources") or {}
        where = f"{'init container' if kind == 'initContainers' else 'container'} {c.get('name', i)}"
        for section in ("limits", "requests"):
            values = resources.get(section) or {}
            if RESOURCE_MEMORY not in values:
                continue
            raw = values[RESOURCE_MEMORY]
            try:
                mib = parse_memory_mib(str(raw))
            except QuantityError as e:
                errors.append(f"{where}: {RESOURCE_MEMORY}: {e}")
                continue
            if str(mib) != str(raw):
                patcher.set(("spec", kind, i, "resources", section, RESOURCE_MEMORY), str(mib))
        merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        if RESOURCE_GPU in merged and RESOURCE_CORES not in merged and RESOURCE_MEMORY not in merged:
            # No share given = the whole GPU (ARCHITECTURE: resource model); say so in the pod itself so
            # that every reader (scheduler, agent, `kubectl describe`) sees the same request.
            for section in ("limits", "requests"):
                if RESOURCE_GPU in (resources.get(section) or {}):
                    patcher.set(("spec", kind, i, "resources", section, RESOURCE_CORES), "100")


def _route(pod: dict[str, Any], settings: Settings, patcher: Patcher, errors: list[str]) -> None:
    current = (pod.get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER
    if current == settings.scheduler_name:
        return
    if current != DEFAULT_SCHEDULER:
        errors.append(
            f"spec.schedulerName={current!r}: pods asking for gpupool resources must be scheduled by "
            f"{settings.scheduler_name!r} (other schedulers do not account GPU shares)"
        )
        return
    patcher.set(("spec", "schedulerName"), settings.scheduler_name)


def mutate(pod: Mapping[str, Any], settings: Settings, limits: Limits | None, user: str = "") -> Decision:
    if not touches_gpupool(pod):
        return Decision(True)
    work = copy.deepcopy(dict(pod))
    patcher = Patcher(work)
    errors: list[str] = []
    if wants_gpu(work):
        _normalise(work, patcher, errors)
        _route(work, settings, patcher, errors)
        if settings.default_isolation and ANN_ISOLATION not in _annotations(work):
            patcher.set(("metadata", "annotations", ANN_ISOLATION), settings.default_isolation)
    if errors:
        return _deny(pod, errors, 422)
    decision = check_create(work, settings, limits, user)
    if not decision.allowed:
        return decision
    return Decision(True, patch=patcher.ops, warnings=decision.warnings)


# --- validation -------------------------------------------------------------------------------------------


def _deny(pod: Mapping[str, Any], errors: list[str], code: int) -> Decision:
    meta = pod.get("metadata") or {}
    name = meta.get("name") or f"{meta.get('generateName', '')}<generated>"
    who = f"{meta.get('namespace') or 'default'}/{name}"
    return Decision(False, f"gpupool refused pod {who}: " + "; ".join(errors), code)


def _capacity_problems(limits: Limits, request_gpu: GPURequest, warnings: list[str]) -> list[str]:
    """Requests no GPU or node in the inventory could hold. A model nobody has yet is only a warning:
    an autoscaler may add such nodes later."""
    out: list[str] = []
    if request_gpu.count > limits.most_gpus_on_a_node:
        out.append(
            f"{RESOURCE_GPU}={request_gpu.count}: no node has that many GPUs "
            f"(largest node has {limits.most_gpus_on_a_node})"
        )
    models = request_gpu.models
    known = {m: limits.largest_by_model[m] for m in models if m in limits.largest_by_model}
    if models and not known:
        warnings.append(
            f"gpupool: annotation {ANN_MODEL}={','.join(sorted(models))}: no such GPU model in the cluster "
            f"yet (known: {', '.join(sorted(limits.largest_by_model))}); the pod waits until one joins"
        )
        return out
    memory = request_gpu.memory_mib
    if memory is None:
        return out
    if models and memory > max(known.values()):
        out.append(
            f"{RESOURCE_MEMORY}={memory} MiB is more than any {'/'.join(sorted(known))} GPU has "
            f"(largest: {max(known.values())} MiB)"
        )
    elif not models and memory > limits.largest_memory_mib:
        out.append(
            f"{RESOURCE_MEMORY}={memory} MiB is more than any GPU in the cluster has "
            f"(largest: {limits.largest_memory_mib} MiB)"
        )
    return out


def _annotation_problems(pod: Mapping[str, Any], user: str, settings: Settings) -> list[str]:
    annotations = _annotations(pod)
    out: list[str] = []
    if user not in settings.trusted_users:
        for key in RESERVED_ANNOTATIONS:
            if key in annotations:
                out.append(f"annotation {key} is written by gpupool itself (scheduler or node agent) only; remove it")
    if str(annotations.get(ANN_ISOLATION, "")).strip() in UNSUPPORTED_ISOLATION:
        mode = str(annotations[ANN_ISOLATION]).strip()
        out.append(f"annotation {ANN_ISOLATION}={mode!r}: {UNSUPPORTED_ISOLATION[mode]}")
    policy = annotations.get(ANN_POLICY)
    if policy is not None and policy not in policy_names():
        out.append(f"annotation {ANN_POLICY}={policy!r}: unknown policy (use one of {', '.join(policy_names())})")
    include, exclude = (_csv(annotations.get(k)) for k in (ANN_UUID, ANN_EXCLUDE))
    if include and include <= exclude:
        out.append(f"annotations {ANN_UUID} and {ANN_EXCLUDE}: every allowed GPU is also excluded")
    return out


def _csv(value: Any) -> frozenset[str]:
    return frozenset(p.strip() for p in str(value or "").split(",") if p.strip())


def _spec_problems(pod: Mapping[str, Any], settings: Settings) -> list[str]:
    out: list[str] = []
    spec = pod.get("spec") or {}
    scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULER
    if scheduler != settings.scheduler_name:
        out.append(f"spec.schedulerName={scheduler!r}: must be {settings.scheduler_name!r} for gpupool pods")
    if spec.get("nodeName"):
        out.append(
            f"spec.nodeName={spec['nodeName']!r}: a GPU pod must go through the gpupool scheduler, "
            "which picks the node and the GPU share; use a nodeSelector instead"
        )
    for volume in spec.get("volumes") or []:
        path = str((volume.get("hostPath") or {}).get("path", ""))
        if path.rstrip("/") == "/dev" or path.startswith("/dev/nvidia"):
            out.append(f"volume {volume.get('name')}: hostPath {path} exposes GPU devices outside the pool's grant")
    if not settings.allow_privileged:
        for kind, i, c in _containers(pod):
            if (c.get("securityContext") or {}).get("privileged") is True:
                out.append(
                    f"{'init container' if kind == 'initContainers' else 'container'} {c.get('name', i)}: "
                    "privileged containers see every GPU of the node, which defeats sharing"
                )
    return out


def check_create(pod: Mapping[str, Any], settings: Settings, limits: Limits | None, user: str) -> Decision:
    """Everything that makes a new pod unacceptable; allowed (maybe with warnings) otherwise."""
    if not touches_gpupool(pod):
        return Decision(True)
    errors = _annotation_problems(pod, user, settings)
    parsed = parse_pod(pod)
    errors.extend(parsed.errors)
    warnings: list[str] = []
    if wants_gpu(pod):
        errors.extend(_spec_problems(pod, settings))
        if parsed.request is not None:
            if limits is None:
                warnings.append("gpupool: GPU inventory not known yet; request not checked against GPU sizes")
            else:
                errors.extend(_capacity_problems(limits, parsed.request.gpu, warnings))
    if errors:
        # 403 when the pod tries to write what only the scheduler may; 422 for an impossible request.
        forbidden = any(k in _annotations(pod) for k in RESERVED_ANNOTATIONS) and user not in settings.trusted_users
        return _deny(pod, errors, 403 if forbidden else 422)
    return Decision(True, warnings=warnings)


def check_update(pod: Mapping[str, Any], old: Mapping[str, Any], settings: Settings, user: str) -> Decision:
    """Pod specs are (nearly) immutable; what a user could still break is the allocation record."""
    if user in settings.trusted_users:
        return Decision(True)
    new, before = _annotations(pod), _annotations(old)
    changed = [k for k in RESERVED_ANNOTATIONS if new.get(k) != before.get(k)]
    if changed:
        return _deny(
            pod,
            [
                f"annotation {k} is written by gpupool itself (scheduler or node agent) only; leave it unchanged"
                for k in changed
            ],
            403,
        )
    return Decision(True)


# --- AdmissionReview in and out ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    uid: str
    operation: str
    kind: str
    user: str
    obj: Mapping[str, Any] | None
    old: Mapping[str, Any] | None


def parse_review(body: Any) -> Request:
    """Check the envelope; the messages name the field that is wrong."""
    if not isinstance(body, dict):
        raise ReviewError(f"expected a JSON object (an AdmissionReview), got {type(body).__name__}")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != KIND:
        raise ReviewError(
            f"expected apiVersion {API_VERSION} kind {KIND}, got {body.get('apiVersion')!r} {body.get('kind')!r}"
        )
    req = body.get("request")
    if not isinstance(req, dict):
        raise ReviewError("request: missing or not an object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid: missing or not a string")
    for key in ("object", "oldObject"):
        if req.get(key) is not None and not isinstance(req.get(key), dict):
            raise ReviewError(f"request.{key}: expected an object")
    kind = (req.get("kind") or {}).get("kind", "") if isinstance(req.get("kind"), dict) else ""
    user = (req.get("userInfo") or {}).get("username", "") if isinstance(req.get("userInfo"), dict) else ""
    return Request(uid, str(req.get("operation", "")), str(kind), str(user), req.get("object"), req.get("oldObject"))


def decide(request: Request, mutating: bool, settings: Settings, limits: Limits | None) -> Decision:
    if request.kind != "Pod" or request.obj is None:
        return Decision(True)  # not ours (a misrouted rule must not block the cluster)
    if request.operation == "CREATE":
        if mutating:
            return mutate(request.obj, settings, limits, request.user)
        return check_create(request.obj, settings, limits, request.user)
    if request.operation == "UPDATE" and not mutating and request.old is not None:
        return check_update(request.obj, request.old, settings, request.user)
    return Decision(True)


def response(uid: str, decision: Decision) -> dict[str, Any]:
    resp: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        resp["status"] = {"code": decision.code, "message": decision.message}
    if decision.patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(json.dumps(decision.patch, separators=(",", ":")).encode()).decode()
    if decision.warnings:
        resp["warnings"] = decision.warnings
    return {"apiVersion": API_VERSION, "kind": KIND, "response": resp}


def key_of(request: Request) -> str:
    return pod_key(request.obj or {})
