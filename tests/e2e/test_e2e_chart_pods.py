"""The Helm chart's own pods on the testbed's real kubelets: `helm install` with the gpupool image of the
repository's Dockerfile and the kube-scheduler image the chart names (both built by scripts/image and
imported into each node's containerd, never pulled), on two real nodes (containerd + kubelet each).

The webhook Deployment's pods serve behind the release's Service (the API server calls it), the scheduler
Deployment's pod runs kube-scheduler beside the extender, and the agent DaemonSet's pod on each node
registers its device plugin through that node's kubelet directory. The pods reach the API server as in a
cluster: the `kubernetes` Service (kube-proxy), in-cluster configuration, the CA of `kube-root-ca.crt`
(scripts/k8s/release.py's ChartRelease, tests/harness/testbed.py's serve_pods). A share pod, written as a
tenant writes it (no schedulerName), is admitted by the webhook pod, placed by the scheduler pod and served
by the agent pod; no program of the release runs outside a pod; with the webhook's pods scaled to 0 a GPU
pod is refused (the chart fails closed) and admitted once they serve again; `helm upgrade` rolls the agent
pods to the new values and `helm rollback` to the previous ones while a tenant keeps running with the same
limits file; `helm uninstall` removes every object of the release and stops its containers.

This module has its own control plane (its API server must be reachable from pods; one per machine, since
its kube-proxy owns the host's Service rules).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ROOT
from tests.e2e.kubectl_tool import kubectl_binary, release_objects
from tests.e2e.real_node_fixtures import _ensure_tools, ensure_project_images, parse_grant, wait_for
from tests.harness import testbed as tb

sys.path.insert(0, str(ROOT / "scripts" / "k8s"))

import realnode  # noqa: E402
import release  # noqa: E402

pytestmark = pytest.mark.e2e
RELEASE, NAMESPACE, TENANT = "cp", "gpupool-cp", "e2e-chart-pods-tenant"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
SPLIT = 10  # the chart's splitCount
GPUS = release.FAKE_GPU_COUNT


class Cluster:
    def __init__(self, bed: tb.Testbed, nodes: realnode.RealNodes, name: str = RELEASE,
                 namespace: str = NAMESPACE, chart: type[release.ChartRelease] = release.ChartRelease) -> None:
        self.bed, self.nodes = bed, nodes
        self.release = chart(bed, name, namespace, nodes)
        self.kubectl_bin = kubectl_binary()

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.kubectl_bin), "--kubeconfig", str(self.bed.kubeconfig()), *args],
                              input=stdin, capture_output=True, text=True, timeout=120, check=False)

    def left(self) -> list[str]:
        """kind/name of every object of the release still in the cluster."""
        return release_objects(self.kubectl, self.release.namespace, self.release.name, "pods")


@contextlib.contextmanager
def chart_cluster(name: str = RELEASE, namespace: str = NAMESPACE, install: bool = False, node_count: int = 2,
                  chart: type[release.ChartRelease] = release.ChartRelease) -> Iterator[Cluster]:
    """A control plane whose pods reach it (serve_pods), a default kube-scheduler, `node_count` real nodes, and
    the chart's release `name` as `chart` installs it (installed and Ready with `install`; uninstalled at the
    end in any case)."""
    _ensure_tools()
    ensure_project_images()
    try:
        # GPUPOOL_E2E_KEEP=1 keeps the state directory (component logs) for a post-mortem.
        keep = os.environ.get("GPUPOOL_E2E_KEEP") == "1"  # the cluster's and the nodes' directories stay
        bed = tb.Testbed(serve_pods=True, keep=keep).start()
    except tb.TestbedError as e:
        pytest.fail(str(e), pytrace=False)
    nodes = None
    try:
        # The default profile places the release's own Deployment and DaemonSet pods, as on any cluster.
        bed.start_default_scheduler()
        nodes = realnode.RealNodes(bed, node_count, keep=keep).start()
        c = Cluster(bed, nodes, name, namespace, chart)
        if install:
            c.release.install()
            c.release.wait_ready(timeout_s=420)
        yield c
        with contextlib.suppress(tb.TestbedError):  # a failed test must not leave the webhooks
            c.release.helm("uninstall", name, "-n", namespace)
    finally:
        if nodes is not None:
            nodes.stop()
        bed.stop()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with chart_cluster() as c:
        c.bed.tenant_namespace(TENANT)
        yield c


def gpu_pod(name: str) -> dict[str, Any]:
    pod = release.example_pod(name, TENANT, memory_mib=4096, cores=20, testbed_taint=False)
    pod["spec"]["nodeSelector"] = {"e2e/group": "nowhere"}  # a dry run only: never placed
    return pod


def test_chart_pods_serve_a_tenant_roll_on_upgrade_and_uninstall_clean(cluster: Cluster) -> None:
    c, rel = cluster, cluster.release
    rel.install()
    # The API server compiled the chart's CEL (no type-checking warnings on the agent's policy), and the
    # mutating webhooks keep their matchConditions.
    policy = next(n for n in c.left() if n.startswith("validatingadmissionpolicy."))
    doc = json.loads(c.kubectl("get", policy, "-o", "json").stdout)
    assert not ((doc.get("status") or {}).get("typeChecking") or {}).get("expressionWarnings"), doc["status"]
    hooks = json.loads(c.kubectl("get", "mutatingwebhookconfiguration", "-l", INSTANCE, "-o", "json").stdout)
    assert hooks["items"] and all(w.get("matchConditions") for item in hooks["items"] for w in item["webhooks"])
    rel.wait_ready(timeout_s=420)
    print(f"agent pods start-to-Ready (s): {rel.agent_ready_seconds()}")
    for node in c.nodes.nodes:
        assert release.gpu_slots(c.bed, node.name) == GPUS * SPLIT, node.name

    pod = release.example_pod("share", TENANT, memory_mib=4096, cores=20)
    assert "schedulerName" not in pod["spec"]
    created = c.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    assert created.returncode == 0, created.stderr

    def grant() -> dict[str, str] | None:
        logs = c.kubectl("-n", TENANT, "logs", "share")
        return parse_grant(logs.stdout)[0] if "GPUPOOL_MEMORY_LIMIT_MIB" in logs.stdout else None

    def pod_state() -> str:
        return c.kubectl("-n", TENANT, "get", "pod", "share", "-o", "wide").stdout + rel.describe_pods()

    env = wait_for(grant, 180, "the share pod's grant", pod_state)
    admitted: dict[str, Any] = json.loads(c.kubectl("-n", TENANT, "get", "pod", "share", "-o", "json").stdout)
    assert admitted["spec"]["schedulerName"] == "gpupool-scheduler"  # written by the webhook pod
    node = admitted["spec"]["nodeName"]
    assert node in {n.name for n in c.nodes.nodes}
    assert (env["GPUPOOL_MEMORY_LIMIT_MIB"], env["GPUPOOL_CORES_PERCENT"]) == ("4096", "20")
    # The GPU is one of the node's own (the chart's one ConfigMap, {node} in the UUIDs).
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith(f"GPU-{node}-"), env["NVIDIA_VISIBLE_DEVICES"]

    # Every program of the release runs in one of its pods: none on the host outside a pod's cgroup.
    pods = {p["metadata"]["uid"].replace("-", "_"): p["metadata"]["name"] for p in rel.pods()}
    pods.update({uid.replace("_", "-"): name for uid, name in pods.items()})
    procs = rel.processes()
    outside = [p for p in procs if p.pod_uid not in pods]
    assert not outside, f"release programs outside its pods: {outside}"
    roles = Counter(p.role for p in procs)
    assert roles["agent"] >= 2 and roles["webhook"] >= 2 and roles["scheduler"] >= 1 \
        and roles["kube-scheduler"] >= 1, roles
    agents = {pods[p.pod_uid] for p in procs if p.role == "agent"}
    assert len(agents) == 2, agents  # one pod per node

    deleted = c.kubectl("-n", TENANT, "delete", "pod", "share", "--grace-period=1", "--wait=true")
    assert deleted.returncode == 0, deleted.stderr

    # Fails closed: with the webhook's pods gone (no endpoint behind its Service) a GPU pod is refused ...
    webhook = f"deployment/{rel.fullname}-webhook"
    assert c.kubectl("-n", NAMESPACE, "scale", webhook, "--replicas=0").returncode == 0
    wait_for(lambda: "service webhook: no ready endpoint" in rel.not_ready(), 120, "the webhook without endpoints",
             rel.describe_pods)
    out = c.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(gpu_pod("while-down")))
    assert out.returncode != 0 and "gpupool" in out.stderr, out.stderr
    # ... and admitted again once they serve.
    assert c.kubectl("-n", NAMESPACE, "scale", webhook, "--replicas=2").returncode == 0
    rel.wait_ready(timeout_s=300)
    out = c.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(gpu_pod("while-up")))
    assert out.returncode == 0, out.stderr

    # A tenant that runs through the upgrade and the rollback keeps its share: the same container, the same
    # limits file (byte for byte), the same grant.
    keeper = release.example_pod("keeper", TENANT, memory_mib=2048, cores=10)
    created = c.kubectl("create", "-f", "-", stdin=json.dumps(keeper))
    assert created.returncode == 0, created.stderr

    def keeper_state() -> tuple[str, str, int, str]:
        got = json.loads(c.kubectl("-n", TENANT, "get", "pod", "keeper", "-o", "json").stdout)
        status = (got.get("status") or {}).get("containerStatuses") or [{}]
        digest = c.kubectl("-n", TENANT, "exec", "keeper", "--", "md5sum", "/run/gpupool/limits/limits.v1")
        grant = c.kubectl("-n", TENANT, "exec", "keeper", "--", "/gpupool/grant")
        return (got["metadata"]["uid"], (got.get("status") or {}).get("phase", ""),
                int(status[0].get("restartCount", -1)),
                (digest.stdout.split(" ")[0] or digest.stderr.strip()) + "\n" + grant.stdout)

    def keeper_granted() -> tuple[str, str, int, str] | None:
        state = keeper_state()
        return state if state[1] == "Running" and "GPUPOOL_MEMORY_LIMIT_MIB=2048" in state[3] else None

    first = wait_for(keeper_granted, 180, "the keeper's grant", pod_state)
    assert first[2] == 0 and len(first[3].split("\n")[0]) == 32, first  # an md5 of the limits file

    def agent_pods() -> set[str]:
        return {p["metadata"]["name"] for p in rel.pods()
                if p["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"}

    def images() -> set[str]:
        """The gpupool images the release's pods run (kube-scheduler's aside)."""
        return {ctr["image"] for p in rel.pods() for ctr in p["spec"]["containers"]
                if ctr["image"].startswith(release.GPUPOOL_REPOSITORY + ":")}

    # helm upgrade to a new image tag and a changed value: the DaemonSet and the Deployments roll their pods
    # onto the new image, and the new agent pods advertise the new split.
    before, old_image = set(agents), rel.image
    assert images() == {old_image}
    new_image = rel.retag("e2e-upgrade")
    rel.upgrade("--set", "splitCount=5", "--set", f"image.tag={new_image.rsplit(':', 1)[1]}")
    wait_for(lambda: all(release.gpu_slots(c.bed, n.name) == GPUS * 5 for n in c.nodes.nodes) and not rel.not_ready()
             and images() == {new_image}, 300, "both nodes at 5 slots per GPU on the new image, the release Ready",
             rel.describe_pods)
    rolled = agent_pods()
    assert len(rolled) == 2 and not rolled & before, (before, rolled)
    assert keeper_state() == first

    # helm rollback: the previous revision's values and image again (10 slots per GPU), rolled once more.
    back = rel.helm("rollback", rel.name, "-n", rel.namespace, "--wait", "--timeout", "5m")
    assert back.returncode == 0, back.stderr
    wait_for(lambda: all(release.gpu_slots(c.bed, n.name) == GPUS * SPLIT for n in c.nodes.nodes)
             and not rel.not_ready() and images() == {old_image}, 300,
             "both nodes back at 10 slots per GPU on the previous image, the release Ready", rel.describe_pods)
    history = json.loads(rel.helm("history", rel.name, "-n", rel.namespace, "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2, 3] and history[-1]["status"] == "deployed", history
    again = agent_pods()
    assert len(again) == 2 and not again & rolled, (rolled, again)
    assert keeper_state() == first

    rel.uninstall()
    assert c.left() == []
    assert rel.processes() == []
    # No configuration of the release left behind: GPU pods are admitted (by nobody) again.
    out = c.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(gpu_pod("after-uninstall")))
    assert out.returncode == 0, out.stderr


def test_a_release_program_outside_a_pod_is_found(tmp_path: Path) -> None:
    """The check above can fail: a program of the release run on the host (as a stand-in would run it) is
    found, with no pod; the same command line without the release's environment (another release's) is not."""
    nodes = realnode.RealNodes(None, 0)  # type: ignore[arg-type]  # no cluster: only the nodes' cgroup roots
    nodes.root = tmp_path
    nodes.nodes = [realnode.RealNode(None, "127.9.0.1", tmp_path / "n0", "/gpupool-none-n0")]  # type: ignore[arg-type]
    rel = release.ChartRelease(None, RELEASE, NAMESPACE, nodes)  # type: ignore[arg-type]
    argv = ["sh", "-c", "sleep 600; true", "gpupool", "agent"]  # `gpupool agent` in its command line
    ours = subprocess.Popen(argv, env={"GPUPOOL_AGENT_HOOK_ROOT": str(tmp_path / "node-local" / "hook"),
                                       "PATH": "/usr/bin:/bin"})
    other = subprocess.Popen(argv, env={"GPUPOOL_AGENT_HOOK_ROOT": "/run/gpupool/hook", "PATH": "/usr/bin:/bin"})
    try:
        found = {p.pid: p for p in rel.processes()}
        assert ours.pid in found and found[ours.pid].role == "agent" and found[ours.pid].pod_uid == "", found
        assert other.pid not in found
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
