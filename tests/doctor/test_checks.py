"""The doctor's verdicts on hand-built API objects: each names what is wrong, and passes what is right."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

from gpupool.api.inventory import encode_inventory
from gpupool.commands.doctor import render
from gpupool.core.model import GPU
from gpupool.doctor import checks
from gpupool.doctor.checks import Finding, Review, SchedulerConfig, Status
from gpupool.doctor.collect import is_gpu_node

Obj = dict[str, Any]
SVC = {"namespace": "gpupool-system", "name": "gpupool-webhook", "port": 443}


def hooks(ca: str = "Q0E=", service: Obj | None = None) -> Obj:
    client = {"service": service or SVC, **({"caBundle": ca} if ca else {})}
    return {"metadata": {"name": "gpupool"}, "webhooks": [{"name": "mutate.gpupool.io", "clientConfig": client}]}


def endpoints(*ready: bool | None) -> list[Obj]:
    return [{"endpoints": [{"addresses": ["10.0.0.1"], "conditions": {} if r is None else {"ready": r}}
                           for r in ready]}]


def test_webhook_configuration_needs_a_ca_bundle_and_a_ready_endpoint() -> None:
    key = ("gpupool-system", "gpupool-webhook")
    [ok] = checks.webhook_configuration("MutatingWebhookConfiguration", hooks(), {key: endpoints(True, None)}, "gp")
    assert (ok.status, ok.detail) == (Status.OK, "2 ready endpoint(s) for MutatingWebhookConfiguration gpupool")
    [none] = checks.webhook_configuration("MutatingWebhookConfiguration", hooks(), {key: endpoints(False)}, "gp")
    assert none.status is Status.FAIL and "no ready endpoint" in none.detail
    no_ca = checks.webhook_configuration("MutatingWebhookConfiguration", hooks(ca=""), {key: endpoints(True)}, "gp")
    assert [(f.status, f.detail) for f in no_ca][0] == (Status.FAIL, "mutate.gpupool.io: no caBundle")
    [missing] = checks.webhook_configuration("ValidatingWebhookConfiguration", None, {}, "gp")
    assert missing.status is Status.FAIL and missing.detail == "no ValidatingWebhookConfiguration of release gp"


def test_admission_probe_proves_the_webhook_is_reached_and_mutates() -> None:
    routed = checks.admission_probe({"spec": {"schedulerName": "gpupool-scheduler"}}, "", "gpupool-scheduler", "ns")
    assert routed.status is Status.OK
    unrouted = checks.admission_probe({"spec": {"schedulerName": "default-scheduler"}}, "", "gpupool-scheduler", "ns")
    assert unrouted.status is Status.FAIL and "not routed" in unrouted.detail
    down = checks.admission_probe(None, 'Internal error occurred: failed calling webhook "mutate.gpupool.io": '
                                        "connection refused", "gpupool-scheduler", "ns")
    assert down.status is Status.FAIL and down.detail.startswith("the API server cannot call the webhook")
    refused = checks.admission_probe(None, "gpupool refused pod", "gpupool-scheduler", "ns")
    assert refused.status is Status.FAIL and refused.detail == "refused: gpupool refused pod"


def test_admission_probe_without_the_releases_scheduler_name_does_not_contradict_itself() -> None:
    """With the scheduler's configuration missing there is no name to compare with: the line said
    "schedulerName is 'gpupool-scheduler', not ''" and failed a pod that was routed."""
    routed = checks.admission_probe({"spec": {"schedulerName": "gpupool-scheduler"}}, "", "", "ns")
    assert routed.status is Status.WARN
    assert routed.detail.startswith("admitted and routed to gpupool-scheduler, but the release's scheduler")
    for unrouted in ({"spec": {"schedulerName": "default-scheduler"}}, {"spec": {}}):
        got = checks.admission_probe(unrouted, "", "", "ns")
        assert (got.status, got.detail) == (Status.FAIL, "admitted but not routed to any gpupool scheduler")


def test_findings_as_lines_fit_80_columns_and_keep_every_word() -> None:
    """Piped or on a narrow terminal the doctor prints lines, not a five-column table folded into slivers."""
    from gpupool.commands.doctor import render_lines

    long = "the mutating webhook did not see the pod: check its namespaceSelector (webhook.excludeNamespaces)"
    findings = [Finding("webhook", "dry-run GPU pod in a scratch namespace", Status.FAIL, "admitted but not routed",
                        long),
                Finding("agent", "node [b]x\x1b[31m", Status.OK, "2 GPU(s), 20 slots allocatable, driver 570")]
    text = render_lines(findings, 80)
    lines = text.splitlines()
    assert len(lines) == 6 and max(len(line) for line in lines) <= 80, text
    assert lines[0] == "FAIL  webhook: dry-run GPU pod in a scratch namespace"
    assert lines[1] == "      admitted but not routed"
    assert " ".join(part.strip() for part in lines[2:4]) == "fix: " + long
    assert lines[4].startswith("OK    agent: node [b]x") and "\x1b" not in text
    assert lines[5] == "      2 GPU(s), 20 slots allocatable, driver 570"


def deployment(replicas: int, ready: int) -> Obj:
    return {"metadata": {"name": "gpupool-webhook"}, "spec": {"replicas": replicas}, "status": {"readyReplicas": ready}}


def test_workload_readiness_fails_only_without_other_evidence() -> None:
    assert checks.workload("webhook", "Deployment", deployment(2, 2), "ns", False).status is Status.OK
    assert checks.workload("webhook", "Deployment", deployment(2, 1), "ns", False).status is Status.WARN
    assert checks.workload("webhook", "Deployment", deployment(2, 0), "ns", False).status is Status.FAIL
    served = checks.workload("webhook", "Deployment", deployment(2, 0), "ns", True)
    assert served.status is Status.WARN and "outside the release" in served.detail
    assert checks.workload("webhook", "Deployment", None, "ns", True).status is Status.FAIL
    idle = {"metadata": {"name": "gpupool-agent"}, "status": {"desiredNumberScheduled": 0}}
    assert checks.workload("agent", "DaemonSet", idle, "ns", False).status is Status.WARN


SCHEDULER_CONFIG = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: true, resourceNamespace: gpupool-system, resourceName: gpupool-scheduler-kube}
profiles: [{schedulerName: gpupool-scheduler}]
extenders:
  - urlPrefix: http://127.0.0.1:8888
    filterVerb: filter
    bindVerb: bind
    managedResources: [{name: gpupool.io/gpu, ignoredByScheduler: false}]
"""


