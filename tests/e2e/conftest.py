"""Fixtures for the end-to-end tests: a real control plane (etcd, kube-apiserver, kube-scheduler 1.20 from
scripts/k8s-testbed), the real `gpupool scheduler` process as kube-scheduler's extender, and REST/lightkube
clients. A missing binary fails the tests with the command that builds it; nothing here skips.

Components run as in a cluster: under the chart's own ServiceAccounts, with the chart's RBAC rendered by
helm and applied to the testbed (`chart_rbac`), each with a service-account token (`identities`).
kube-scheduler and the extender share the scheduler's account, as the two containers of the chart's pod do.
test_e2e_rbac.py compares what each one asked the API server for (its audit log) with those rules.

Every test here is marked `e2e` (run them alone with `pytest -m e2e`).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

from gpupool.cluster.kube import KubeCluster  # noqa: E402
from tests.harness import fleet  # noqa: E402
from tests.harness import testbed as tb  # noqa: E402

RELEASE, NAMESPACE = "gp", "gpupool-system"  # the chart's service-account names follow from these
# The chart's templates that define who the components are and what they may do.
RBAC_TEMPLATES = [f"templates/{c}/{t}.yaml" for c in ("scheduler", "agent", "webhook")
                  for t in ("serviceaccount", "rbac")]
RBAC_PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_e2e_rbac.py reads the audit log of the whole session: it runs after every other test."""
    items.sort(key=lambda item: item.path.name == "test_e2e_rbac.py")


