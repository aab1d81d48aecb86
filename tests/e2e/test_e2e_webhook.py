"""The admission webhook registered with the real API server, with the Helm chart's webhook
configurations (rules, failure policy, namespace selector) pointed at a `gpupool webhook` process over TLS
(caBundle = the test CA). Pods are created with kubectl, as a user would."""

from __future__ import annotations

import base64
import copy
import os
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.conftest import ROOT, Identities
from tests.e2e.kubectl_tool import kubectl_binary
from tests.harness import fleet
from tests.harness import testbed as tb
from tests.webhook.helpers import make_tls

pytestmark = pytest.mark.e2e
NS = "e2e-webhook"
NEVER = {"e2e/group": "nowhere"}  # no node has it: these pods are admitted, never scheduled
CONFIGS = {
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}


@pytest.fixture(scope="module")
def webhook_process(
    testbed: tb.Testbed, identities: Identities, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    # One GPU node the webhook's inventory watch will see (never used for scheduling: no pod selects it).
    node = fleet.gpu_node("e2e-webhook-node", gpus=2, model="A100-80GB", memory_mib=81920,
                          labels={"e2e/group": "webhook"})
    with httpx.Client(base_url=testbed.url, verify=False, timeout=30,
                      headers={"Authorization": f"Bearer {testbed.admin_token}"}) as http:
        r = http.post("/api/v1/nodes", json=node)
        assert r.status_code in (201, 409), r.text
    tls = make_tls(tmp_path_factory.mktemp("webhook-tls"))
    port = tb.free_port()
    log = testbed.dir / "gpupool-webhook.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*tb.gpupool_argv(), "webhook",
             "--host", "127.0.0.1", "--port", str(port), "--cert-file", str(tls.cert), "--key-file", str(tls.key),
             # Reads the nodes' GPU inventories from the testbed (refuses shares larger than any GPU),
             # under the chart's webhook account and rules.
             "--kubeconfig", str(identities.webhook),
             "--trusted-user", tb.SCHEDULER_USER, "--trusted-user", tb.AGENT_USER],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=tb.die_with_parent,
        )
    try:
        deadline = time.monotonic() + 60
        trust = ssl.create_default_context(cafile=str(tls.ca))
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"https://127.0.0.1:{port}/healthz", verify=trust, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield {"url": f"https://127.0.0.1:{port}", "ca": tls.ca.read_bytes()}
    finally:
        proc.terminate()
        proc.wait(15)


def chart_webhook_configs(url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The chart's two webhook configurations, with the Service reference replaced by our URL and CA; their
    matchConditions are the chart's, evaluated by the API server."""
    from tests.deploy.helm_tool import helm_binary

    helm = helm_binary(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpupool-helm")
    out = subprocess.run(
        [str(helm), "template", "gp", str(ROOT / "deploy" / "helm" / "gpupool"), "--namespace", "gpupool-system",
         "--show-only", "templates/webhook/admission.yaml", "--set", "webhook.certs.mode=helm"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] in CONFIGS]
    assert len(docs) == 2
    result = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = f"e2e-{doc['metadata']['name']}"
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url + path, "caBundle": base64.b64encode(ca_pem).decode()}
        result.append(doc)
    return result


@pytest.fixture(scope="module")
def registered(webhook_process: dict[str, Any], testbed: tb.Testbed) -> Iterator[list[dict[str, Any]]]:
    configs = chart_webhook_configs(webhook_process["url"], webhook_process["ca"])
    with httpx.Client(base_url=testbed.url, verify=False, timeout=30,
                      headers={"Authorization": f"Bearer {testbed.admin_token}"}) as http:
        testbed.tenant_namespace(NS)
        testbed.ensure("/api/v1/namespaces", {"metadata": {"name": "gpupool-system"}})
        try:
            for c in configs:
                r = http.post(CONFIGS[c["kind"]], json=c)
                assert r.status_code == 201, r.text
            # The API server picks new configurations up from its informer: wait until a dry run is refused.
            probe = yaml.safe_load(manifest("probe", limits={"gpupool.io/gpu": "1"},
                                            annotations={"gpupool.io/policy": "no-such-policy"}))
            deadline = time.monotonic() + 30
            while http.post(f"/api/v1/namespaces/{NS}/pods?dryRun=All", json=probe).status_code < 400:
                assert time.monotonic() < deadline, "webhook configurations not in effect after 30 s"
                time.sleep(0.2)
            yield configs
        finally:
            for c in configs:
                http.delete(f"{CONFIGS[c['kind']]}/{c['metadata']['name']}")


@pytest.fixture(scope="module")
def kubectl(testbed: tb.Testbed, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    binary = kubectl_binary()

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(binary), "--kubeconfig", str(testbed.kubeconfig()), *args], input=stdin,
                              capture_output=True, text=True, timeout=60, check=False)

    return run


def manifest(name: str, namespace: str = NS, limits: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, privileged: bool = False) -> str:
    pod = fleet.plain_pod(name, namespace, scheduler="default-scheduler", annotations=annotations,
                          node_selector=NEVER, limits=limits)
    del pod["spec"]["schedulerName"]  # as users write it: the API server defaults it
    if privileged:
        pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return yaml.safe_dump(pod)


def applied(kubectl, name: str, namespace: str = NS) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    out = kubectl("get", "pod", name, "-n", namespace, "-o", "yaml")
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)  # type: ignore[no-any-return]


