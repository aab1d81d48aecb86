"""Admission decisions for pods, as pure functions of the AdmissionReview (no I/O, no clock).

Mutating (`mutate`): for pods that ask for gpupool resources, route them to the gpupool scheduler, write
GPU memory in MiB (`10Gi` -> `10240`), make a whole-GPU request explicit (`gpu-cores: 100`) and record
the default isolation mode. Validating (`validate`): refuse what could never be scheduled or would
break accounting, with one message that lists every problem and where it is. A pod with isolation `mig`
is checked against the GPU models the inventories show: some MIG-capable model it may use must have a
profile for its request (gpupool.core.mig_request.profile_for, the rule the scheduler applies per GPU). A
pod's runtime (gpupool.io/runtime, or what its resources and models imply) must be one its vendor resources,
models, isolation and share can have (`_runtime_problems`).

Both run the same checks, so a pod is refused by whichever webhook sees it first with the same text.
Every pod (GPU or not) is also checked for what no container may bring (`forbidden`), under the
namespace's admission policy (`policy`: isolation modes, strict mode, host access). Ephemeral containers
added later (`pods/ephemeralcontainers`) get the same checks, and updates may not change the isolation.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.dra import CLASS_OF_ISOLATION, SCHEDULING_GATE, TEMPLATE_CLAIM, template_name
from gpupool.api.isolation import IsolationMode
from gpupool.api.logsafe import shown
from gpupool.api.names import (
    ANN_ALLOCATED,
    ANN_ALLOCATION,
    ANN_EXCLUDE,
    ANN_ISOLATION,
    ANN_MIG_PROFILE,
    ANN_MODEL,
    ANN_POLICY,
    ANN_RUNTIME,
    ANN_UUID,
    DOMAIN,
    RESOURCE_CORES,
    RESOURCE_GPU,
    RESOURCE_MEMORY,
)
from gpupool.api.pod import (
    GPUPOOL_RESOURCES,
    ParsedPod,
    annotation_set,
    containers,
    gpupool_resources,
    parse_pod,
    pod_annotations,
    pod_key,
    resource_section,
    vendor_resources,
    wants_gpu,
)
from gpupool.api.quantity import QuantityError, gpu_memory_mib
from gpupool.core.mig import known_models, mig_model
from gpupool.core.mig_request import ProfileRefusal, profile_for
from gpupool.core.model import MILLI_PER_GPU, GPURequest
from gpupool.core.policies import policy_names
from gpupool.core.vendors import ANY_RUNTIME, ASCEND, CUDA, RUNTIME_OF_VENDOR, SHARE_MODES, holds, runtime_of_model
from gpupool.webhook.forbidden import pod_problems
from gpupool.webhook.inventory import Limits
from gpupool.webhook.patch import Patcher
from gpupool.webhook.policy import DEFAULT_POLICY, AdmissionPolicy, judge_isolation, make_policy

API_VERSION = "admission.k8s.io/v1"
# Annotations only gpupool components write: the scheduler's grant and the agent's "devices handed out"
# mark. A user who sets or edits them could make the ledger or the node agent act on a forged record.
RESERVED_ANNOTATIONS = (ANN_ALLOCATION, ANN_ALLOCATED)
KIND = "AdmissionReview"
DEFAULT_SCHEDULER = "default-scheduler"


class ReviewError(ValueError):
    """The AdmissionReview itself is malformed (answered with HTTP 400, not with a denial)."""


class UnknownPolicy(LookupError):
    """A webhook path names a policy the configuration does not have (a chart/config mismatch)."""


@dataclass(frozen=True, slots=True)
class Settings:
    scheduler_name: str = "gpupool-scheduler"
    default_isolation: str = IsolationMode.HOOK.value  # "" = do not write the annotation
    trusted_users: frozenset[str] = frozenset()
    allow_privileged: bool = False  # the default policy's host access (privileged, /dev mounts, ...)
    dra_placement: bool = False  # gate pods with ResourceClaims so gpupool places their claims (claims_gate)
    # The default namespace policy; None = built from default_isolation and allow_privileged.
    default_policy: AdmissionPolicy | None = None
    policies: Mapping[str, AdmissionPolicy] = field(default_factory=dict)  # by the name in the webhook path

    def policy(self, name: str | None = None) -> AdmissionPolicy:
        if name:
            if name in self.policies:
                return self.policies[name]
            if name != DEFAULT_POLICY:
                raise UnknownPolicy(f"no admission policy named {shown(name)!r} in the webhook configuration")
        if self.default_policy is not None:
            return self.default_policy
        return make_policy(DEFAULT_POLICY, self.default_isolation or IsolationMode.HOOK.value,
                           allow_host_access=self.allow_privileged)


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    message: str = ""
    code: int = 200
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def touches_gpupool(pod: Mapping[str, Any]) -> bool:
    """Whether the pod asks for a gpupool resource or carries a gpupool annotation (only those pods are
    the webhook's business; the configurations' matchConditions send no others)."""
    return wants_gpu(pod) or any(str(k).startswith(DOMAIN + "/") for k in pod_annotations(pod))


# --- mutation ---------------------------------------------------------------------------------------------


def _normalise(pod: dict[str, Any], patcher: Patcher, errors: list[str]) -> None:
    """GPU memory in MiB; whole-GPU requests made explicit. Edits `pod` through `patcher`."""
    for c in containers(pod):
        kind = "init container" if c.field == "initContainers" else "container"
        where = f"{kind} {shown(c.body.get('name', c.index))}"
        resources = ("spec", c.field, c.index, "resources")
        for section in ("limits", "requests"):
            values = resource_section(c.body, section)
            if RESOURCE_MEMORY not in values:
                continue
            raw = values[RESOURCE_MEMORY]
            try:
                mib = gpu_memory_mib(raw)
            except QuantityError as e:
                errors.append(f"{where}: {e}")
                continue
            if str(mib) != str(raw):
                patcher.set((*resources, section, RESOURCE_MEMORY), str(mib))
        asked = gpupool_resources(c.body)
        if RESOURCE_GPU in asked and RESOURCE_CORES not in asked and RESOURCE_MEMORY not in asked:
            # No share given = the whole GPU (ARCHITECTURE: resource model); say so in the pod itself so
            # that every reader (scheduler, agent, `kubectl describe`) sees the same request.
            for section in ("limits", "requests"):
                if RESOURCE_GPU in resource_section(c.body, section):
                    patcher.set((*resources, section, RESOURCE_CORES), "100")


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


def _isolation(work: dict[str, Any], settings: Settings, policy: AdmissionPolicy, patcher: Patcher,
               warnings: list[str]) -> None:
    """Write the namespace's default isolation into pods without one, and raise a weaker choice to it
    when the policy says so (refusals are check_create's)."""
    verdict = judge_isolation(pod_annotations(work), policy, mutating=True)
    if verdict.raised_from:
        patcher.set(("metadata", "annotations", ANN_ISOLATION), verdict.mode)
        warnings.append(
            f"gpupool: annotation {ANN_ISOLATION}={verdict.raised_from!r} is weaker than the policy "
            f"{policy.name!r} of this namespace allows; the pod runs with {verdict.mode!r}"
        )
    elif ANN_ISOLATION not in pod_annotations(work) and (policy.name != DEFAULT_POLICY or settings.default_isolation):
        patcher.set(("metadata", "annotations", ANN_ISOLATION), policy.default_isolation)


def _gate(work: dict[str, Any], settings: Settings, patcher: Patcher) -> None:
    """Put gpupool's scheduling gate on a pod with ResourceClaims (gpupool.scheduler.claims allocates them,
    or hands them to kube-scheduler, and removes it). Pods asking for gpupool resources through the device
    plugin are placed by the extender and never gated."""
    spec = work.get("spec") or {}
    gates = list(spec.get("schedulingGates") or [])
    if settings.dra_placement and spec.get("resourceClaims") and not wants_gpu(work) \
            and not any(g.get("name") == SCHEDULING_GATE for g in gates):
        patcher.set(("spec", "schedulingGates"), [*gates, {"name": SCHEDULING_GATE}])


def claims_gate(pod: Mapping[str, Any], settings: Settings) -> list[dict[str, Any]]:
    """The patch `_gate` makes on `pod` ([] when it makes none)."""
    patcher = Patcher(copy.deepcopy(dict(pod)))
    _gate(patcher.doc, settings, patcher)
    return patcher.ops


def mutate(pod: Mapping[str, Any], settings: Settings, limits: Limits | None, user: str = "",
           policy: AdmissionPolicy | None = None) -> Decision:
    policy = policy or settings.policy()
    if not touches_gpupool(pod):
        decision = check_create(pod, settings, limits, user, policy)
        gate = claims_gate(pod, settings) if decision.allowed else []
        return Decision(True, patch=gate, warnings=decision.warnings) if gate else decision
    work = copy.deepcopy(dict(pod))
    patcher = Patcher(work)
    errors: list[str] = []
    warnings: list[str] = []
    if wants_gpu(work):
        _normalise(work, patcher, errors)
        _route(work, settings, patcher, errors)
        _isolation(work, settings, policy, patcher, warnings)
    if errors:
        return _deny(pod, errors, 422)
    decision = check_create(work, settings, limits, user, policy)
    if not decision.allowed:
        return decision
    if policy.dra and wants_gpu(work):
        problem = to_claims(work, patcher)
        if problem:
            return _deny(pod, [problem], 422)
    else:
        _gate(work, settings, patcher)  # claims of a pod that carries a gpupool annotation only
    return Decision(True, patch=patcher.ops, warnings=warnings + decision.warnings)


def to_claims(work: dict[str, Any], patcher: Patcher) -> str:
    """Serve a checked GPU pod through a DRA claim (the namespace policy's `dra`): its gpupool.io/*
    requests go, a claim from the ResourceClaimTemplate named for its share takes their place (the
    scheduler makes the template on first use: gpupool.api.dra.template_for), and the pod is gated for
    gpupool's claim allocator. Returns what makes the pod impossible to serve so, or ""."""
    parsed = parse_pod(work)
    if parsed.request is None or len(parsed.containers) != 1:
        return "the namespace serves GPU pods through DRA claims, which take one GPU container per pod"
    if parsed.isolation not in CLASS_OF_ISOLATION:
        return f"the namespace serves GPU pods through DRA claims, which have no isolation {parsed.isolation!r}"
    g = parsed.request.gpu
    if g.models or g.include_uuids or g.exclude_uuids:
        return (f"the namespace serves GPU pods through DRA claims, which do not carry {ANN_MODEL}, {ANN_UUID} "
                f"or {ANN_EXCLUDE}; write a claim with a CEL selector instead (docs/claims.md)")
    whole = g.memory_mib is None and g.milli >= MILLI_PER_GPU
    if parsed.isolation == IsolationMode.NONE and not whole:
        return "isolation none serves whole GPUs only through DRA claims"
    cores = 0 if g.milli < 10 else g.milli // 10  # a memory-only share (1 milli) reserves no compute
    template = template_name(parsed.isolation, g.count, None if whole else g.memory_mib, cores)
    spec = work["spec"]
    for c in containers(work):
        if c.body.get("name") != parsed.containers[0].name:
            continue
        resources = ("spec", c.field, c.index, "resources")
        for section in ("limits", "requests"):
            values = resource_section(c.body, section)
            if any(k in values for k in GPUPOOL_RESOURCES):
                patcher.set((*resources, section), {k: v for k, v in values.items() if k not in GPUPOOL_RESOURCES})
        claims = list((c.body.get("resources") or {}).get("claims") or [])
        patcher.set((*resources, "claims"), [*claims, {"name": TEMPLATE_CLAIM}])
    refs = list(spec.get("resourceClaims") or [])
    patcher.set(("spec", "resourceClaims"), [*refs, {"name": TEMPLATE_CLAIM, "resourceClaimTemplateName": template}])
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != SCHEDULING_GATE]
    patcher.set(("spec", "schedulingGates"), [*gates, {"name": SCHEDULING_GATE}])
    return ""