def configmap(text: str) -> Obj:
    return {"data": {"scheduler-config.yaml": text}}


def test_scheduler_config_names_the_extender() -> None:
    ok, config = checks.scheduler_config(configmap(SCHEDULER_CONFIG), "ns")
    assert ok.status is Status.OK
    assert config == SchedulerConfig("gpupool-scheduler", True, "gpupool-scheduler-kube")
    gone = SCHEDULER_CONFIG.split("extenders:")[0]
    bad, config = checks.scheduler_config(configmap(gone), "ns")
    assert bad.status is Status.FAIL and "no extender manages gpupool.io/gpu" in bad.detail
    assert config is not None and config.scheduler_name == "gpupool-scheduler"
    no_bind = SCHEDULER_CONFIG.replace("    bindVerb: bind\n", "")
    assert "lacks bindVerb" in checks.scheduler_config(configmap(no_bind), "ns")[0].detail
    assert checks.scheduler_config(configmap("a: [b"), "ns")[0].status is Status.FAIL
    assert checks.scheduler_config(None, "ns")[0].status is Status.FAIL


def lease(renewed: str, holder: str = "sched-1") -> Obj:
    return {"spec": {"holderIdentity": holder, "renewTime": renewed, "leaseDurationSeconds": 15}}


def test_scheduler_lease_must_be_renewed() -> None:
    config = SchedulerConfig("gpupool-scheduler", True, "gpupool-scheduler-kube")
    now = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    fresh = checks.scheduler_lease(lease("2027-01-15T07:59:55.123456Z"), config, "ns", now)
    assert (fresh.status, fresh.detail) == (Status.OK, "held by sched-1, renewed 5 s ago")
    stale = checks.scheduler_lease(lease("2027-01-15T07:58:00.000000Z"), config, "ns", now)
    assert stale.status is Status.FAIL and "last renewed 120 s ago" in stale.detail
    assert checks.scheduler_lease(None, config, "ns", now).status is Status.FAIL
    assert checks.scheduler_lease(lease("", holder=""), config, "ns", now).status is Status.FAIL
    off = SchedulerConfig("gpupool-scheduler", False, "")
    assert checks.scheduler_lease(None, off, "ns", now).status is Status.INFO