async def test_bad_gpu_pod_is_refused_with_the_webhooks_message(registered: object, kubectl) -> None:  # type: ignore[no-untyped-def]
    out = kubectl("create", "-f", "-", stdin=manifest(
        "bad", limits={"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "30"},
        annotations={"gpupool.io/policy": "fastest-please"}, privileged=True,
    ))
    assert out.returncode != 0
    assert 'admission webhook "mutate.gpupool.io" denied the request' in out.stderr
    assert f"gpupool refused pod {NS}/bad:" in out.stderr
    assert "gpupool.io/policy='fastest-please': unknown policy" in out.stderr
    assert "privileged containers see every GPU of the node" in out.stderr  # every problem, in one message
    assert kubectl("get", "pod", "bad", "-n", NS).returncode != 0  # nothing was stored


async def test_forged_allocation_is_refused(registered: object, kubectl) -> None:  # type: ignore[no-untyped-def]
    out = kubectl("create", "-f", "-", stdin=manifest(
        "forged", limits={"gpupool.io/gpu": "1"}, annotations={"gpupool.io/allocation": "{}"},
    ))
    assert out.returncode != 0
    assert "annotation gpupool.io/allocation is written by gpupool itself" in out.stderr


async def test_good_share_pod_is_mutated_as_documented(registered: object, kubectl) -> None:  # type: ignore[no-untyped-def]
    out = kubectl("create", "-f", "-", stdin=manifest(
        "good", limits={"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "10Gi", "gpupool.io/gpu-cores": "30"},
    ))
    assert out.returncode == 0, out.stderr
    pod = applied(kubectl, "good")
    assert pod["spec"]["schedulerName"] == "gpupool-scheduler"  # routed to the gpupool profile
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["gpupool.io/gpu-memory"] == "10240"  # 10Gi written in MiB
    assert limits["gpupool.io/gpu-cores"] == "30"
    assert pod["metadata"]["annotations"]["gpupool.io/isolation"] == "hook"  # the default isolation


async def test_whole_gpu_pod_gets_explicit_cores(registered: object, kubectl) -> None:  # type: ignore[no-untyped-def]
    out = kubectl("create", "-f", "-", stdin=manifest("whole", limits={"gpupool.io/gpu": "2"}))
    assert out.returncode == 0, out.stderr
    limits = applied(kubectl, "whole")["spec"]["containers"][0]["resources"]["limits"]
    assert limits["gpupool.io/gpu-cores"] == "100"


def mutate_reviews(webhook: dict[str, Any]) -> float:
    """AdmissionReviews the mutating entry has answered so far (the webhook's own /metrics)."""
    text = httpx.get(webhook["url"] + "/metrics", verify=False, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gpupool_webhook_reviews_total{") and 'webhook="mutate"' in line)


async def test_pod_without_gpu_never_reaches_the_mutating_webhook(  # type: ignore[no-untyped-def]
        registered: object, webhook_process: dict[str, Any], kubectl) -> None:
    """The chart's matchConditions, evaluated by the API server, keep pods that ask for no GPU away from the
    mutating entry; a GPU pod reaches it (so the count below can move)."""
    before = mutate_reviews(webhook_process)
    out = kubectl("create", "-f", "-", stdin=manifest("cpu-only"))
    assert out.returncode == 0, out.stderr
    pod = applied(kubectl, "cpu-only")
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert not any(k.startswith("gpupool.io/") for k in pod["metadata"].get("annotations") or {})
    assert mutate_reviews(webhook_process) == before
    out = kubectl("create", "--dry-run=server", "-f", "-", stdin=manifest("gpu-probe", limits={"gpupool.io/gpu": "1"}))
    assert out.returncode == 0, out.stderr
    assert mutate_reviews(webhook_process) == before + 1


async def test_excluded_namespaces_never_reach_the_webhook(registered: object, kubectl) -> None:  # type: ignore[no-untyped-def]
    """The chart's namespaceSelector keeps kube-system and the release namespace out: a pod the webhook
    would refuse is stored there unchanged."""
    for ns in ("kube-system", "gpupool-system"):
        out = kubectl("create", "-f", "-", stdin=manifest(
            "unchecked", namespace=ns, limits={"gpupool.io/gpu": "1"},
            annotations={"gpupool.io/policy": "fastest-please"},
        ))
        assert out.returncode == 0, out.stderr
        pod = applied(kubectl, "unchecked", ns)
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        kubectl("delete", "pod", "unchecked", "-n", ns, "--wait=false")


async def test_share_larger_than_any_gpu_is_refused(registered: object, kubectl, testbed: tb.Testbed) -> None:  # type: ignore[no-untyped-def]
    """The webhook follows the nodes' gpupool.io/inventory through the API server (a watch from its
    kubeconfig) and refuses a share no GPU in the cluster could hold."""
    pod = manifest("huge", limits={"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": "200Gi"})
    deadline = time.monotonic() + 30
    while True:  # the inventory arrives through the webhook's watch: wait until it knows our node
        out = kubectl("create", "--dry-run=server", "-f", "-", stdin=pod)
        if out.returncode != 0 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert out.returncode != 0
    assert "gpupool.io/gpu-memory=204800 MiB is more than any GPU in the cluster has" in out.stderr
