"""The doctor's verdicts: plain functions from what the API server returned to `Finding`s.

No I/O here: `collect` fetches and probes, these judge, so each verdict is tested on hand-built objects.
A verdict fails only on evidence that something does not work (a refused dry run, no ready endpoint, a
stale lease, a denied right); a Deployment without ready pods whose service is nevertheless answered is a
warning (something outside the release serves it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import yaml

from gpupool.api.dra import DEFAULT_ISOLATION as DRA_DEFAULT_ISOLATION
from gpupool.api.dra import DRA_ISOLATIONS
from gpupool.api.dra import DRIVER as DRA_DRIVER
from gpupool.api.inventory import InventoryError, decode_inventory
from gpupool.api.names import ANN_INVENTORY, DOMAIN, RESOURCE_GPU

Obj = dict[str, Any]

GPU_NODE_LABEL = f"{DOMAIN}/gpu-node"
COMPONENT_LABEL = "app.kubernetes.io/component"
# the agent pods' components: NVIDIA's DaemonSet, and one per other vendor (chart value agent.vendors)
AGENT_COMPONENTS = ("agent", "agent-amd", "agent-ascend")
VALIDATION_PREFIX = f"{DOMAIN}/validation."
READY_CONDITION = "GpupoolReady"
SCHEDULER_CONFIG_KEY = "scheduler-config.yaml"
# A lease renewed this long after it should have expired is taken as stale (clock skew between the API
# server's clients and this machine).
LEASE_SLACK_S = 10.0


class Status(StrEnum):
    OK = "ok"
    INFO = "info"  # nothing to do, worth knowing
    WARN = "warn"  # works, but not as the chart means it to
    FAIL = "fail"  # does not work: the doctor exits 1


@dataclass(frozen=True, slots=True)
class Finding:
    area: str  # webhook, scheduler, agent, validation, rbac, toolkit, dra, api
    subject: str  # the object or component it is about
    status: Status
    detail: str  # what was found
    fix: str = ""  # how to fix it (empty when nothing is wrong)

    def as_json(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


def failed(findings: Iterable[Finding]) -> bool:
    return any(f.status is Status.FAIL for f in findings)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name", "?"))


# --- webhook -------------------------------------------------------------------------------------------


def ready_endpoints(slices: Iterable[Obj]) -> int:
    """Ready addresses in a Service's EndpointSlices (an unset `ready` means ready, as the API says)."""
    return sum(
        len(ep.get("addresses") or [])
        for s in slices for ep in s.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready") is not False
    )


def webhook_configuration(kind: str, config: Obj | None, slices_of: Mapping[tuple[str, str], list[Obj]],
                          release: str) -> list[Finding]:
    """One configuration of the release: each entry has a caBundle and names a Service with a ready
    endpoint. `slices_of` maps (namespace, service) to that Service's EndpointSlices."""
    if config is None:
        return [Finding("webhook", kind, Status.FAIL, f"no {kind} of release {release}",
                        f"install the chart (helm install {release} ...), or name the release with --release")]
    name, out = _name(config), []
    problems: list[str] = []
    services: dict[tuple[str, str], list[str]] = {}
    for hook in config.get("webhooks") or []:
        client = hook.get("clientConfig") or {}
        if not client.get("caBundle"):
            problems.append(f"{hook.get('name')}: no caBundle")
        svc = client.get("service")
        if svc:
            services.setdefault((str(svc.get("namespace")), str(svc.get("name"))), []).append(str(hook.get("name")))
        else:
            problems.append(f"{hook.get('name')}: calls a URL, not the release's Service")
    if not config.get("webhooks"):
        problems.append("no webhook entries")
    if problems:
        out.append(Finding("webhook", f"{kind} {name}", Status.FAIL, "; ".join(problems),
                           "with webhook.certs.mode=certManager check the Certificate and cert-manager's CA "
                           "injector; otherwise `helm upgrade` writes the chart's caBundle again"))
    for (ns, svc_name), hooks in sorted(services.items()):
        ready = ready_endpoints(slices_of.get((ns, svc_name), []))
        subject = f"Service {ns}/{svc_name}"
        if ready:
            out.append(Finding("webhook", subject, Status.OK, f"{ready} ready endpoint(s) for {kind} {name}"))
        else:
            out.append(Finding("webhook", subject, Status.FAIL,
                               f"no ready endpoint: the API server has nowhere to send {', '.join(hooks)}",
                               f"kubectl -n {ns} get pods,endpointslices -l app.kubernetes.io/component=webhook; "
                               "check the webhook pods' logs and readiness"))
    return out