def test_extender_answer_and_pod_readiness() -> None:
    assert checks.extender_answer("http://x", 200, "", "ns").status is Status.OK
    assert checks.extender_answer("http://x", 503, "", "ns").detail == "answered HTTP 503"
    assert checks.extender_answer("http://x", None, "refused", "ns").status is Status.FAIL
    pod = {"metadata": {"name": "s-1"}, "status": {"containerStatuses": [
        {"name": "kube-scheduler", "ready": True}, {"name": "extender", "ready": False}]}}
    assert checks.extender_pods([pod], "ns").status is Status.FAIL
    pod["status"]["containerStatuses"][1]["ready"] = True
    assert checks.extender_pods([pod], "ns").detail == "the kubelet's /readyz probe passes in s-1"


def node(name: str = "gpu-1", slots: str | None = "20", healthy: bool = True, labels: Obj | None = None,
         conditions: list[Obj] | None = None, inventory: str | None = "auto") -> Obj:
    gpus = [GPU(uuid=f"GPU-{i}", index=i, model="L4", memory_mib=23034, healthy=healthy or i > 0) for i in range(2)]
    text = encode_inventory(name, gpus, split=10, driver="570.86") if inventory == "auto" else inventory
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": {"gpupool.io/inventory": text}
                         if text is not None else {}},
            "status": {"allocatable": {} if slots is None else {"gpupool.io/gpu": slots},
                       "conditions": conditions or []}}


def test_gpu_node_needs_an_inventory_and_the_kubelets_slots() -> None:
    ok = checks.gpu_node(node(), "ns")
    assert (ok.status, ok.detail) == (Status.OK, "2 GPU(s), 20 slots allocatable, driver 570.86")
    stopped = checks.gpu_node(node(slots="0"), "ns")
    assert stopped.status is Status.FAIL and "allocatable gpupool.io/gpu is 0" in stopped.detail
    assert checks.gpu_node(node(slots=None), "ns").status is Status.FAIL
    missing = checks.gpu_node(node(inventory=None), "ns")
    assert missing.status is Status.FAIL and "no agent ever ran here" in missing.detail
    assert checks.gpu_node(node(inventory="{not json"), "ns").status is Status.FAIL
    sick = checks.gpu_node(node(healthy=False), "ns")
    assert sick.status is Status.WARN and "unhealthy GPU index [0]" in sick.detail


def test_a_dra_node_is_served_by_its_slice_and_a_node_with_both_needs_both() -> None:
    """A DRA-only node has no slots (kubelet offers no gpupool.io/gpu there): its ResourceSlice's devices
    are what it serves. Before, every DRA-only node failed as "allocatable is 0"."""
    dra_only, both = checks.Serving(device_plugin=False, dra=True), checks.Serving(device_plugin=True, dra=True)
    ok = checks.gpu_node(node(slots=None), "ns", dra_only, slice_devices=2)
    assert (ok.status, ok.detail) == (Status.OK, "2 GPU(s), 2 device(s) in its ResourceSlice, driver 570.86")
    gone = checks.gpu_node(node(slots=None), "ns", dra_only, slice_devices=0)
    assert gone.status is Status.FAIL and "no ResourceSlice of driver gpu.gpupool.io" in gone.detail
    assert checks.gpu_node(node(), "ns", both, slice_devices=2).detail == (
        "2 GPU(s), 20 slots allocatable, 2 device(s) in its ResourceSlice, driver 570.86")
    assert checks.gpu_node(node(slots="0"), "ns", both, slice_devices=2).status is Status.FAIL
    assert checks.gpu_node(node(), "ns", both, slice_devices=0).status is Status.FAIL