# --- validation -------------------------------------------------------------------------------------------


def _deny(pod: Mapping[str, Any], errors: list[str], code: int) -> Decision:
    meta = pod.get("metadata") or {}
    name = meta.get("name") or f"{meta.get('generateName', '')}<generated>"
    who = shown(f"{meta.get('namespace') or 'default'}/{name}")
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


def _mig_problems(limits: Limits, request_gpu: GPURequest, named: str | None) -> list[str]:
    """Isolation `mig`: some MIG-capable GPU model the pod may use must have a profile for it (the one
    rule, gpupool.core.mig_request.profile_for, that the scheduler applies per GPU). The models are
    those in the cluster the pod allows; when it names only models nobody has yet (a warning elsewhere:
    an autoscaler may add them), those models."""
    present = sorted(limits.largest_by_model)
    allowed = [m for m in present if not request_gpu.models or m in request_gpu.models]
    if request_gpu.models and not allowed:
        allowed = sorted(request_gpu.models)
    capable = [m for m in allowed if mig_model(m) is not None]
    where = f" among {', '.join(sorted(request_gpu.models))}" if request_gpu.models else ""
    if not capable:
        return [f"{ANN_ISOLATION}=mig: no GPU model{where} in the cluster supports MIG (the cluster has "
                f"{', '.join(present)}; MIG-capable: {', '.join(known_models())})"]
    refusals: list[str] = []
    for model in capable:
        found = profile_for(model, request_gpu, named)
        if not isinstance(found, ProfileRefusal):
            return []
        refusals.append(f"{model}: {found.reason}")
    return [f"{ANN_ISOLATION}=mig: no MIG profile serves this request on the cluster's GPUs ({'; '.join(refusals)})"]