def admission_probe(pod: Obj | None, error: str, scheduler_name: str, namespace: str) -> Finding:
    """The server-side dry run of a GPU pod: admitted and routed proves the API server reaches the webhook."""
    subject = f"dry-run GPU pod in {namespace}"
    if pod is None:
        if "failed calling webhook" in error:
            return Finding("webhook", subject, Status.FAIL, f"the API server cannot call the webhook: {error}",
                           "check the webhook pods and their endpoints; with networkPolicy.apiServerCIDRs set, "
                           "that it admits the API server's address")
        return Finding("webhook", subject, Status.FAIL, f"refused: {error}",
                       "read the message: a refusal by gpupool names the rule; another admission plugin or "
                       "policy may refuse GPU pods in this namespace")
    got = (pod.get("spec") or {}).get("schedulerName", "")
    if not scheduler_name:  # the release's scheduler configuration is missing: nothing to compare with
        if got and got != "default-scheduler":
            return Finding("webhook", subject, Status.WARN,
                           f"admitted and routed to {got}, but the release's scheduler configuration was not "
                           "found, so whether that is the release's scheduler is unknown",
                           "see the scheduler lines above")
        return Finding("webhook", subject, Status.FAIL, "admitted but not routed to any gpupool scheduler",
                       "the mutating webhook did not see the pod: check its namespaceSelector (webhook."
                       "excludeNamespaces) and that its configuration is the release's")
    if got == scheduler_name:
        return Finding("webhook", subject, Status.OK, f"admitted and routed to {scheduler_name} (server-side dry run)")
    return Finding("webhook", subject, Status.FAIL,
                   f"admitted but not routed: schedulerName is {got!r}, not {scheduler_name!r}",
                   "the mutating webhook did not see the pod: check its namespaceSelector (webhook."
                   "excludeNamespaces) and that its configuration is the release's")


# --- workloads -----------------------------------------------------------------------------------------