def test_gpu_nodes_are_the_agents_nodes_or_those_with_an_inventory() -> None:
    selector = {"gpupool.io/gpu-node": "true"}
    assert is_gpu_node(node(inventory=None, labels=selector), selector)
    assert is_gpu_node(node(), selector)
    assert not is_gpu_node(node(inventory=None, labels={"other": "x"}), selector)
    assert not is_gpu_node(node(inventory=None), {})


def test_validation_state_is_read_when_published() -> None:
    assert checks.validation(node()).status is Status.INFO
    passed = checks.validation(node(labels={"gpupool.io/validation.driver": "passed"},
                                    conditions=[{"type": "GpupoolReady", "status": "True"}]))
    assert (passed.status, passed.detail) == (Status.OK, "driver=passed, GpupoolReady=True")
    bad = checks.validation(node(labels={"gpupool.io/validation.cuda": "failed"}))
    assert (bad.status, bad.detail) == (Status.FAIL, "failed: cuda=failed")
    cond = checks.validation(node(conditions=[{"type": "GpupoolReady", "status": "False", "reason": "NoDriver",
                                               "message": "libcuda missing"}]))
    assert cond.status is Status.FAIL and "NoDriver: libcuda missing" in cond.detail


def test_toolkit_is_information() -> None:
    assert "not reported by the agents" in checks.toolkit([node()]).detail
    reported = node(inventory=json.dumps({"toolkit": {"envvar": False}}))
    assert checks.toolkit([reported]).detail == "gpu-1: {'envvar': False}"