def _runtime_problems(pod: Mapping[str, Any], parsed: ParsedPod) -> list[str]:
    """What the runtime a GPU pod needs (api.pod RUNTIME_DOC) makes impossible, in one place:
    - a vendor's own resource (nvidia.com/gpu, amd.com/gpu, huawei.com/Ascend*) whose cards do not run it;
    - models that are all gpupool-catalogued cards of other runtimes (the pod would fit no card);
    - isolation mps on anything but CUDA: MPS is NVIDIA's daemon (an "any" pod could land on other cards);
    - a compute or memory share with a runtime whose cards hold no share in any mode (the catalogue's
      core.vendors.ISOLATION_OF_VENDOR: cann, since Ascend has no sharing mechanism gpupool owns, only vNPU
      partitions and whole cards). A whole card under the default hook is accepted: nothing shares it, so
      nothing needs enforcing. An "any" share is accepted: placement keeps it to cards whose vendor holds its
      mode (core.fit), and it waits with that reason where none is free."""
    request = parsed.request
    runtime = request.gpu.runtime if request is not None else None
    if request is None or runtime is None:
        return []
    said = f"annotation {ANN_RUNTIME}={runtime}" if ANN_RUNTIME in pod_annotations(pod) else f"runtime {runtime}"
    out: list[str] = []
    if runtime != ANY_RUNTIME:
        for resource, vendor in sorted(vendor_resources(pod).items()):
            if RUNTIME_OF_VENDOR[vendor] != runtime:
                out.append(f"{said}: the pod asks for {resource}, whose cards run {RUNTIME_OF_VENDOR[vendor]}, "
                           f"not {runtime}")
        models = sorted(request.gpu.models)
        of_model = {m: runtime_of_model(m) for m in models}
        if models and all(r is not None and r != runtime for r in of_model.values()):
            shown_models = ", ".join(f"{m} runs {r}" for m, r in of_model.items())
            out.append(f"{said}: no GPU model {ANN_MODEL} names runs {runtime} ({shown_models})")
    if parsed.isolation == IsolationMode.MPS and runtime != CUDA:
        out.append(f"{said} with {ANN_ISOLATION}=mps: MPS is NVIDIA's and runs CUDA programs on NVIDIA cards only"
                   + ("; say runtime cuda for a pod that needs MPS" if runtime == ANY_RUNTIME else ""))
    unshared = _unshared_vendor(runtime)
    if unshared is not None and request.gpu.count and not request.gpu.whole:
        out.append(f"{said} with a share of a card ({RESOURCE_CORES}/{RESOURCE_MEMORY}): {unshared} cards are not "
                   "shared by gpupool; ask for whole cards" + (" or a vNPU partition" if unshared == "Ascend" else ""))
    return out


