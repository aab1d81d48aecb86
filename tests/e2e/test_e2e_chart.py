"""The Helm chart installed for real as release `lc` (in `gpupool-lc`, scheduler name `gpupool-lc`, DRA off:
the device plugin alone), its own pods run by two real nodes' kubelets (scripts/k8s/release.py's
ChartRelease, on test_e2e_chart_pods.py's control plane that serves pods), and `gpupool doctor` run against
it as a user runs it. One installed release serves all three tests, in order:

1. `helm install` with the webhook's pods placeable on no node: every object accepted (the agent's policy
   type-checks clean, the webhooks keep `matchConditions`), and a GPU pod refused while nothing serves the
   webhook (the chart fails closed); `helm upgrade` to the default placement, then a share pod created with kubectl as a
   tenant writes it is admitted by the webhook pod (the release's own scheduler name written), placed by the
   scheduler pod and granted by the agent pod of its node.
2. `gpupool doctor` (the CLI, the administrator's kubeconfig, its default node selection) passes the healthy
   release, also asking the extender itself through `kubectl port-forward`; then names each fault put in
   (exit 1) and passes again once it is undone:
   - the webhook's pods scaled to 0: the server-side dry run is refused (`failed calling webhook`);
   - the extender entry removed from the scheduler ConfigMap;
   - the agent's pod gone from one node (the node's gpu-node label removed, so the DaemonSet leaves it):
     the kubelet's allocatable gpupool.io/gpu drops to 0 there;
   - `patch nodes` removed from the agent's ClusterRole: its SubjectAccessReview is denied;
   - a toolkit fault in the agents' fake-GPU ConfigMap, re-validated at SIGHUP: each node's validation
     state says which step and why.
3. `helm upgrade --set splitCount=5`: the same objects, the agent pods rolled to 5 slots per GPU; `helm
   uninstall`: nothing of the release left, no program of it running, GPU pods admitted again.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ROOT
from tests.e2e.kubectl_tool import release_objects
from tests.e2e.real_node_fixtures import parse_grant, wait_for
from tests.e2e.test_e2e_chart_pods import Cluster, chart_cluster, release
from tests.harness import testbed as tb

sys.path.insert(0, str(ROOT / "scripts" / "k8s"))

import realnode  # noqa: E402

pytestmark = pytest.mark.e2e
RELEASE, NAMESPACE, TENANT = "lc", "gpupool-lc", "e2e-chart-tenant"
FULLNAME = f"{RELEASE}-gpupool"
SCHEDULER_NAME = "gpupool-lc"
GPUS = release.FAKE_GPU_COUNT
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with chart_cluster(RELEASE, NAMESPACE) as c:
        c.release.values = ["--set", f"schedulerName={SCHEDULER_NAME}"]
        c.release.dra = False
        c.bed.tenant_namespace(TENANT)
        yield c


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    """The release installed and Ready (the first test installs it; this installs it when that one failed
    before)."""
    rel = cluster.release
    try:
        rel.helm("status", rel.name, "-n", rel.namespace)
    except tb.TestbedError:
        rel.install()
    rel.wait_ready(timeout_s=420)
    return cluster


def gpu_pod(name: str) -> str:
    """A share pod for a server-side dry run only (a node selector no node matches)."""
    pod = release.example_pod(name, TENANT, memory_mib=4096, cores=20)
    pod["spec"]["nodeSelector"] = {"e2e/group": "nowhere"}
    return json.dumps(pod)


def objects(c: Cluster) -> list[str]:
    """kind/name of the release's own objects (its pods aside: those a rollout replaces)."""
    return release_objects(c.kubectl, NAMESPACE, RELEASE)