def device_class(name: str, driver: str = "gpu.gpupool.io", isolation: Any = None, **extra_config: Any) -> Obj:
    """A DeviceClass as the chart writes one (selector on the driver; an opaque config when isolation is
    given, `extra_config` merged into its parameters)."""
    spec: Obj = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
    if isolation is not None or extra_config:
        params = {"apiVersion": f"{driver}/v1", "kind": "GpuConfig", **extra_config}
        if isolation is not None:
            params["isolation"] = isolation
        spec["config"] = [{"opaque": {"driver": driver, "parameters": params}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


NVIDIA_CLASS = device_class("gpu.nvidia.com", driver="gpu.nvidia.com")


def test_dra_classes_other_than_gpupools_are_information() -> None:
    unserved = checks.device_classes(None)
    assert (unserved.status, unserved.detail) == (Status.INFO, "resource.k8s.io/v1 is not served by this API server")
    empty = checks.device_classes([])
    assert (empty.status, empty.detail) == (Status.INFO, "none of gpupool's DRA classes installed (chart value "
                                                         "dra.enabled)")
    # Another driver's class is named, and is not taken for ours.
    others = checks.device_classes([NVIDIA_CLASS, {"metadata": {"name": "bare"}}])
    assert (others.status, others.detail) == (
        Status.INFO, "none of gpupool's DRA classes installed (chart value dra.enabled); other classes: bare, "
                     "gpu.nvidia.com")


def test_gpupools_dra_classes_are_recognised_by_their_selector() -> None:
    chart = [device_class("gpu.gpupool.io", isolation="hook"), device_class("mps.gpu.gpupool.io", isolation="mps"),
             device_class("whole.gpu.gpupool.io", isolation="none")]
    found = checks.device_classes([NVIDIA_CLASS, *chart])
    assert (found.status, found.detail) == (
        Status.OK, "gpupool's classes: gpu.gpupool.io (hook), mps.gpu.gpupool.io (mps), whole.gpu.gpupool.io (none)")
    # By what the class selects, not by its name: an admin's own class narrowing ours counts, and is served
    # with the default isolation when it carries no config of ours.
    narrowed = device_class("a100s", isolation=None)
    narrowed["spec"]["selectors"][0]["cel"]["expression"] += ' && device.attributes["gpu.gpupool.io"].model == "A100"'
    assert checks.device_classes([narrowed]).detail == "gpupool's classes: a100s (hook, the default)"
    assert checks.device_classes([device_class("gpu.gpupool.io.copy", driver="gpu.nvidia.com")]).status is Status.INFO


def test_a_gpupool_class_naming_no_valid_isolation_is_a_warning() -> None:
    """The driver refuses every claim of a class whose config of ours names an isolation it does not know, or
    none (api/dra.py), so the doctor warns with the class's name and the value it found."""
    bad = checks.device_classes([device_class("gpu.gpupool.io", isolation="hook"),
                                 device_class("fast.gpu.gpupool.io", isolation="vfio"),
                                 device_class("empty.gpu.gpupool.io", extra="x")])
    assert bad.status is Status.WARN
    assert bad.detail == ("empty.gpu.gpupool.io names isolation None; fast.gpu.gpupool.io names isolation 'vfio': "
                          "the driver refuses their claims (use hook, mps, none, mig, remote)")
    assert "helm upgrade" in bad.fix


def test_dra_class_names_are_escaped_when_shown() -> None:
    """Class names and config values come from the cluster: the table shows them as text, never as markup
    or terminal escapes."""
    for isolation in ("hook", "[red]vfio"):  # the class listed (ok), and named in a warning
        hostile = device_class("[bold]x[/bold]\x1b]8;;http://evil\x07", isolation=isolation)
        console = Console(record=True, width=300, color_system=None)
        console.print(render([checks.device_classes([hostile])]))
        text = console.export_text()
        assert "[bold]x[/bold]" in text and "\x1b" not in text and "\x07" not in text, text


def test_rbac_names_each_denied_right() -> None:
    reviews = [Review("patch nodes", "inventory", True), Review("list pods", "identify", False)]
    denied = checks.rbac("agent", "gp-agent", reviews, "gp")
    assert (denied.status, denied.detail) == (Status.FAIL, "denied: list pods (identify)")
    assert checks.rbac("agent", "gp-agent", reviews[:1], "gp").status is Status.OK
    broken = checks.rbac("agent", "gp-agent", [Review("x", "y", False, "forbidden")], "gp")
    assert broken.status is Status.FAIL and "could not ask" in broken.detail
    assert checks.failed([denied]) and not checks.failed([checks.rbac("agent", "a", reviews[:1], "gp")])


def test_names_from_the_cluster_cannot_inject_markup_or_escapes() -> None:
    console = Console(record=True, width=200, color_system=None)
    console.print(render([Finding("agent", "node [bold]x[/bold]\x1b]8;;http://evil\x07", Status.FAIL, "[red]d")]))
    text = console.export_text()
    assert "node [bold]x[/bold]" in text and "[red]d" in text
    assert "\x1b" not in text


async def test_agent_pods_not_ready_are_a_warning_while_the_checked_nodes_are_served() -> None:
    """The DaemonSet's readiness is judged with the nodes' evidence: pods not ready (e.g. on a node outside
    --nodes that no kubelet runs) only warn while every node checked has a fresh inventory and its slots; with
    a node not served they fail."""
    from gpupool.cluster.memory import MemoryCluster
    from gpupool.doctor.collect import Doctor, Options

    daemonset = {"metadata": {"name": "gp-agent", "namespace": "ns"},
                 "spec": {"template": {"spec": {"nodeSelector": {"gpupool.io/gpu-node": "true"}}}},
                 "status": {"desiredNumberScheduled": 1, "numberReady": 0}}

    async def verdict(*nodes: Obj) -> Finding:
        cluster = MemoryCluster()
        for n in nodes:
            await cluster.create_node(n)
        doctor = Doctor(cluster, Options(namespace="ns", node_labels={"scope": "in"}), clock=lambda: 0.0)
        await doctor._nodes([daemonset])
        return next(f for f in doctor.findings if f.subject == "DaemonSet gp-agent")

    served = node("gpu-1", labels={"scope": "in", "gpupool.io/gpu-node": "true"})
    outside = node("gpu-2", inventory=None, slots=None, labels={"gpupool.io/gpu-node": "true"})
    warned = await verdict(served, outside)
    assert warned.status is Status.WARN and "yet the component answers" in warned.detail
    stopped = node("gpu-3", slots="0", labels={"scope": "in", "gpupool.io/gpu-node": "true"})
    assert (await verdict(served, stopped)).status is Status.FAIL


async def test_the_dra_rights_are_asked_only_of_a_release_with_dra() -> None:
    """With dra.enabled (seen as GPUPOOL_AGENT_DRA on the agent) the doctor also asks for the agent's
    ResourceSlice and claim rights and for the scheduler's pod patch (removing the scheduling gate); without,
    it does not, since the chart grants none of them then. The watchdog's variable is read the same way."""
    from gpupool.cluster.memory import MemoryCluster
    from gpupool.cluster.port import Kind
    from gpupool.doctor.collect import Doctor, Options

    class Answering(MemoryCluster):
        """Allows every SubjectAccessReview and keeps what was asked: (user, verb, resource)."""

        def __init__(self) -> None:
            super().__init__()
            self.asked: set[tuple[str, str, str]] = set()

        async def create_object(self, kind: Kind, obj: Obj, *, dry_run: bool = False) -> Obj:
            spec = obj["spec"]
            attrs = spec["resourceAttributes"]
            resource = "/".join(x for x in (attrs.get("group", ""), attrs["resource"]) if x)
            self.asked.add((spec["user"].rsplit(":", 1)[-1], attrs["verb"], resource))
            return {"status": {"allowed": True}}

    def workload(account: str, env: dict[str, str] | None = None) -> Obj:
        container = {"name": "c", "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
        return {"spec": {"template": {"spec": {"serviceAccountName": account, "containers": [container]}}}}

    async def asked(agent_env: dict[str, str]) -> tuple[set[tuple[str, str, str]], list[Finding]]:
        cluster = Answering()
        doctor = Doctor(cluster, Options(namespace="ns"), clock=lambda: 0.0)
        await doctor._rbac({"scheduler": workload("gp-scheduler"), "webhook": workload("gp-webhook"),
                            "agent": workload("gp-agent", agent_env)})
        return cluster.asked, doctor.findings

    dra_rights = {("gp-scheduler", "patch", "pods"),
                  ("gp-scheduler", "create", "resource.k8s.io/resourceclaimtemplates"),
                  ("gp-agent", "get", "resource.k8s.io/resourceslices"),
                  ("gp-agent", "create", "resource.k8s.io/resourceslices"),
                  ("gp-agent", "patch", "resource.k8s.io/resourceslices"),
                  ("gp-agent", "delete", "resource.k8s.io/resourceslices"),
                  ("gp-agent", "get", "resource.k8s.io/resourceclaims")}
    watchdog = ("gp-agent", "create", "events")
    without, _ = await asked({})
    assert not dra_rights & without and watchdog not in without
    with_dra, findings = await asked({"GPUPOOL_AGENT_DRA": "true"})
    assert with_dra == without | dra_rights
    assert [f.status for f in findings] == [Status.OK] * 3
    both, _ = await asked({"GPUPOOL_AGENT_DRA": "true", "GPUPOOL_AGENT_WATCHDOG": "true"})
    assert both == with_dra | {watchdog}


async def test_every_vendors_agent_daemonset_is_judged_with_its_own_pods() -> None:
    """A release serving NVIDIA and AMD nodes has two agent DaemonSets (chart value agent.vendors): each is
    reported, and the one not ready points at its own pods (component agent-amd), not NVIDIA's."""
    from gpupool.cluster.memory import MemoryCluster
    from gpupool.doctor.collect import Doctor, Options

    def daemonset(name: str, component: str, ready: int) -> Obj:
        return {"metadata": {"name": name, "namespace": "ns"},
                "spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/component": component}},
                                      "spec": {"nodeSelector": {"gpupool.io/gpu-node": "true"}}}},
                "status": {"desiredNumberScheduled": 1, "numberReady": ready}}

    cluster = MemoryCluster()
    await cluster.create_node(node("gpu-1", slots="0", labels={"gpupool.io/gpu-node": "true"}))
    doctor = Doctor(cluster, Options(namespace="ns"), clock=lambda: 0.0)
    await doctor._nodes([daemonset("gp-agent", "agent", 1), daemonset("gp-agent-amd", "agent-amd", 0)])
    found = {f.subject: f for f in doctor.findings if f.subject.startswith("DaemonSet ")}
    assert found["DaemonSet gp-agent"].status is Status.OK
    amd = found["DaemonSet gp-agent-amd"]
    assert amd.status is Status.FAIL and "logs -l app.kubernetes.io/component=agent-amd" in amd.fix