def _unshared_vendor(runtime: str) -> str | None:
    """The vendor (as written in messages) whose cards alone run `runtime` when they hold no share in any mode
    (the catalogue's ISOLATION_OF_VENDOR: Ascend, for cann); None when some card that runs it holds shares, or
    for "any", whose shares placement keeps to the cards that hold them (core.fit)."""
    vendors = [v for v, r in RUNTIME_OF_VENDOR.items() if r == runtime]
    if runtime == ANY_RUNTIME or not vendors or any(holds(v, m) for v in vendors for m in SHARE_MODES):
        return None
    return "Ascend" if vendors == [ASCEND] else ", ".join(vendors)


def _annotation_problems(pod: Mapping[str, Any], user: str, settings: Settings) -> list[str]:
    annotations = pod_annotations(pod)
    out: list[str] = []
    if user not in settings.trusted_users:
        for key in RESERVED_ANNOTATIONS:
            if key in annotations:
                out.append(f"annotation {key} is written by gpupool itself (scheduler or node agent) only; remove it")
    policy = annotations.get(ANN_POLICY)
    if policy is not None and policy not in policy_names():
        out.append(f"annotation {ANN_POLICY}={policy!r}: unknown policy (use one of {', '.join(policy_names())})")
    include, exclude = (annotation_set(annotations, k) for k in (ANN_UUID, ANN_EXCLUDE))
    if include and include <= exclude:
        out.append(f"annotations {ANN_UUID} and {ANN_EXCLUDE}: every allowed GPU is also excluded")
    return out


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
    return out


