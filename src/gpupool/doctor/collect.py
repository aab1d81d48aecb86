"""What the doctor asks the cluster, through the port, and the probes it runs; `checks` judges the answers.

Probes that change something: a scratch namespace (`gpupool-doctor-<random>`, deleted again) for the
server-side dry run of a GPU pod (nothing is stored: the API server runs admission, webhooks included, and
answers the pod as it would have stored it), and SubjectAccessReviews (a question, stored nowhere).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from gpupool.api.dra import DRIVER as DRA_DRIVER
from gpupool.api.names import ANN_INVENTORY, RESOURCE_GPU
from gpupool.cluster.port import (
    CONFIGMAPS,
    DEVICE_CLASSES,
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_SLICES,
    ApiError,
    ClusterPort,
    Kind,
    NotFound,
)
from gpupool.doctor import checks
from gpupool.doctor.checks import Finding, Obj, Review, Status
from gpupool.doctor.rbac import NEEDS, VARIANTS, Access

# The agent's setting (chart dra.devicePlugin) that keeps the device plugin beside the DRA driver.
BESIDE_DRA_ENV = "GPUPOOL_AGENT_DEVICE_PLUGIN_WITH_DRA"

DEPLOYMENTS = Kind("apps", "v1", "Deployment", "deployments", namespaced=True)
DAEMONSETS = Kind("apps", "v1", "DaemonSet", "daemonsets", namespaced=True)
ENDPOINT_SLICES = Kind("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", namespaced=True)
MUTATING = Kind("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration",
                "mutatingwebhookconfigurations", namespaced=False)
VALIDATING = Kind("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration",
                  "validatingwebhookconfigurations", namespaced=False)
ACCESS_REVIEWS = Kind("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", namespaced=False)

INSTANCE = "app.kubernetes.io/instance"
COMPONENT = checks.COMPONENT_LABEL
CHART_NAME = {"app.kubernetes.io/name": "gpupool"}  # what every workload of the chart carries
SCRATCH_LABEL = "gpupool.io/doctor"
# What a request can fail with besides the port's ApiError: the adapter passes transport errors (refused,
# TLS, DNS, timeouts) through as its HTTP client raises them, whose classes are not part of the port. The
# doctor reports any of them as a failure line instead of a traceback: it is the tool people run when
# something is broken.
REQUEST_ERRORS = Exception
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Options:
    namespace: str = "gpupool-system"
    release: str = ""  # "": the one release of the chart in the namespace
    extender_url: str = ""  # where this machine reaches the extender (e.g. through kubectl port-forward)
    node_labels: Mapping[str, str] = field(default_factory=dict)  # only the nodes with these labels


async def _maybe(call: Awaitable[Obj]) -> Obj | None:
    try:
        return await call
    except NotFound:
        return None


@dataclass
class Doctor:
    cluster: ClusterPort
    options: Options
    clock: Callable[[], float]
    findings: list[Finding] = field(default_factory=list)
    release: str = ""

    @property
    def ns(self) -> str:
        return self.options.namespace

    async def _find_release(self) -> Finding | None:
        """Set `release` (the option, else the only release of the chart in the namespace), or say why not:
        a user who named the release otherwise than the docs' example still gets a verdict without guessing."""
        if self.options.release:
            self.release = self.options.release
            return None
        names: set[str] = set()
        for kind in (DEPLOYMENTS, DAEMONSETS):
            items, _ = await self.cluster.list_objects(kind, namespace=self.ns, labels=CHART_NAME)
            names |= {str(o["metadata"].get("labels", {}).get(INSTANCE, "")) for o in items} - {""}
        if len(names) == 1:
            (self.release,) = names
            self.findings.append(Finding("api", f"release {self.release}", Status.INFO,
                                         f"the only release of the chart in {self.ns}: checking it"))
            return None
        subject = f"release in {self.ns}"
        if not names:
            return Finding("api", subject, Status.FAIL, f"no release of the gpupool chart in namespace {self.ns}",
                           "install the chart (helm install <release> ... -n <namespace>), or name its namespace "
                           "with --namespace")
        return Finding("api", subject, Status.FAIL, f"several releases of the chart: {', '.join(sorted(names))}",
                       "name the one to check with --release")

    async def _release_objects(self, kind: Kind, component: str | None = None) -> list[Obj]:
        labels = {INSTANCE: self.release, **({COMPONENT: component} if component else {})}
        items, _ = await self.cluster.list_objects(kind, namespace=self.ns if kind.namespaced else None, labels=labels)
        return items

    async def run(self) -> list[Finding]:
        try:
            await self.cluster.get_object(NAMESPACES, self.ns)
        except NotFound:
            return [Finding("api", f"namespace {self.ns}", Status.FAIL, "does not exist",
                            "install the chart there, or name its namespace with --namespace")]
        except REQUEST_ERRORS as e:
            return [Finding("api", "API server", Status.FAIL, f"cannot read namespace {self.ns}: {_said(e)}",
                            "check the kubeconfig, the context and that the API server is up")]
        missing = await self._guard("api", self._find_release(), None)
        if missing is not None or not self.release:
            return [*self.findings, *([missing] if missing else [])]
        deployments = {d["metadata"].get("labels", {}).get(COMPONENT, ""): d
                       for d in await self._guard("api", self._release_objects(DEPLOYMENTS), [])}
        # one agent DaemonSet per vendor the release serves (NVIDIA's first: its name has no vendor suffix)
        agents = sorted(await self._guard("api", self._release_objects(DAEMONSETS, "agent"), []),
                        key=lambda d: (len(str(d["metadata"]["name"])), str(d["metadata"]["name"])))
        agent = agents[0] if agents else None
        config = await self._guard("scheduler", self._scheduler(deployments.get("scheduler")), None)
        await self._guard("webhook", self._webhook(deployments.get("webhook"), config), None)
        await self._guard("agent", self._nodes(agents), None)
        await self._guard("dra", self._dra(), None)
        await self._guard("rbac", self._rbac({**deployments, "agent": agent}), None)
        return self.findings

    async def _guard(self, area: str, call: Awaitable[T], default: T) -> T:
        """One section: an API error ends that section with a failure line, not the run."""
        try:
            return await call
        except REQUEST_ERRORS as e:
            self.findings.append(Finding(area, "API", Status.FAIL, f"a request failed: {_said(e)}",
                                         "rerun; if it persists, check the doctor's own rights (it reads the "
                                         "release's objects and nodes, creates subjectaccessreviews)"))
            return default

    # --- scheduler -----------------------------------------------------------------------------------------

    async def _scheduler(self, deployment: Obj | None) -> checks.SchedulerConfig | None:
        cms = await self._release_objects(CONFIGMAPS, "scheduler")
        finding, config = checks.scheduler_config(cms[0] if cms else None, self.ns)
        self.findings.append(finding)
        alive = False
        if config is not None:
            lease = await _maybe(self.cluster.get_object(LEASES, config.lease, self.ns)) if config.lease else None
            verdict = checks.scheduler_lease(lease, config, self.ns, self.clock())
            alive = verdict.status is Status.OK
            self.findings.append(verdict)
        self.findings.append(checks.workload("scheduler", "Deployment", deployment, self.ns, alive))
        if self.options.extender_url:
            code, error = await _readyz(self.options.extender_url)
            self.findings.append(checks.extender_answer(self.options.extender_url, code, error, self.ns))
        else:
            pods = await self._release_objects(PODS, "scheduler")
            self.findings.append(checks.extender_pods(pods, self.ns))
        return config

    # --- webhook -------------------------------------------------------------------------------------------

    async def _webhook(self, deployment: Obj | None, config: checks.SchedulerConfig | None) -> None:
        slices: dict[tuple[str, str], list[Obj]] = {}
        for kind in (MUTATING, VALIDATING):
            found = await self._release_objects(kind)
            configuration = found[0] if found else None
            for hook in (configuration or {}).get("webhooks") or []:
                svc = (hook.get("clientConfig") or {}).get("service")
                key = (str(svc.get("namespace")), str(svc.get("name"))) if svc else None
                if key and key not in slices:
                    slices[key] = (await self.cluster.list_objects(
                        ENDPOINT_SLICES, namespace=key[0], labels={"kubernetes.io/service-name": key[1]}))[0]
            self.findings += checks.webhook_configuration(kind.kind, configuration, slices, self.release)
        probe = await self._admission_probe(config.scheduler_name if config else "")
        self.findings.append(probe)
        self.findings.append(checks.workload("webhook", "Deployment", deployment, self.ns,
                                             probe.status is Status.OK))

    async def _admission_probe(self, scheduler_name: str) -> Finding:
        scratch = f"gpupool-doctor-{secrets.token_hex(4)}"
        meta = {"name": scratch, "labels": {SCRATCH_LABEL: "probe"}}
        await self.cluster.create_object(NAMESPACES, {"metadata": meta})
        try:
            pod, error = await self.cluster.create_object(PODS, probe_pod(scratch), dry_run=True), ""
        except ApiError as e:
            pod, error = None, e.message
        finally:
            await self.cluster.delete_object(NAMESPACES, scratch)
        return checks.admission_probe(pod, error, scheduler_name, "a scratch namespace")

    # --- nodes ---------------------------------------------------------------------------------------------

    async def _nodes(self, daemonsets: list[Obj]) -> None:
        """The GPU nodes and the agent DaemonSets. Every vendor's DaemonSet has the release's one nodeSelector
        and DRA settings, so the first one's say which nodes are GPU nodes and how they are served."""
        daemonset = daemonsets[0] if daemonsets else None
        selector = ((daemonset or {}).get("spec") or {}).get("template", {}).get("spec", {}).get("nodeSelector") or {}
        nodes, _ = await self.cluster.list_objects(NODES, labels=self.options.node_labels or None)
        gpu_nodes = sorted((n for n in nodes if is_gpu_node(n, selector)), key=lambda n: str(n["metadata"]["name"]))
        found: list[Finding] = []
        if not gpu_nodes:
            found.append(Finding(
                "agent", "GPU nodes", Status.FAIL,
                f"no node carries the agent's nodeSelector {dict(selector)} or a {ANN_INVENTORY}",
                f"label the GPU nodes: kubectl label node <name> {checks.GPU_NODE_LABEL}=true"))
        dra = _env(daemonset, VARIANTS["dra"]) == "true"
        serving = checks.Serving(device_plugin=not dra or _env(daemonset, BESIDE_DRA_ENV) == "true", dra=dra)
        devices = await self._slice_devices() if serving.dra else {}
        served = [checks.gpu_node(node, self.ns, serving, devices.get(str(node["metadata"]["name"]), 0))
                  for node in gpu_nodes]
        # Agents answer for the nodes checked (fresh inventory, slots at the kubelet): DaemonSet pods that
        # are not ready are then a warning, as for the webhook and the scheduler.
        answered = bool(served) and all(f.status == Status.OK for f in served)
        shown: list[Obj | None] = list(daemonsets) or [None]  # None: the release has no agent DaemonSet
        for ds in shown:
            self.findings.append(checks.workload("agent", "DaemonSet", ds, self.ns, answered=answered))
        self.findings.extend(found)
        for node, finding in zip(gpu_nodes, served, strict=True):
            self.findings.append(finding)
            self.findings.append(checks.validation(node))
        self.findings.append(checks.toolkit(gpu_nodes))

    async def _slice_devices(self) -> dict[str, int]:
        """Devices listed by gpupool's driver per node, from every ResourceSlice (none when the API has none)."""
        try:
            slices, _ = await self.cluster.list_objects(RESOURCE_SLICES)
        except NotFound:
            return {}
        counts: dict[str, int] = {}
        for s in slices:
            spec = s.get("spec") or {}
            if spec.get("driver") == DRA_DRIVER and spec.get("nodeName"):
                counts[str(spec["nodeName"])] = counts.get(str(spec["nodeName"]), 0) + len(spec.get("devices") or [])
        return counts

    async def _dra(self) -> None:
        try:
            classes: list[Obj] | None = (await self.cluster.list_objects(DEVICE_CLASSES))[0]
        except NotFound:
            classes = None
        self.findings.append(checks.device_classes(classes))

    # --- RBAC ----------------------------------------------------------------------------------------------

    async def _rbac(self, workloads: Mapping[str, Obj | None]) -> None:
        # Read from the agent for every component: the scheduler's DRA right comes with the same chart value.
        enabled = {v for v, variable in VARIANTS.items() if _env(workloads.get("agent"), variable) == "true"}
        for component, needs in NEEDS.items():
            obj = workloads.get(component)
            account = ((obj or {}).get("spec") or {}).get("template", {}).get("spec", {}).get("serviceAccountName")
            if not account:
                continue  # no workload: its own finding says so
            asked = [a for a in needs if not a.when or a.when in enabled]
            reviews = await asyncio.gather(*(self._review(account, a) for a in asked))
            self.findings.append(checks.rbac(component, account, list(reviews), self.release))

    async def _review(self, account: str, access: Access) -> Review:
        resource, _, sub = access.resource.partition("/")
        attrs = {"verb": access.verb, "group": access.group, "resource": resource, "subresource": sub,
                 "namespace": self.ns if access.in_release_namespace else "", "name": access.object_name(account)}
        what = " ".join(x for x in (access.verb, access.resource, attrs["name"]) if x)
        if attrs["namespace"]:
            what += f" in {self.ns}"
        # The groups a ServiceAccount's token carries: a binding to one of them counts, as for the real token.
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{self.ns}", "system:authenticated"]
        body = {"spec": {"user": f"system:serviceaccount:{self.ns}:{account}", "groups": groups,
                         "resourceAttributes": {k: v for k, v in attrs.items() if v}}}
        try:
            answer = await self.cluster.create_object(ACCESS_REVIEWS, body)
        except ApiError as e:
            return Review(what, access.why, False, e.message)
        return Review(what, access.why, bool((answer.get("status") or {}).get("allowed")))


