"""Issue 26 on the real API server: envFrom without a safe prefix refused in every pod by the chart's webhook
entries (as kubectl users meet it), slow clients against the `gpupool webhook` process while the API server keeps being
answered, and pods that are filtered but never bound not starving a real pod at the real extender.

The webhook fixtures are test_e2e_webhook's (a `gpupool webhook` process, the chart's configurations
registered for it); the extender is the session's `gpupool scheduler` process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.conftest import Extender
from tests.e2e.test_e2e_webhook import kubectl, manifest, registered, webhook_process  # noqa: F401 (fixtures)
from tests.harness import fleet
from tests.harness import testbed as tb

pytestmark = pytest.mark.e2e
NS = "e2e-hardening"
NOWHERE = {"e2e/group": "nowhere"}  # kube-scheduler finds no node for these pods: only our /filter calls
NODE = "e2e-hardening-node"


def with_env_from(text: str, *sources: dict[str, Any]) -> str:
    pod = yaml.safe_load(text)
    pod["spec"]["containers"][0]["envFrom"] = list(sources)
    return yaml.safe_dump(pod)


# --- envFrom ------------------------------------------------------------------------------------------------


async def test_env_from_without_a_safe_prefix_is_refused(registered: object, kubectl) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    gpu = {"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "20"}
    out = kubectl("create", "-f", "-", stdin=with_env_from(manifest("envfrom-bare", limits=gpu),
                                                           {"configMapRef": {"name": "settings"}}))
    assert out.returncode != 0
    assert "envFrom without a safe prefix is not allowed" in out.stderr
    out = kubectl("create", "-f", "-", stdin=with_env_from(manifest("envfrom-nvidia", limits=gpu),
                                                           {"prefix": "NVIDIA_", "secretRef": {"name": "s"}}))
    assert out.returncode != 0 and "envFrom without a safe prefix" in out.stderr
    out = kubectl("create", "-f", "-", stdin=with_env_from(manifest("envfrom-app", limits=gpu),
                                                           {"prefix": "APP_", "configMapRef": {"name": "settings"}}))
    assert out.returncode == 0, out.stderr
    # Not a GPU pod: refused all the same (prefix NVIDIA_ with a key VISIBLE_DEVICES=all would reach every GPU
    # of a node whose toolkit accepts the variable), and admitted with a safe prefix.
    out = kubectl("create", "-f", "-", stdin=with_env_from(manifest("envfrom-cpu"),
                                                           {"prefix": "NVIDIA_", "configMapRef": {"name": "settings"}}))
    assert out.returncode != 0 and "envFrom without a safe prefix" in out.stderr
    out = kubectl("create", "-f", "-", stdin=with_env_from(manifest("envfrom-cpu-app"),
                                                           {"prefix": "APP_", "configMapRef": {"name": "settings"}}))
    assert out.returncode == 0, out.stderr


# --- slow clients ---------------------------------------------------------------------------------------------


async def test_idle_connections_to_the_webhook_are_closed_while_the_api_server_is_served(  # type: ignore[no-untyped-def]
        registered: object, webhook_process: dict[str, Any], kubectl) -> None:  # noqa: F811
    port = int(webhook_process["url"].rsplit(":", 1)[1])
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(100)]  # no TLS handshake, nothing
    out = kubectl("create", "-f", "-", stdin=manifest("served-meanwhile", limits={"gpupool.io/gpu": "1"}))
    assert out.returncode == 0, out.stderr  # the API server's own calls are answered meanwhile

    async def closed(reader: asyncio.StreamReader) -> bytes:
        try:
            return await asyncio.wait_for(reader.read(), 60)  # the server's header deadline is 10 s
        except ConnectionResetError:
            return b""

    assert await asyncio.gather(*(closed(r) for r, _ in conns)) == [b""] * 100
    for _, w in conns:
        w.close()


# --- reservations -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hardening_node(testbed: tb.Testbed) -> Iterator[str]:
    """One 8-GPU node with a NoSchedule taint (kube-scheduler keeps other tests' pods off it; the extender's
    /filter, called directly here, does not read taints)."""
    node = fleet.gpu_node(NODE, gpus=8, model="A100-80GB", memory_mib=81920, labels={"e2e/group": "hardening"})
    node["spec"] = {"taints": [{"key": "e2e/hardening", "effect": "NoSchedule"}]}
    testbed.ensure("/api/v1/nodes", node)
    testbed.tenant_namespace(NS)
    yield NODE
    testbed.admin_request("DELETE", f"/api/v1/nodes/{NODE}")


def create_pod(testbed: tb.Testbed, name: str) -> dict[str, Any]:
    pod = fleet.plain_pod(name, NS, scheduler="gpupool-scheduler", node_selector=NOWHERE,
                          limits={"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "100"})
    return testbed.ensure(f"/api/v1/namespaces/{NS}/pods", pod)


def test_pods_filtered_but_never_bound_do_not_starve_a_real_pod(
        testbed: tb.Testbed, extender: Extender, hardening_node: str) -> None:
    """Issue 26's scenario: 8 whole-GPU pods re-sent to /filter every 8 s, never bound, kept the 8-GPU node
    reserved and a real pod was refused 24 of 24 times over 45 s. Under the reservation rule
    (docs/scheduler.md, "Reservations") they hold the node 10 s at most."""
    idle = [create_pod(testbed, f"idle-{i}") for i in range(8)]
    real = create_pod(testbed, "real")
    nodes = [hardening_node]
    with httpx.Client(base_url=extender.url, timeout=30) as http:
        def filtered(pod: dict[str, Any]) -> bool:
            answer = http.post("/filter", json={"Pod": pod, "NodeNames": nodes}).json()
            assert not answer.get("Error"), answer
            return answer["NodeNames"] == nodes

        for _ in range(100):  # the extender's watch must have seen the pods and the node first
            if all(filtered(p) for p in idle):
                break
            time.sleep(0.2)
        start = last = time.monotonic()
        assert not filtered(real), "the idle pods' reservations did not hold the node at first"
        admitted_after = None
        while time.monotonic() - start < 45:  # the issue's 45 s
            if time.monotonic() - last >= 8:
                last = time.monotonic()
                for pod in idle:
                    filtered(pod)
            if filtered(real):
                admitted_after = time.monotonic() - start
                break
            time.sleep(2)
    assert admitted_after is not None, "the real pod was refused for 45 s while nothing was bound"

