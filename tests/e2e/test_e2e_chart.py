"""The Helm chart installed for real on the testbed's API server (v1.37.2): `helm install`, `helm upgrade` and
`helm uninstall` with helm built from its Go module (scripts/k8s/build.sh), and what each leaves in the cluster.

The API server validates every object as a cluster would: the webhooks' matchConditions and the agent's
ValidatingAdmissionPolicy are compiled by it (CEL), the RBAC, PodDisruptionBudgets and NetworkPolicies are
checked against its schemas. The chart's pods cannot start here (their image is not on the testbed's nodes):
until their programs run, the release's admission webhook has no endpoint and a GPU pod is refused (the
chart fails closed). Then the release's pods run as local processes (scripts/k8s/release.py: each
container's own arguments and environment as installed, the release's ServiceAccounts, ConfigMaps and
certificate, the webhook reached through the release's Service) beside a real node, and a share pod
created with kubectl, as a tenant writes it, is admitted by the release's webhook, scheduled by its
kube-scheduler and extender, and runs with the grant of the release's agent (which may patch only its own
node: the release's policy sees the node in the agent's token). After `helm upgrade` the restarted
programs follow the new values; after `helm uninstall` nothing of the release is left and GPU pods are
admitted again.

The release is its own (`lc` in `gpupool-lc`, scheduler name `gpupool-lc`), beside the `gp` release whose
RBAC the other e2e tests apply, so the two never share an object.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import ROOT
from tests.e2e.kubectl_tool import kubectl_binary, release_objects
from tests.e2e.real_node_fixtures import _ensure_tools, parse_grant, wait_for
from tests.harness import fleet
from tests.harness import testbed as tb

sys.path.insert(0, str(ROOT / "scripts" / "k8s"))

import realnode  # noqa: E402
import release  # noqa: E402

pytestmark = pytest.mark.e2e
RELEASE, NAMESPACE, TENANT = "lc", "gpupool-lc", "e2e-chart-tenant"
CHART = ROOT / "deploy" / "helm" / "gpupool"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"


class Tools:
    def __init__(self, bed: tb.Testbed) -> None:
        self.kubeconfig = str(bed.kubeconfig())
        self.kubectl_bin = kubectl_binary()
        self.release = release.LocalRelease(bed, RELEASE, NAMESPACE, values=[
            "--set", "schedulerName=gpupool-lc", "--set", "webhook.certs.mode=helm", "--set", "agent.backend=fake",
            "--set-json", 'agent.fakeGpus={"gpus":[{"count":3,"model":"L40S","memory_mib":46068}]}'])

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.kubectl_bin), "--kubeconfig", self.kubeconfig, *args], input=stdin,
                              capture_output=True, text=True, timeout=120, check=False)

    def left(self) -> list[str]:
        """kind/name of every object of the release still in the cluster."""
        return release_objects(self.kubectl, NAMESPACE, RELEASE)


@pytest.fixture(scope="module")
def tools(testbed: tb.Testbed, chart_rbac: object) -> Iterator[Tools]:
    """After chart_rbac: the CRDs are in the cluster before helm tries to install them (it skips them)."""
    t = Tools(testbed)
    testbed.tenant_namespace(TENANT)
    try:
        yield t
    finally:
        t.release.stop()
        with contextlib.suppress(tb.TestbedError):  # a failed test must not leave the webhooks
            t.release.helm("uninstall", RELEASE, "-n", NAMESPACE)


@pytest.fixture(scope="module")
def node(testbed: tb.Testbed) -> Iterator[realnode.RealNode]:
    """One real node (containerd + kubelet), tainted so that only this module's share pod lands on it."""
    _ensure_tools()
    nodes = realnode.RealNodes(testbed, 1, taint=True).start()
    try:
        yield nodes.nodes[0]
    finally:
        nodes.stop()


