"""`gpupool doctor` on a real installation: the chart installed with helm (release `dr` in `gpupool-dr`), its
pods run as local processes beside one real node (scripts/k8s/release.py, as test_e2e_chart.py does). The
doctor, run as a user runs it (the CLI, the administrator's kubeconfig), passes the healthy release, then
names each fault put in (and fails) and passes again once it is undone:

- the webhook process stopped: the server-side dry run is refused (`failed calling webhook`);
- the extender entry removed from the scheduler ConfigMap;
- the agent stopped on the node: the kubelet's allocatable gpupool.io/gpu drops to 0;
- a verb removed from the agent's ClusterRole: its SubjectAccessReview is denied;
- the node failing validation (a toolkit fault in the agent's fake GPU file, re-validated on SIGHUP): the
  node's validation state says which step and why.

The node checks are limited to this module's node (`--nodes`): the suite's shared control plane holds other
tests' fake GPU nodes, which no agent serves. The extender is asked at the URL the local process listens on
(`--extender-url`), as a user would after `kubectl port-forward`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import ROOT
from tests.e2e.real_node_fixtures import _ensure_tools, wait_for
from tests.harness import testbed as tb

sys.path.insert(0, str(ROOT / "scripts" / "k8s"))

import realnode  # noqa: E402
import release  # noqa: E402

pytestmark = pytest.mark.e2e
RELEASE, NAMESPACE = "dr", "gpupool-dr"
FULLNAME = f"{RELEASE}-gpupool"


class Installed:
    def __init__(self, bed: tb.Testbed, node: realnode.RealNode) -> None:
        self.bed, self.node = bed, node
        self.release = release.LocalRelease(bed, RELEASE, NAMESPACE, values=[
            "--set", "schedulerName=gpupool-dr", "--set", "webhook.certs.mode=helm", "--set", "agent.backend=fake",
            "--set-json", 'agent.fakeGpus={"gpus":[{"count":3,"model":"L40S","memory_mib":46068}]}'])

    def doctor(self) -> tuple[int, dict[str, Any], str]:
        label = f"{realnode.REAL_NODE_LABEL}={self.node.labels[realnode.REAL_NODE_LABEL]}"
        done = subprocess.run(
            [*tb.gpupool_argv(), "doctor", "--kubeconfig", str(self.bed.kubeconfig()), "-n", NAMESPACE,
             "--release", RELEASE, "--extender-url", self.release.extender_url, "--nodes", label, "--json"],
            capture_output=True, text=True, timeout=120, check=False)
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, json.loads(done.stdout), done.stderr

    def slots(self) -> int:
        node = realnode.api_request(self.bed, "GET", f"/api/v1/nodes/{self.node.name}") or {}
        return int(((node.get("status") or {}).get("allocatable") or {}).get("gpupool.io/gpu", "0"))

    def logs(self) -> str:
        return "\n".join(p.tail(5) for p in self.release.processes)

    def process(self, name: str) -> tb.Process:
        proc = next(p for p in self.release.processes if p.name == name)
        self.release.processes.remove(proc)
        return proc


@pytest.fixture(scope="module")
def installed(testbed: tb.Testbed, chart_rbac: object) -> Iterator[Installed]:
    """After chart_rbac: the CRDs are in the cluster before helm tries to install them (it skips them)."""
    _ensure_tools()
    nodes = realnode.RealNodes(testbed, 1, taint=True).start()
    inst = Installed(testbed, nodes.nodes[0])
    try:
        inst.release.install()
        inst.release.start([inst.node])
        wait_for(lambda: inst.slots() == 3 * 10, 120, "the agent's 30 slots (the node's fake GPU file: 3 GPUs)",
                 inst.logs)
        yield inst
    finally:
        inst.release.stop()
        with contextlib.suppress(tb.TestbedError):
            inst.release.uninstall()
        nodes.stop()


def failures(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f["area"], f["subject"], f["detail"]) for f in report["findings"] if f["status"] == "fail"]


def healthy(inst: Installed) -> dict[str, Any]:
    """The doctor passes (waiting for the state a repair leads to, e.g. the kubelet's slots back)."""
    def passes() -> dict[str, Any] | None:
        rc, report, _ = inst.doctor()
        return report if rc == 0 and report["ok"] else None

    return wait_for(passes, 120, "a passing doctor", lambda: json.dumps(failures(inst.doctor()[1])) + inst.logs(),
                    step_s=2)  # type: ignore[no-any-return]


def test_doctor_passes_a_healthy_release_then_names_each_fault(installed: Installed) -> None:
    inst = installed
    report = healthy(inst)
    by_area = {(f["area"], f["status"]) for f in report["findings"]}
    # Every area was checked, and the functional probes passed (not merely skipped).
    assert {("webhook", "ok"), ("scheduler", "ok"), ("agent", "ok"), ("rbac", "ok"), ("dra", "info")} <= by_area
    ok = [f["subject"] for f in report["findings"] if f["status"] == "ok"]
    assert "dry-run GPU pod in a scratch namespace" in ok
    assert f"node {inst.node.name}" in ok
    assert f"extender {inst.release.extender_url}/readyz" in ok
    assert [f["subject"] for f in report["findings"] if f["area"] == "rbac"] == [
        f"scheduler ({FULLNAME}-scheduler)", f"agent ({FULLNAME}-agent)", f"webhook ({FULLNAME}-webhook)"]

    # 1. The webhook stopped: its endpoint is still listed, but the API server cannot call it.
    inst.process("webhook").stop()
    rc, report, _ = inst.doctor()
    assert rc == 1 and not report["ok"]
    assert any(a == "webhook" and "failed calling webhook" in d for a, _, d in failures(report)), failures(report)
    # Restarted on a new port: the EndpointSlice is written again (ensure() leaves an existing one as it is).
    realnode.api_request(inst.bed, "DELETE", f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices/"
                                             f"{FULLNAME}-webhook-local")
    inst.release.start_webhook()
    healthy(inst)

    # 2. The extender entry removed from kube-scheduler's configuration.
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{FULLNAME}-scheduler"
    saved = (realnode.api_request(inst.bed, "GET", path) or {})["data"]
    key = "scheduler-config.yaml"
    without = "\n".join(line for line in saved[key].splitlines() if "gpupool.io/gpu" not in line)
    assert realnode.api_request(inst.bed, "PATCH", path, {"data": {key: without}}) is not None
    rc, report, _ = inst.doctor()
    assert rc == 1
    assert [s for a, s, d in failures(report) if "no extender manages gpupool.io/gpu" in d] == [
        "kube-scheduler configuration"], failures(report)
    assert realnode.api_request(inst.bed, "PATCH", path, {"data": saved}) is not None
    healthy(inst)

    # 3. The agent stopped: the kubelet takes its devices away (allocatable 0).
    inst.process(f"agent@{inst.node.name}").stop()
    wait_for(lambda: inst.slots() == 0, 120, "allocatable 0 after the agent stopped")
    rc, report, _ = inst.doctor()
    assert rc == 1
    assert [(a, s) for a, s, d in failures(report) if "allocatable gpupool.io/gpu is 0" in d] == [
        ("agent", f"node {inst.node.name}")], failures(report)
    inst.release.start_agent(inst.node)
    healthy(inst)

    # 4. A verb removed from the agent's ClusterRole.
    role_path = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{FULLNAME}-agent"
    rules = (realnode.api_request(inst.bed, "GET", role_path) or {})["rules"]
    cut = [{**r, "verbs": [v for v in r["verbs"] if not (r["resources"] == ["nodes"] and v == "patch")]} for r in rules]
    assert cut != rules
    assert realnode.api_request(inst.bed, "PATCH", role_path, {"rules": cut}) is not None
    # The API server's authorizer learns of the change through its own watch: wait for the doctor to see it.
    report = wait_for(lambda: (lambda r: r[1] if r[0] == 1 else None)(inst.doctor()), 60, "the cut rule seen",
                      step_s=1)
    denied = [(s, d) for a, s, d in failures(report) if a == "rbac"]
    assert len(denied) == 1 and denied[0][0] == f"agent ({FULLNAME}-agent)", failures(report)
    assert "patch nodes" in denied[0][1], denied
    assert realnode.api_request(inst.bed, "PATCH", role_path, {"rules": rules}) is not None
    healthy(inst)

    # 5. The node fails validation: the agent withdraws its GPUs and publishes why; the doctor names it.
    def validation_fault(reason: str | None) -> None:
        fake = realnode.fake_gpus_file(inst.node)  # the agent's GPU file on this node (rewritten healthy)
        if reason is not None:
            fake.write_text(json.dumps({**json.loads(fake.read_text()), "validation": {"toolkit": reason}}))
        agent = next(p for p in inst.release.processes if p.name == f"agent@{inst.node.name}")
        os.kill(agent.popen.pid, signal.SIGHUP)  # re-validate now (docs/agent.md)

    validation_fault("toolkit 1.17.3 is older than 1.17.8")
    wait_for(lambda: inst.slots() == 0, 120, "allocatable 0 after the validation fault", inst.logs)
    report = wait_for(lambda: (lambda r: r[1] if r[0] == 1 else None)(inst.doctor()), 60, "the failing step seen",
                      step_s=1)
    named = [(a, s, d) for a, s, d in failures(report) if a == "validation"]
    assert len(named) == 1 and named[0][1] == f"node {inst.node.name}", failures(report)
    assert "toolkit" in named[0][2] and "1.17.3" in named[0][2], named
    validation_fault(None)
    healthy(inst)