def is_gpu_node(node: Obj, selector: Mapping[str, str]) -> bool:
    """A node the agent should run on (the DaemonSet's nodeSelector) or that carries an agent's inventory."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    chosen = bool(selector) and all(labels.get(k) == v for k, v in selector.items())
    return chosen or ANN_INVENTORY in (meta.get("annotations") or {})


def probe_pod(namespace: str) -> Obj:
    """The smallest pod that asks gpupool for a GPU share (never stored: created with dry run)."""
    return {"metadata": {"name": "gpupool-doctor-probe", "namespace": namespace},
            "spec": {"containers": [{"name": "probe", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"limits": {RESOURCE_GPU: "1", f"{RESOURCE_GPU}-memory": "1024"}}}]}}


def _env(workload: Obj | None, name: str) -> str:
    for c in (((workload or {}).get("spec") or {}).get("template", {}).get("spec", {}).get("containers") or []):
        for e in c.get("env") or []:
            if e.get("name") == name:
                return str(e.get("value", ""))
    return ""


def _said(e: BaseException) -> str:
    return str(getattr(e, "message", "") or e or type(e).__name__).splitlines()[0]


async def _readyz(url: str) -> tuple[int | None, str]:
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            r = await client.get(url.rstrip("/") + "/readyz")
    except httpx.HTTPError as e:
        return None, _said(e)
    return r.status_code, ""


async def diagnose(cluster: ClusterPort, options: Options, clock: Callable[[], float]) -> list[Finding]:
    return await Doctor(cluster, options, clock).run()