def check_create(pod: Mapping[str, Any], settings: Settings, limits: Limits | None, user: str,
                 policy: AdmissionPolicy | None = None) -> Decision:
    """Everything that makes a new pod unacceptable; allowed (maybe with warnings) otherwise."""
    policy = policy or settings.policy()
    gpu = wants_gpu(pod)
    # What the namespace's policy forbids (403): in every pod, GPU or not.
    forbidden = pod_problems(pod, policy.strict, policy.allow_host_access, gpu, allow_env_from=policy.allow_env_from)
    if not touches_gpupool(pod):
        return _deny(pod, forbidden, 403) if forbidden else Decision(True)
    errors = _annotation_problems(pod, user, settings)
    if user not in settings.trusted_users and any(k in pod_annotations(pod) for k in RESERVED_ANNOTATIONS):
        forbidden.extend(errors)
        errors = []
    parsed = parse_pod(pod)
    errors.extend(parsed.errors)
    warnings: list[str] = []
    if gpu:
        errors.extend(_spec_problems(pod, settings))
        verdict = judge_isolation(pod_annotations(pod), policy, mutating=False)
        if verdict.error:
            forbidden.append(verdict.error)
        errors.extend(_runtime_problems(pod, parsed))
        if parsed.request is not None:
            if limits is None:
                warnings.append("gpupool: GPU inventory not known yet; request not checked against GPU sizes")
            else:
                errors.extend(_capacity_problems(limits, parsed.request.gpu, warnings))
                if parsed.isolation == IsolationMode.MIG:
                    named = str(pod_annotations(pod).get(ANN_MIG_PROFILE, "")).strip() or None
                    errors.extend(_mig_problems(limits, parsed.request.gpu, named))
    if forbidden or errors:
        # 403 when the pod asks for what the policy (or gpupool's own records) forbid; 422 when the
        # request is only impossible.
        return _deny(pod, forbidden + errors, 403 if forbidden else 422)
    return Decision(True, warnings=warnings)