def _binaries_or_build() -> None:
    """Build the binaries when they are missing (once per machine; ~10 min cold on 2 cores), so a clean CI
    machine runs the suite for real; GPUPOOL_K8S_BUILD=0 turns that into an immediate failure instead."""
    try:
        tb.find_binaries()
        return
    except tb.TestbedError as e:
        if os.environ.get("GPUPOOL_K8S_BUILD", "1") == "0":
            pytest.fail(str(e), pytrace=False)
    log = tb.cache_dir() / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        # A build already running elsewhere (another pytest session) is not waited for: this run fails.
        env = {**os.environ, "GPUPOOL_K8S_NOWAIT": "1"}
        build = ROOT / "scripts" / "k8s" / "build.sh"
        done = subprocess.run(["bash", str(build)], stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        pytest.fail(f"building the Kubernetes test binaries failed (log {log}):\n{tail}", pytrace=False)


@pytest.fixture(scope="session")
def testbed() -> Iterator[tb.Testbed]:
    _binaries_or_build()
    try:
        # GPUPOOL_E2E_KEEP=1 keeps the state directory (component logs) for a post-mortem.
        bed = tb.Testbed(keep=os.environ.get("GPUPOOL_E2E_KEEP") == "1").start()
    except tb.TestbedError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture
async def api(testbed: tb.Testbed) -> AsyncIterator[fleet.KubeApi]:
    client = fleet.KubeApi(testbed.url, testbed.admin_token)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def kube(testbed: tb.Testbed) -> AsyncIterator[KubeCluster]:
    """The project's `kube` adapter on the testbed (administrator's token)."""
    cluster = kube_cluster(testbed.kubeconfig())
    try:
        yield cluster
    finally:
        await cluster.close()


def kube_cluster(kubeconfig: Path) -> KubeCluster:
    return KubeCluster.from_config(str(kubeconfig))


def helm_template(*args: str) -> str:
    """`helm template gp <chart> --namespace gpupool-system ARGS` with the helm built from its Go module
    (scripts/k8s/build.sh)."""
    from tests.deploy.helm_tool import helm_binary

    helm = helm_binary(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpupool-helm")
    out = subprocess.run(
        [str(helm), "template", RELEASE, str(ROOT / "deploy" / "helm" / "gpupool"), "--namespace", NAMESPACE,
         *args], capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="session")
def chart_rbac(testbed: tb.Testbed) -> list[dict[str, Any]]:
    """The chart's ServiceAccounts, ClusterRoles, Roles and their bindings, applied to the testbed."""
    rendered = helm_template(*(a for t in RBAC_TEMPLATES for a in ("--show-only", t)))
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    testbed.ensure("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    # The chart's CRDs (helm installs crds/ before everything else), so the scheduler watches queues from
    # its start.
    for crd in sorted((ROOT / "deploy" / "helm" / "gpupool" / "crds").glob("*.yaml")):
        testbed.ensure("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load(crd.read_text()))
    for doc in docs:
        path = RBAC_PATHS[doc["kind"]].format(ns=doc["metadata"].get("namespace", NAMESPACE))
        testbed.ensure(path, doc)
    return docs


@dataclass(frozen=True)
class Identities:
    """A kubeconfig per component, each a token of the chart's ServiceAccount for it."""

    scheduler: Path  # kube-scheduler and the gpupool extender (one pod, one account)
    agent: Path
    webhook: Path


@pytest.fixture(scope="session")
def identities(testbed: tb.Testbed, chart_rbac: list[dict[str, Any]]) -> Identities:
    accounts = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d["metadata"]["name"]
                for d in chart_rbac if d["kind"] == "ServiceAccount"}
    return Identities(**{c: testbed.service_account_kubeconfig(NAMESPACE, name) for c, name in accounts.items()})


# --- the gpupool scheduler (extender) as a real process --------------------------------------------------

@dataclass
class Extender:
    """`gpupool scheduler` running against the testbed, on a fixed port (kube-scheduler's config names it)."""

    testbed: tb.Testbed
    port: int
    log: Path
    kubeconfig: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # settings beyond the chart's defaults (GPUPOOL_SCHEDULER_*)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, **self.env}
        env["GPUPOOL_SCHEDULER_IDENTITY"] = f"e2e-extender-{self.starts}"
        self.starts += 1
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*tb.gpupool_argv(), "scheduler",
                 # As the chart runs it: the scheduler's account, no election of its own (only the
                 # kube-scheduler holding its lock calls it).
                 "--kubeconfig", str(self.kubeconfig), "--no-leader-elect",
                 "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=tb.die_with_parent,
            )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"gpupool scheduler exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"gpupool scheduler not ready after {timeout_s}s:\n{self.tail()}")

    def kill(self) -> None:
        tb.kill_process(self.proc)

    def stop(self) -> None:
        tb.stop_process(self.proc, 15)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def ledger(self) -> dict[str, Any]:
        r = httpx.get(self.url + "/debug/ledger", timeout=30)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def extender(testbed: tb.Testbed, identities: Identities) -> Iterator[Extender]:
    ext = Extender(testbed, tb.free_port(), testbed.dir / "gpupool-scheduler.log", identities.scheduler)
    ext.start()
    try:
        ext.wait_ready()
        yield ext
    finally:
        ext.stop()


def chart_scheduler_config() -> dict[str, Any]:
    """The kube-scheduler configuration the Helm chart ships (rendered by helm)."""
    configmap = yaml.safe_load(helm_template("--show-only", "templates/scheduler/configmap.yaml"))
    return yaml.safe_load(configmap["data"]["scheduler-config.yaml"])  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def kube_scheduler(testbed: tb.Testbed, extender: Extender, identities: Identities) -> Iterator[tb.Process]:
    """kube-scheduler 1.20 with the chart's extender entry pointing at the extender process, under the
    scheduler's account and with the chart's leader election (its Lease is one of the chart's rules)."""
    config = tb.scheduler_config(extender.url, chart_scheduler_config(), leader_election=True)
    # GPUPOOL_E2E_SCHED_V=5 shows kube-scheduler's queueing decisions (why a pod waits) in its log.
    verbosity = int(os.environ.get("GPUPOOL_E2E_SCHED_V", "2"))
    proc = testbed.start_scheduler(config, kubeconfig=identities.scheduler, verbosity=verbosity)
    try:
        yield proc
    finally:
        testbed.stop_scheduler()