def test_install_fails_closed_until_the_webhook_serves_then_runs_a_share_pod(cluster: Cluster) -> None:
    c, rel = cluster, cluster.release
    # The webhook's pods can run on no node (a node selector none matches): installed, not yet serving.
    rel.values += ["--set-json", 'webhook.nodeSelector={"e2e/group": "nowhere"}']
    rel.install()
    installed = objects(c)
    kinds = {n.split("/")[0] for n in installed}
    assert {"deployment.apps", "daemonset.apps", "mutatingwebhookconfiguration.admissionregistration.k8s.io",
            "validatingwebhookconfiguration.admissionregistration.k8s.io",
            "validatingadmissionpolicy.admissionregistration.k8s.io"} <= kinds, installed
    # The API server compiled the chart's CEL: no type-checking warnings on the agent's policy.
    policy = next(n for n in installed if n.startswith("validatingadmissionpolicy."))
    doc = json.loads(c.kubectl("get", policy, "-o", "json").stdout)
    assert not ((doc.get("status") or {}).get("typeChecking") or {}).get("expressionWarnings"), doc["status"]
    hooks = json.loads(c.kubectl("get", "mutatingwebhookconfiguration", "-l", release_instance(),
                                 "-o", "json").stdout)
    assert hooks["items"] and all(w.get("matchConditions") for item in hooks["items"] for w in item["webhooks"])

    # Fails closed: no pod serves the release's webhook, so a GPU pod is refused ...
    out = c.kubectl("create", "--dry-run=server", "-f", "-", stdin=gpu_pod("while-installed"))
    assert out.returncode != 0 and "gpupool" in out.stderr, out.stderr

    # ... and once its pods serve, a share pod written as a tenant writes it runs.
    rel.upgrade("--set", "webhook.nodeSelector=null")  # the chart's default again: any node
    rel.wait_ready(timeout_s=420)
    assert objects(c) == installed  # the same objects, changed in place
    for node in c.nodes.nodes:
        assert release.gpu_slots(c.bed, node.name) == GPUS * 10, node.name
    pod = release.example_pod("share", TENANT, memory_mib=4096, cores=20)
    assert "schedulerName" not in pod["spec"]
    created = c.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    assert created.returncode == 0, created.stderr

    def grant() -> dict[str, str] | None:
        logs = c.kubectl("-n", TENANT, "logs", "share")
        return parse_grant(logs.stdout)[0] if "GPUPOOL_MEMORY_LIMIT_MIB" in logs.stdout else None

    env = wait_for(grant, 180, "the share pod's grant",
                   lambda: c.kubectl("-n", TENANT, "get", "pod", "share", "-o", "wide").stdout + rel.describe_pods())
    admitted: Obj = json.loads(c.kubectl("-n", TENANT, "get", "pod", "share", "-o", "json").stdout)
    assert admitted["spec"]["schedulerName"] == SCHEDULER_NAME  # the release's value, written by its webhook
    node = admitted["spec"]["nodeName"]
    assert node in {n.name for n in c.nodes.nodes}
    assert (env["GPUPOOL_MEMORY_LIMIT_MIB"], env["GPUPOOL_CORES_PERCENT"]) == ("4096", "20")
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith(f"GPU-{node}-"), env  # one of its node's own GPUs
    deleted = c.kubectl("-n", TENANT, "delete", "pod", "share", "--grace-period=1", "--wait=true")
    assert deleted.returncode == 0, deleted.stderr


def release_instance() -> str:
    return f"app.kubernetes.io/instance={RELEASE}"


# --- gpupool doctor -------------------------------------------------------------------------------------------
class Doctor:
    def __init__(self, c: Cluster) -> None:
        self.c, self.rel = c, c.release

    def run(self, *more: str) -> tuple[int, Obj]:
        done = subprocess.run(
            [*tb.gpupool_argv(), "doctor", "--kubeconfig", str(self.c.bed.kubeconfig()), "-n", NAMESPACE,
             "--release", RELEASE, "--json", *more], capture_output=True, text=True, timeout=120, check=False)
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, json.loads(done.stdout)

    def failing(self) -> Obj | None:
        rc, report = self.run()
        return report if rc == 1 and not report["ok"] else None

    def healthy(self, *more: str) -> Obj:
        """The doctor passes (waiting for the state a repair leads to, e.g. the agent's pod Ready again)."""
        def passes() -> Obj | None:
            rc, report = self.run(*more)
            return report if rc == 0 and report["ok"] else None

        return wait_for(passes, 180, "a passing doctor",  # type: ignore[no-any-return]
                        lambda: json.dumps(failures(self.run(*more)[1])) + "\n" + self.rel.describe_pods(), step_s=2)


def failures(report: Obj) -> list[tuple[str, str, str]]:
    return [(f["area"], f["subject"], f["detail"]) for f in report["findings"] if f["status"] == "fail"]