def workload(component: str, kind: str, obj: Obj | None, namespace: str, answered: bool) -> Finding:
    """A Deployment's or DaemonSet's ready pods. `answered`: the component's function was seen working
    (the webhook admitted the dry run, kube-scheduler renews its lease), so pods missing here are a warning:
    something outside the release does the work."""
    if obj is None:
        return Finding(component, f"{kind} ({component})", Status.FAIL, f"the release has no {component} {kind}",
                       "install or upgrade the chart; check --release and --namespace")
    status, name = obj.get("status") or {}, _name(obj)
    if kind == "DaemonSet":
        want, ready = int(status.get("desiredNumberScheduled") or 0), int(status.get("numberReady") or 0)
    else:
        want, ready = int((obj.get("spec") or {}).get("replicas", 1)), int(status.get("readyReplicas") or 0)
    subject, detail = f"{kind} {name}", f"{ready}/{want} pods ready"
    if kind == "DaemonSet" and want == 0:
        return Finding(component, subject, Status.WARN, "its nodeSelector matches no node: no agent runs",
                       f"label the GPU nodes ({GPU_NODE_LABEL}=true) or set agent.nodeSelector")
    if ready >= want:
        return Finding(component, subject, Status.OK, detail)
    # the pods' own component label: a vendor's agent DaemonSet labels its pods agent-amd, agent-ascend
    pods = ((obj.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
    fix = f"kubectl -n {namespace} describe {kind.lower()} {name}; kubectl -n {namespace} logs -l " \
          f"app.kubernetes.io/component={pods.get(COMPONENT_LABEL, component)} --all-containers"
    if ready or answered:
        why = "" if ready else ", yet the component answers: something outside the release serves it"
        return Finding(component, subject, Status.WARN, detail + why, fix)
    return Finding(component, subject, Status.FAIL, detail, fix)


# --- scheduler -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    scheduler_name: str
    leader_elect: bool
    lease: str  # the leader-election Lease's name ("" when leader election is off)


def scheduler_config(configmap: Obj | None, namespace: str) -> tuple[Finding, SchedulerConfig | None]:
    """The chart's kube-scheduler configuration names the gpupool extender for gpupool.io/gpu."""
    subject = "kube-scheduler configuration"
    fix = "helm upgrade restores the chart's ConfigMap; then restart the scheduler pods (kubectl -n " \
          f"{namespace} rollout restart deployment -l app.kubernetes.io/component=scheduler): kube-scheduler " \
          "reads its configuration only at start"
    if configmap is None:
        return Finding("scheduler", subject, Status.FAIL, "the release has no scheduler ConfigMap", fix), None
    text = (configmap.get("data") or {}).get(SCHEDULER_CONFIG_KEY, "")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return Finding("scheduler", subject, Status.FAIL, f"{SCHEDULER_CONFIG_KEY} is not YAML: {e}", fix), None
    if not isinstance(doc, dict):
        return Finding("scheduler", subject, Status.FAIL, f"{SCHEDULER_CONFIG_KEY} is missing or empty", fix), None
    profiles = [p for p in doc.get("profiles") or [] if isinstance(p, dict)]
    name = str(profiles[0].get("schedulerName", "")) if profiles else ""
    election = doc.get("leaderElection") or {}
    leader_elect = election.get("leaderElect", True) is not False
    config = SchedulerConfig(name, leader_elect, str(election.get("resourceName", "")) if leader_elect else "")
    ours = [e for e in doc.get("extenders") or [] if isinstance(e, dict)
            and any(isinstance(r, dict) and r.get("name") == RESOURCE_GPU for r in e.get("managedResources") or [])]
    problems = []
    if not name:
        problems.append("no profile with a schedulerName")
    if not ours:
        problems.append(f"no extender manages {RESOURCE_GPU}: kube-scheduler would place GPU pods without gpupool")
    for ext in ours:
        missing = [k for k in ("urlPrefix", "filterVerb", "bindVerb") if not ext.get(k)]
        if missing:
            problems.append(f"the extender entry lacks {', '.join(missing)}")
    if problems:
        return Finding("scheduler", subject, Status.FAIL, "; ".join(problems), fix), config
    return Finding("scheduler", subject, Status.OK,
                   f"profile {name} calls the extender at {ours[0]['urlPrefix']} for {RESOURCE_GPU}"), config


def _rfc3339(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return None


def scheduler_lease(lease: Obj | None, config: SchedulerConfig, namespace: str, now: float) -> Finding:
    """kube-scheduler is alive when it renews its leader-election Lease in time."""
    subject = f"Lease {namespace}/{config.lease}" if config.lease else "kube-scheduler leader election"
    if not config.leader_elect:
        return Finding("scheduler", subject, Status.INFO, "leader election is off: no lease shows kube-scheduler alive")
    fix = f"kubectl -n {namespace} logs -l app.kubernetes.io/component=scheduler -c kube-scheduler"
    if lease is None:
        return Finding("scheduler", subject, Status.FAIL, "no kube-scheduler of the release ever led", fix)
    spec = lease.get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    renewed = _rfc3339(str(spec.get("renewTime") or ""))
    duration = float(spec.get("leaseDurationSeconds") or 15)
    if not holder or renewed is None:
        return Finding("scheduler", subject, Status.FAIL, "nobody holds the lease", fix)
    age = now - renewed
    if age > duration + LEASE_SLACK_S:
        return Finding("scheduler", subject, Status.FAIL,
                       f"held by {holder}, last renewed {age:.0f} s ago (lease {duration:.0f} s): "
                       "kube-scheduler is down", fix)
    return Finding("scheduler", subject, Status.OK, f"held by {holder}, renewed {max(age, 0):.0f} s ago")


def extender_answer(url: str, status_code: int | None, error: str, namespace: str) -> Finding:
    """The extender's /readyz, called at --extender-url."""
    subject = f"extender {url}/readyz"
    if status_code == 200:
        return Finding("scheduler", subject, Status.OK, "ready")
    detail = f"answered HTTP {status_code}" if status_code is not None else f"no answer: {error}"
    return Finding("scheduler", subject, Status.FAIL, detail,
                   f"kubectl -n {namespace} logs -l app.kubernetes.io/component=scheduler -c extender (/readyz "
                   "answers 503 until the extender's caches are filled)")


def extender_pods(pods: Iterable[Obj], namespace: str) -> Finding:
    """Without --extender-url: the kubelet's readiness probe of the extender container (it calls /readyz
    inside the pod, where the extender listens on 127.0.0.1)."""
    ready = sorted(_name(p) for p in pods for c in (p.get("status") or {}).get("containerStatuses") or []
                   if c.get("name") == "extender" and c.get("ready"))
    if ready:
        return Finding("scheduler", "extender", Status.OK, f"the kubelet's /readyz probe passes in {', '.join(ready)}")
    return Finding("scheduler", "extender", Status.FAIL, "no scheduler pod has a ready extender container",
                   f"kubectl -n {namespace} logs -l app.kubernetes.io/component=scheduler -c extender; to ask "
                   f"it yourself: kubectl -n {namespace} port-forward <scheduler pod> 8888:<extender port>, "
                   "then gpupool doctor --extender-url http://127.0.0.1:8888")


# --- nodes ---------------------------------------------------------------------------------------------


def allocatable_slots(node: Obj) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(RESOURCE_GPU, "0")
    try:
        return int(str(value))
    except ValueError:
        return 0


@dataclass(frozen=True, slots=True)
class Serving:
    """How the agents serve GPUs (the DaemonSet's settings): the device plugin's slots at the kubelet, the
    DRA driver's ResourceSlice, or both (a cluster moving to DRA)."""

    device_plugin: bool = True
    dra: bool = False


def gpu_node(node: Obj, namespace: str, serving: Serving = Serving(), slice_devices: int = 0) -> Finding:
    """A GPU node: its agent published an inventory and serves its GPUs as the DaemonSet says: the kubelet
    has the device plugin's slots, and/or the node's ResourceSlice of gpupool's driver lists
    `slice_devices` devices."""
    name = _name(node)
    subject = f"node {name}"
    text = (_meta(node).get("annotations") or {}).get(ANN_INVENTORY)
    agent_logs = f"kubectl -n {namespace} get pods -l '{COMPONENT_LABEL} in ({','.join(AGENT_COMPONENTS)})' " \
                 f"--field-selector spec.nodeName={name}; and its logs"
    if not text:
        return Finding("agent", subject, Status.FAIL, f"no {ANN_INVENTORY}: no agent ever ran here", agent_logs)
    try:
        doc = decode_inventory(str(text))
    except InventoryError as e:
        return Finding("agent", subject, Status.FAIL, str(e), agent_logs)
    slots = allocatable_slots(node)
    if serving.device_plugin and slots <= 0:
        return Finding("agent", subject, Status.FAIL,
                       f"allocatable {RESOURCE_GPU} is 0 (inventory: {len(doc.gpus)} GPU(s)): the kubelet has no "
                       "healthy device from the agent's device plugin (agent stopped, or not registered)", agent_logs)
    if serving.dra and slice_devices <= 0:
        return Finding("agent", subject, Status.FAIL,
                       f"no ResourceSlice of driver {DRA_DRIVER} lists a device of this node (inventory: "
                       f"{len(doc.gpus)} GPU(s)): the agent's DRA driver is not publishing (agent stopped, or "
                       "kubelet deleted the slice at its start and the agent has not put it back)", agent_logs)
    served = ([f"{slots} slots allocatable"] if serving.device_plugin else []) + \
        ([f"{slice_devices} device(s) in its ResourceSlice"] if serving.dra else [])
    unhealthy = [g.index for g in doc.gpus if not g.healthy]
    detail = f"{len(doc.gpus)} GPU(s), {', '.join(served)}, driver {doc.driver or '?'}"
    if unhealthy:
        return Finding("agent", subject, Status.WARN, f"{detail}; unhealthy GPU index {unhealthy}", agent_logs)
    return Finding("agent", subject, Status.OK, detail)


def validation(node: Obj) -> Finding:
    """The node's validation state as published on it: `gpupool.io/validation.<step>` labels and a
    `GpupoolReady` condition."""
    subject = f"node {_name(node)}"
    labels = {k[len(VALIDATION_PREFIX):]: str(v) for k, v in (_meta(node).get("labels") or {}).items()
              if k.startswith(VALIDATION_PREFIX)}
    condition = next((c for c in (node.get("status") or {}).get("conditions") or []
                      if c.get("type") == READY_CONDITION), None)
    if not labels and condition is None:
        return Finding("validation", subject, Status.INFO, "not published on this node")
    bad = sorted(f"{step}={value}" for step, value in labels.items() if value.lower() in ("failed", "fail", "false"))
    fix = "read the agent's log on this node for the failing step"
    if condition is not None and condition.get("status") == "False":
        bad.append(f"{READY_CONDITION}=False ({condition.get('reason', '')}: {condition.get('message', '')})")
    if bad:
        return Finding("validation", subject, Status.FAIL, "failed: " + "; ".join(bad), fix)
    shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
    if condition is not None:
        shown = ", ".join(x for x in (shown, f"{READY_CONDITION}={condition.get('status')}") if x)
    return Finding("validation", subject, Status.OK, shown)


def toolkit(nodes: Iterable[Obj]) -> Finding:
    """The NVIDIA Container Toolkit setting, where agents report it in their inventory."""
    reported = []
    for n in nodes:
        text = (_meta(n).get("annotations") or {}).get(ANN_INVENTORY)
        try:
            raw = json.loads(text) if text else {}
        except ValueError:
            continue
        if isinstance(raw, dict) and "toolkit" in raw:
            reported.append(f"{_name(n)}: {raw['toolkit']}")
    if reported:
        return Finding("toolkit", "NVIDIA Container Toolkit", Status.INFO, "; ".join(reported))
    return Finding("toolkit", "NVIDIA Container Toolkit", Status.INFO,
                   "not reported by the agents: each checks the toolkit's config.toml at start, where mounted, "
                   "and logs a WARNING naming the problem",
                   "kubectl logs the agents and look for 'NVIDIA toolkit:' (docs/install.md, Prerequisites)")


def _selects_our_driver(device_class: Mapping[str, Any]) -> bool:
    """A class is gpupool's when one of its selectors names our driver (the chart's select
    `device.driver == "gpu.gpupool.io"`; an admin's own class may narrow that further)."""
    selectors = (device_class.get("spec") or {}).get("selectors") or []
    return any(isinstance(s, Mapping) and DRA_DRIVER in str((s.get("cel") or {}).get("expression", ""))
               for s in selectors)


_NO_CONFIG = object()  # the class has no opaque config for our driver


def _named_isolation(device_class: Mapping[str, Any]) -> object:
    """The isolation the class's opaque config for our driver names, as the driver reads it (the last such
    config wins; None when that config names none); _NO_CONFIG when the class has no config of ours."""
    found: object = _NO_CONFIG
    for config in (device_class.get("spec") or {}).get("config") or []:
        opaque = (config.get("opaque") or {}) if isinstance(config, Mapping) else {}
        if opaque.get("driver") != DRA_DRIVER:
            continue
        params = opaque.get("parameters")
        found = params.get("isolation") if isinstance(params, Mapping) else None
    return found


def device_classes(classes: list[Obj] | None) -> Finding:
    """gpupool's DeviceClasses (those selecting driver gpu.gpupool.io) and the isolation each one gives."""
    subject = "DRA DeviceClasses"
    if classes is None:
        return Finding("dra", subject, Status.INFO, "resource.k8s.io/v1 is not served by this API server")
    ours = sorted((c for c in classes if _selects_our_driver(c)), key=_name)
    if not ours:
        others = ", ".join(sorted(map(_name, classes)))
        return Finding("dra", subject, Status.INFO, "none of gpupool's DRA classes installed (chart value "
                       f"dra.enabled){f'; other classes: {others}' if others else ''}")
    isolations = {_name(c): _named_isolation(c) for c in ours}
    # A config of ours that names no valid isolation makes the driver refuse every claim of the class
    # (api/dra.py); a class without any config of ours gets the default isolation, which is fine.
    broken = [f"{name} names isolation {iso!r}" for name, iso in isolations.items()
              if iso is not _NO_CONFIG and iso not in DRA_ISOLATIONS]
    if broken:
        return Finding("dra", subject, Status.WARN,
                       "; ".join(broken) + f": the driver refuses their claims (use {', '.join(DRA_ISOLATIONS)})",
                       "helm upgrade restores the chart's classes; fix or delete a class of your own")
    listed = ", ".join(f"{name} ({f'{DRA_DEFAULT_ISOLATION}, the default' if iso is _NO_CONFIG else iso})"
                       for name, iso in isolations.items())
    return Finding("dra", subject, Status.OK, f"gpupool's classes: {listed}")


# --- RBAC ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Review:
    """One SubjectAccessReview's question and answer."""

    what: str  # "create pods/eviction" (in namespace / name)
    why: str
    allowed: bool
    error: str = ""  # the review itself failed


def rbac(component: str, account: str, reviews: list[Review], release: str) -> Finding:
    subject = f"{component} ({account})"
    errors = [f"{r.what}: {r.error}" for r in reviews if r.error]
    denied = [f"{r.what} ({r.why})" for r in reviews if not r.allowed and not r.error]
    if errors:
        return Finding("rbac", subject, Status.FAIL, "could not ask the API server: " + "; ".join(errors),
                       "the doctor needs create on subjectaccessreviews.authorization.k8s.io")
    if denied:
        return Finding("rbac", subject, Status.FAIL, "denied: " + "; ".join(denied),
                       "helm upgrade restores the chart's Roles and bindings; "
                       f"kubectl get clusterroles,roles -A -l app.kubernetes.io/instance={release} -o yaml")
    return Finding("rbac", subject, Status.OK, f"all {len(reviews)} rights it needs are granted")
