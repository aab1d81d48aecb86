"""The chart's extender transport: loopback without credentials by default; beyond loopback, mutual TLS
whose certificates (made by Helm here) really let kube-scheduler's client pair through a real extender
server and keep everyone else out."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpupool.scheduler.auth import server_security
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.server import serve_in_background
from tests.deploy.conftest import Render

PUBLIC = {"scheduler": {"extender": {"host": "0.0.0.0"}}, "webhook": {"certs": {"mode": "helm"}}}


def _one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def _containers(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = _one(objs, "Deployment", "gp-gpupool-scheduler")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def _extender_entry(objs: list[dict[str, Any]]) -> dict[str, Any]:
    config = yaml.safe_load(_one(objs, "ConfigMap", "gp-gpupool-scheduler")["data"]["scheduler-config.yaml"])
    entry: dict[str, Any] = config["extenders"][0]
    return entry


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def _mounted(container: dict[str, Any], file: str, volumes: dict[str, Any]) -> str:
    """The secret a file path of `container` comes from (the deepest mount holding it, as in a container)."""
    holding = [m for m in container["volumeMounts"] if file.startswith(m["mountPath"] + "/")]
    assert holding, f"{file} is on no volume of {container['name']}"
    mount = max(holding, key=lambda m: len(m["mountPath"]))
    return str(volumes[mount["name"]]["secret"]["secretName"])


def test_default_is_loopback_without_credentials(render: Render) -> None:
    objs = render()
    env = _env(_containers(objs)["extender"])
    assert env["GPUPOOL_SCHEDULER_HOST"] == "127.0.0.1" and "GPUPOOL_SCHEDULER_AUTH" not in env
    entry = _extender_entry(objs)
    assert entry["urlPrefix"] == "http://127.0.0.1:8888" and entry["enableHTTPS"] is False
    assert not [o for o in objs if o["kind"] == "Secret" and "extender" in o["metadata"]["name"]]
    policy = _one(objs, "NetworkPolicy", "gp-gpupool-scheduler")
    assert policy["spec"]["ingress"] == []


def test_beyond_loopback_the_pieces_fit_together(render: Render) -> None:
    objs = render(PUBLIC)
    containers = _containers(objs)
    volumes = {v["name"]: v for v in
               _one(objs, "Deployment", "gp-gpupool-scheduler")["spec"]["template"]["spec"]["volumes"]}
    env = _env(containers["extender"])
    assert env["GPUPOOL_SCHEDULER_HOST"] == "0.0.0.0" and env["GPUPOOL_SCHEDULER_AUTH"] == "tls"
    for key in ("GPUPOOL_SCHEDULER_TLS_CERT_FILE", "GPUPOOL_SCHEDULER_TLS_KEY_FILE",
                "GPUPOOL_SCHEDULER_TLS_CLIENT_CA_FILE"):
        assert _mounted(containers["extender"], env[key], volumes) == "gp-gpupool-extender-tls"
    entry = _extender_entry(objs)
    assert entry["urlPrefix"] == "https://127.0.0.1:8888" and entry["enableHTTPS"] is True
    for key in ("certFile", "keyFile", "caFile"):
        assert _mounted(containers["kube-scheduler"], entry["tlsConfig"][key], volumes) == \
            "gp-gpupool-extender-client-tls"
    probe = " ".join(containers["extender"]["readinessProbe"]["exec"]["command"])
    assert "https://127.0.0.1:8888/readyz" in probe and "load_cert_chain" in probe
    policy = _one(objs, "NetworkPolicy", "gp-gpupool-scheduler")
    assert policy["spec"]["ingress"] == [{"ports": [{"port": 8888, "protocol": "TCP"}]}]


def test_cert_manager_issues_a_server_and_a_client_certificate(render: Render) -> None:
    objs = render({**PUBLIC, "webhook": {"certs": {"mode": "certManager"}}})
    server = _one(objs, "Certificate", "gp-gpupool-extender")["spec"]
    client = _one(objs, "Certificate", "gp-gpupool-extender-client")["spec"]
    assert (server["secretName"], server["ipAddresses"], server["usages"]) == (
        "gp-gpupool-extender-tls", ["127.0.0.1"], ["server auth"])
    assert (client["secretName"], client["usages"]) == ("gp-gpupool-extender-client-tls", ["client auth"])
    assert server["issuerRef"] == client["issuerRef"] == {"name": "gp-gpupool-extender-ca", "kind": "Issuer"}


@pytest.fixture
def helm_certs(render: Render, tmp_path: Path) -> dict[str, Path]:
    objs = render(PUBLIC)
    out = {}
    for secret, prefix in (("gp-gpupool-extender-tls", "server"), ("gp-gpupool-extender-client-tls", "client")):
        for key, data in _one(objs, "Secret", secret)["data"].items():
            path = tmp_path / f"{prefix}-{key}"
            path.write_bytes(base64.b64decode(data))
            out[f"{prefix}-{key}"] = path
    return out


async def test_helm_certificates_let_kube_scheduler_in_and_nobody_else(helm_certs: dict[str, Path]) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    config = SchedulerConfig(auth="tls", tls_cert_file=str(helm_certs["server-tls.crt"]),
                             tls_key_file=str(helm_certs["server-tls.key"]),
                             tls_client_ca_file=str(helm_certs["server-ca.crt"]))
    handle = await serve_in_background(Starlette(routes=[Route("/bind", ok, methods=["POST"])]), "127.0.0.1", 0,
                                       security=server_security(config))
    try:
        # kube-scheduler verifies the extender's certificate for 127.0.0.1 against the CA of its own secret.
        trust = ssl.create_default_context(cafile=str(helm_certs["client-ca.crt"]))
        as_kube_scheduler = ssl.create_default_context(cafile=str(helm_certs["client-ca.crt"]))
        as_kube_scheduler.load_cert_chain(str(helm_certs["client-tls.crt"]), str(helm_certs["client-tls.key"]))
        async with httpx.AsyncClient(verify=as_kube_scheduler) as client:
            assert (await client.post(handle.url + "/bind")).text == "ok"
        async with httpx.AsyncClient(verify=trust) as client:
            with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
                await client.post(handle.url + "/bind")
    finally:
        await handle.stop()