@contextlib.contextmanager
def port_forward(c: Cluster) -> Iterator[str]:
    """`kubectl port-forward` to the extender's port in the scheduler pod (it listens on the pod's loopback),
    as the doctor's own hint tells a user; yields the local URL."""
    port = c.release.extender_port()
    with subprocess.Popen([str(c.kubectl_bin), "--kubeconfig", str(c.bed.kubeconfig()), "-n", NAMESPACE,
                           "port-forward", f"deployment/{FULLNAME}-scheduler", f":{port}"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:NNNNN -> PORT"
            found = re.search(r"127\.0\.0\.1:(\d+) ->", line)
            assert found, line + (proc.stdout.read() if proc.poll() is not None else "")
            yield f"http://127.0.0.1:{found.group(1)}"
        finally:
            proc.terminate()  # the with block then waits for it and closes its pipe


def agent_pid(rel: release.ChartRelease, node: str) -> int:
    """The agent's process (this host's pid namespace: the agent pod runs with hostPID) of `node`'s pod."""
    pod = rel.agent_pod(node)
    assert pod is not None, rel.describe_pods()
    uid = pod["metadata"]["uid"]
    pids = [p.pid for p in rel.processes() if p.role == "agent" and p.pod_uid in (uid, uid.replace("-", "_"))]
    assert len(pids) == 1, (node, pids)
    return int(pids[0])


def changed(fake_file: Path, reason: str | None) -> bool:
    return ("validation" in fake_file.read_text()) == bool(reason)


def test_doctor_passes_a_healthy_release_then_names_each_fault(installed: Cluster) -> None:
    c, rel, doc = installed, installed.release, Doctor(installed)
    node0, node1 = (n.name for n in c.nodes.nodes)
    report = doc.healthy()
    by_area = {(f["area"], f["status"]) for f in report["findings"]}
    # Every area was checked, and the functional probes passed (not merely skipped); DRA is off here.
    assert {("webhook", "ok"), ("scheduler", "ok"), ("agent", "ok"), ("rbac", "ok"), ("dra", "info")} <= by_area
    ok = [f["subject"] for f in report["findings"] if f["status"] == "ok"]
    assert "dry-run GPU pod in a scratch namespace" in ok
    assert {f"node {node0}", f"node {node1}", "extender"} <= set(ok), ok  # the extender: its pod's readiness
    assert [f["subject"] for f in report["findings"] if f["area"] == "rbac"] == [
        f"scheduler ({FULLNAME}-scheduler)", f"agent ({FULLNAME}-agent)", f"webhook ({FULLNAME}-webhook)"]
    # ... and the extender asked itself, as a user does through kubectl port-forward.
    with port_forward(c) as url:
        report = doc.healthy("--extender-url", url)
        assert f"extender {url}/readyz" in [f["subject"] for f in report["findings"] if f["status"] == "ok"]

    # 1. The webhook's pods gone: the configuration still names the Service, the API server cannot call it.
    webhook = f"deployment/{FULLNAME}-webhook"
    assert c.kubectl("-n", NAMESPACE, "scale", webhook, "--replicas=0").returncode == 0
    wait_for(lambda: "service webhook: no ready endpoint" in rel.not_ready(), 120, "the webhook without endpoints",
             rel.describe_pods)
    report = wait_for(doc.failing, 60, "the doctor failing")
    assert any(a == "webhook" and "failed calling webhook" in d for a, _, d in failures(report)), failures(report)
    assert c.kubectl("-n", NAMESPACE, "scale", webhook, "--replicas=2").returncode == 0
    doc.healthy()

    # 2. The extender entry removed from kube-scheduler's configuration.
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{FULLNAME}-scheduler"
    saved = (realnode.api_request(c.bed, "GET", path) or {})["data"]
    key = "scheduler-config.yaml"
    without = "\n".join(line for line in saved[key].splitlines() if "gpupool.io/gpu" not in line)
    assert realnode.api_request(c.bed, "PATCH", path, {"data": {key: without}}) is not None
    rc, report = doc.run()
    assert rc == 1
    assert [s for a, s, d in failures(report) if "no extender manages gpupool.io/gpu" in d] == [
        "kube-scheduler configuration"], failures(report)
    assert realnode.api_request(c.bed, "PATCH", path, {"data": saved}) is not None
    doc.healthy()

    # 3. The agent's pod gone from node 0 (the DaemonSet leaves a node without its label): the kubelet takes
    # the node's devices away (allocatable 0); the node still carries the agent's inventory, so it is checked.
    label = f"{release.GPU_NODE_LABEL}"
    assert c.kubectl("label", "node", node0, f"{label}-").returncode == 0
    wait_for(lambda: rel.agent_pod(node0) is None and release.gpu_slots(c.bed, node0) == 0, 120,
             "node 0 without its agent pod, allocatable 0", rel.describe_pods)
    rc, report = doc.run()
    assert rc == 1
    assert [(a, s) for a, s, d in failures(report) if "allocatable gpupool.io/gpu is 0" in d] == [
        ("agent", f"node {node0}")], failures(report)
    assert c.kubectl("label", "node", node0, f"{label}=true").returncode == 0
    doc.healthy()

    # 4. A verb removed from the agent's ClusterRole.
    role_path = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{FULLNAME}-agent"
    rules = (realnode.api_request(c.bed, "GET", role_path) or {})["rules"]
    cut = [{**r, "verbs": [v for v in r["verbs"] if not (r["resources"] == ["nodes"] and v == "patch")]} for r in rules]
    assert cut != rules
    assert realnode.api_request(c.bed, "PATCH", role_path, {"rules": cut}) is not None
    # The API server's authorizer learns of the change through its own watch: wait for the doctor to see it.
    report = wait_for(doc.failing, 60, "the cut rule seen", step_s=1)
    denied = [(s, d) for a, s, d in failures(report) if a == "rbac"]
    assert len(denied) == 1 and denied[0][0] == f"agent ({FULLNAME}-agent)", failures(report)
    assert "patch nodes" in denied[0][1], denied
    assert realnode.api_request(c.bed, "PATCH", role_path, {"rules": rules}) is not None
    doc.healthy()

    # 5. The nodes fail validation: a toolkit fault in the agents' fake-GPU file (the chart's ConfigMap),
    # re-validated at SIGHUP (docs/agent.md); each agent withdraws its GPUs and publishes why.
    fake_path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{FULLNAME}-agent-fake"
    fake = (realnode.api_request(c.bed, "GET", fake_path) or {})["data"]
    (fake_key,) = fake

    def validation_fault(reason: str | None) -> None:
        gpus = {**release.FAKE_GPUS, "validation": {"toolkit": reason}} if reason else release.FAKE_GPUS
        data = {fake_key: json.dumps(gpus)} if reason else fake
        assert realnode.api_request(c.bed, "PATCH", fake_path, {"data": data}) is not None
        for node in (node0, node1):
            pid, pod = agent_pid(rel, node), rel.agent_pod(node) or {}
            # The kubelet rewrites a ConfigMap volume when it syncs the pod: an annotation makes it sync now.
            c.kubectl("-n", NAMESPACE, "annotate", "--overwrite", "pod", pod["metadata"]["name"],
                      f"e2e.gpupool.io/validation-fault={'on' if reason else 'off'}")
            seen = Path(f"/proc/{pid}/root/etc/gpupool/fake/{fake_key}")  # the file as the agent reads it
            wait_for(functools.partial(changed, seen, reason), 150, f"{node}'s agent seeing its fake-GPU file changed")
            os.kill(pid, signal.SIGHUP)  # re-validate now

    validation_fault("toolkit 1.17.3 is older than 1.17.8")
    wait_for(lambda: release.gpu_slots(c.bed, node0) == 0 and release.gpu_slots(c.bed, node1) == 0, 120,
             "allocatable 0 after the validation fault", rel.describe_pods)
    report = wait_for(doc.failing, 60, "the failing step seen", step_s=1)
    named = sorted((s, d) for a, s, d in failures(report) if a == "validation")
    assert [s for s, _ in named] == sorted([f"node {node0}", f"node {node1}"]), failures(report)
    assert all("toolkit" in d and "1.17.3" in d for _, d in named), named
    validation_fault(None)
    doc.healthy()


def test_upgrade_rolls_the_agents_then_uninstall_leaves_nothing(installed: Cluster) -> None:
    c, rel = installed, installed.release
    before = objects(c)
    agents = {p["metadata"]["name"] for p in rel.component_pods("agent")}
    revision = json.loads(rel.helm("status", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)["version"]
    rel.upgrade("--set", "splitCount=5")
    status = json.loads(rel.helm("status", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    assert (status["version"], status["info"]["status"]) == (revision + 1, "deployed")
    assert objects(c) == before  # the same objects, changed in place
    wait_for(lambda: all(release.gpu_slots(c.bed, n.name) == GPUS * 5 for n in c.nodes.nodes)
             and not rel.not_ready(), 300, "both nodes at 5 slots per GPU, the release Ready", rel.describe_pods)
    rolled = {p["metadata"]["name"] for p in rel.component_pods("agent")}
    assert len(rolled) == 2 and not rolled & agents, (agents, rolled)  # new pods with the new value

    rel.uninstall()
    assert c.left() == []
    assert rel.processes() == []
    # ... and admitted once the release is gone (no configuration of it left behind).
    out = c.kubectl("create", "--dry-run=server", "-f", "-", stdin=gpu_pod("after-uninstall"))
    assert out.returncode == 0, out.stderr