def gpu_pod(name: str) -> str:
    pod = fleet.plain_pod(name, TENANT, scheduler="default-scheduler", node_selector={"e2e/group": "nowhere"},
                          limits={"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "4096"})
    del pod["spec"]["schedulerName"]
    return json.dumps(pod)


def allocatable_slots(tools: Tools, name: str) -> int:
    out = tools.kubectl("get", "node", name, "-o", "jsonpath={.status.allocatable.gpupool\\.io/gpu}")
    return int(out.stdout or "0")


def test_install_run_a_share_pod_upgrade_uninstall(tools: Tools, testbed: tb.Testbed,
                                                   node: realnode.RealNode) -> None:
    rel = tools.release
    rel.install()
    installed = tools.left()
    kinds = {n.split("/")[0] for n in installed}
    assert {"deployment.apps", "daemonset.apps", "mutatingwebhookconfiguration.admissionregistration.k8s.io",
            "validatingwebhookconfiguration.admissionregistration.k8s.io",
            "validatingadmissionpolicy.admissionregistration.k8s.io"} <= kinds, installed
    # The API server compiled the chart's CEL: no type-checking warnings on the agent's policy.
    policy = next(n for n in installed if n.startswith("validatingadmissionpolicy."))
    doc = json.loads(tools.kubectl("get", policy, "-o", "json").stdout)
    assert not ((doc.get("status") or {}).get("typeChecking") or {}).get("expressionWarnings"), doc["status"]
    hooks = yaml.safe_load(tools.kubectl("get", "mutatingwebhookconfiguration", "-l", INSTANCE, "-o", "yaml").stdout)
    assert all(w.get("matchConditions") for item in hooks["items"] for w in item["webhooks"])

    # Fails closed: nothing serves the release's webhook yet, so a GPU pod is refused ...
    out = tools.kubectl("create", "--dry-run=server", "-f", "-", stdin=gpu_pod("while-installed"))
    assert out.returncode != 0 and "gpupool" in out.stderr, out.stderr

    # ... and once the release's programs run, a share pod written as a tenant writes it runs.
    rel.start([node])
    wait_for(lambda: allocatable_slots(tools, node.name) == 3 * 10, 120, "the release's agent's 30 slots",
             lambda: "\n".join(p.tail(5) for p in rel.processes))
    # On this module's node: the suite's shared control plane may hold other tests' fake GPU nodes.
    pod = release.example_pod("share", TENANT, memory_mib=4096, cores=20,
                              node_selector={realnode.REAL_NODE_LABEL: node.labels[realnode.REAL_NODE_LABEL]})
    created = tools.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    assert created.returncode == 0, created.stderr

    def grant() -> dict[str, str] | None:
        logs = tools.kubectl("-n", TENANT, "logs", "share")
        return parse_grant(logs.stdout)[0] if "GPUPOOL_MEMORY_LIMIT_MIB" in logs.stdout else None

    env = wait_for(grant, 120, "the share pod's grant", lambda: "\n".join(p.tail(5) for p in rel.processes))
    assert (env["GPUPOOL_MEMORY_LIMIT_MIB"], env["GPUPOOL_CORES_PERCENT"]) == ("4096", "20")
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith(f"GPU-{node.name.replace('.', '-')}-")
    admitted: dict[str, Any] = json.loads(tools.kubectl("-n", TENANT, "get", "pod", "share", "-o", "json").stdout)
    assert admitted["spec"]["schedulerName"] == "gpupool-lc"  # written by the release's webhook
    assert admitted["spec"]["nodeName"] == node.name

    rel.upgrade("--set", "splitCount=5")
    status = json.loads(rel.helm("status", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    assert (status["version"], status["info"]["status"]) == (2, "deployed")
    assert tools.left() == installed  # the same objects, changed in place
    # The DaemonSet rolls its pods; here: the programs restart with the upgraded container spec.
    rel.stop()
    rel.start([node])
    wait_for(lambda: allocatable_slots(tools, node.name) == 3 * 5, 120, "15 slots after the upgrade",
             lambda: "\n".join(p.tail(5) for p in rel.processes))
    tools.kubectl("-n", TENANT, "delete", "pod", "share", "--grace-period=1", "--wait=true")

    rel.uninstall()
    assert tools.left() == []
    # ... and admitted once the release is gone (no configuration of it left behind).
    out = tools.kubectl("create", "--dry-run=server", "-f", "-", stdin=gpu_pod("after-uninstall"))
    assert out.returncode == 0, out.stderr