# Annotations a tenant may not change once the pod exists: the scheduler records the isolation in the
# allocation at bind time, so a later change would bypass the policy checked at creation.
IMMUTABLE_ANNOTATIONS = (ANN_ISOLATION,)


def check_update(pod: Mapping[str, Any], old: Mapping[str, Any], settings: Settings, user: str) -> Decision:
    """Pod specs are (nearly) immutable; what a user could still break is the allocation record and the
    isolation chosen at creation."""
    if user in settings.trusted_users:
        return Decision(True)
    new, before = pod_annotations(pod), pod_annotations(old)
    problems = [
        f"annotation {k} is written by gpupool itself (scheduler or node agent) only; leave it unchanged"
        for k in RESERVED_ANNOTATIONS
        if new.get(k) != before.get(k)
    ]
    problems += [
        f"annotation {k} cannot change after the pod is created (it was {before.get(k)!r}); recreate the pod"
        for k in IMMUTABLE_ANNOTATIONS
        if new.get(k) != before.get(k)
    ]
    return _deny(pod, problems, 403) if problems else Decision(True)


def check_ephemeral(pod: Mapping[str, Any], old: Mapping[str, Any] | None, settings: Settings,
                    policy: AdmissionPolicy | None = None) -> Decision:
    """`pods/ephemeralcontainers` (e.g. `kubectl debug`): the containers it adds get the checks every
    container gets at creation. Ones already there were checked when they were added."""
    policy = policy or settings.policy()

    def names(obj: Mapping[str, Any] | None) -> set[str]:
        spec = (obj or {}).get("spec") or {}
        return {str(c.get("name")) for c in spec.get("ephemeralContainers") or [] if isinstance(c, Mapping)}

    added = frozenset(names(pod) - names(old))
    problems = pod_problems(pod, policy.strict, policy.allow_host_access, wants_gpu(pod), only_ephemeral=added,
                            allow_env_from=policy.allow_env_from)
    return _deny(pod, problems, 403) if problems else Decision(True)


# --- AdmissionReview in and out ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    uid: str
    operation: str
    kind: str
    user: str
    obj: Mapping[str, Any] | None
    old: Mapping[str, Any] | None
    sub_resource: str = ""  # "ephemeralcontainers" for kubectl debug; "" for the pod itself


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
    sub = req.get("subResource") or ""
    return Request(uid, str(req.get("operation", "")), str(kind), str(user), req.get("object"), req.get("oldObject"),
                   str(sub))


def decide(request: Request, mutating: bool, settings: Settings, limits: Limits | None,
           policy: AdmissionPolicy | None = None) -> Decision:
    """The answer to one review under `policy` (the namespace's, as named by the webhook path)."""
    if request.kind != "Pod" or request.obj is None:
        return Decision(True)  # not ours (a misrouted rule must not block the cluster)
    policy = policy or settings.policy()
    if request.sub_resource == "ephemeralcontainers":
        if mutating:
            return Decision(True)
        return check_ephemeral(request.obj, request.old, settings, policy)
    if request.sub_resource:
        return Decision(True)  # status, binding, ...: not a tenant's way to change the pod's containers
    if request.operation == "CREATE":
        if mutating:
            return mutate(request.obj, settings, limits, request.user, policy)
        return check_create(request.obj, settings, limits, request.user, policy)
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
