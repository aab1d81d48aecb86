"""The chart's mutual TLS between kube-scheduler and the extender, with the real kube-scheduler 1.20.

The chart is rendered with `scheduler.extender.host: 0.0.0.0` (Helm-made certificates); the extender runs
with the server pair and the client CA exactly as the chart's environment sets them, and a second
kube-scheduler (its own profile, `gpupool-tls`) uses the chart's extender entry with its `tlsConfig`
pointing at the client pair. A pod of that profile is scheduled and bound through the extender over
HTTPS; a caller without the client certificate gets no answer at all.
"""

from __future__ import annotations

import base64
import json
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

from gpupool.api.names import ANN_ALLOCATION
from tests.e2e.conftest import Identities, helm_template
from tests.e2e.e2e_checks import eventually
from tests.harness import fleet
from tests.harness import testbed as tb

pytestmark = pytest.mark.e2e

PROFILE = "gpupool-tls"
NS = "e2e-tls"
GROUP = {"e2e/group": "tls"}
PUBLIC = ("--set", "scheduler.extender.host=0.0.0.0", "--set", "webhook.certs.mode=helm")


def _chart(template: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(helm_template(*PUBLIC, "--show-only", template)) if d]


def _write_secret(doc: dict[str, Any], directory: Path) -> Path:
    directory.mkdir(parents=True)
    for key, data in doc["data"].items():
        (directory / key).write_bytes(base64.b64decode(data))
    return directory


@pytest.fixture(scope="module")
def tls_extender(
    testbed: tb.Testbed, identities: Identities, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    secrets = {d["metadata"]["name"]: d for d in _chart("templates/scheduler/tls.yaml")}
    root = tmp_path_factory.mktemp("extender-tls")
    server = _write_secret(secrets["gp-gpupool-extender-tls"], root / "server")
    client = _write_secret(secrets["gp-gpupool-extender-client-tls"], root / "client")
    # The extender's TLS settings as the chart's Deployment sets them (same variables, files of the secret).
    deployment = next(d for d in _chart("templates/scheduler/deployment.yaml") if d["kind"] == "Deployment")
    extender = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender")
    env = {e["name"]: e["value"] for e in extender["env"] if e["name"].startswith("GPUPOOL_SCHEDULER_TLS_")}
    env = {k: str(server / Path(v).name) for k, v in env.items()}
    assert len(env) == 3, env
    port = tb.free_port()
    log = testbed.dir / "gpupool-scheduler-tls.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*tb.gpupool_argv(), "scheduler", "--kubeconfig", str(identities.scheduler), "--no-leader-elect",
             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
            env={**os.environ, **env, "GPUPOOL_SCHEDULER_AUTH": "tls", "GPUPOOL_SCHEDULER_SCHEDULER_NAME": PROFILE},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=tb.die_with_parent,
        )
    as_kube_scheduler = ssl.create_default_context(cafile=str(client / "ca.crt"))
    as_kube_scheduler.load_cert_chain(str(client / "tls.crt"), str(client / "tls.key"))
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/readyz", verify=as_kube_scheduler, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield {"url": url, "client": client, "ctx": as_kube_scheduler}
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.fixture(scope="module")
def tls_kube_scheduler(
    testbed: tb.Testbed, identities: Identities, tls_extender: dict[str, Any]
) -> Iterator[tb.Process]:
    """A second kube-scheduler with only the `gpupool-tls` profile and the chart's TLS extender entry."""
    configmap = _chart("templates/scheduler/configmap.yaml")[0]
    chart = yaml.safe_load(configmap["data"]["scheduler-config.yaml"])
    entry = chart["extenders"][0]
    assert entry["enableHTTPS"] is True
    client: Path = tls_extender["client"]
    entry["tlsConfig"] = {k: str(client / Path(v).name) for k, v in entry["tlsConfig"].items()}
    chart["profiles"] = [{"schedulerName": PROFILE}]
    config = json.loads(tb.scheduler_config(tls_extender["url"], chart, scheduler_name=PROFILE))
    config["profiles"] = [{"schedulerName": PROFILE}]  # the session's kube-scheduler owns default-scheduler
    proc = testbed.start_scheduler(json.dumps(config), kubeconfig=identities.scheduler, name="kube-scheduler-tls")
    try:
        yield proc
    finally:
        testbed.stop_scheduler("kube-scheduler-tls")


async def test_kube_scheduler_binds_through_the_extender_over_mutual_tls(
    api: fleet.KubeApi, tls_extender: dict[str, Any], tls_kube_scheduler: tb.Process
) -> None:
    await api.ensure_namespace(NS)
    await fleet.create_node(api, fleet.gpu_node("e2e-tls-node", gpus=2, labels=GROUP))
    await api.create_pod(fleet.share_pod("tls-share", NS, scheduler=PROFILE, node_selector=GROUP))

    async def bound() -> bool:
        pod = await api.get(f"/api/v1/namespaces/{NS}/pods/tls-share")
        return bool(pod["spec"].get("nodeName")) and ANN_ALLOCATION in (pod["metadata"].get("annotations") or {})

    await eventually(bound, timeout_s=90, what="the pod bound by kube-scheduler through the TLS extender",
                     describe=lambda: tls_kube_scheduler.tail())
    # The extender itself counted the bind (kube-scheduler's call went to it, not around it).
    async with httpx.AsyncClient(verify=tls_extender["ctx"]) as client:
        metrics = (await client.get(tls_extender["url"] + "/metrics")).text
    assert 'gpupool_binds_total{result="bound"} 1.0' in metrics.splitlines(), metrics[:2000]


async def test_a_caller_without_the_client_certificate_gets_nothing(tls_extender: dict[str, Any]) -> None:
    trust_only = ssl.create_default_context(cafile=str(tls_extender["client"] / "ca.crt"))
    async with httpx.AsyncClient(verify=trust_only) as client:
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            await client.post(tls_extender["url"] + "/bind", content=b"{}")
    async with httpx.AsyncClient() as client:
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            await client.post(tls_extender["url"].replace("https", "http") + "/bind", content=b"{}")
