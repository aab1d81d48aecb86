"""Helpers for the webhook tests: a throwaway CA and serving certificate, GPU nodes with inventory
annotations, and the real webhook served over TLS on 127.0.0.1 with an HTTPS client that trusts the CA."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpupool.api.inventory import encode_inventory
from gpupool.api.names import ANN_INVENTORY
from gpupool.commands.webhook import serving
from gpupool.core.model import GPU
from gpupool.webhook.admission import Settings
from gpupool.webhook.app import create_app
from gpupool.webhook.config import WebhookConfig
from gpupool.webhook.inventory import InventoryView
from gpupool.webhook.server import serve

SCHEDULER_SA = "system:serviceaccount:gpupool:gpupool-scheduler"


@dataclass
class TLSFiles:
    ca: Path
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_tls(directory: Path, common_name: str = "gpupool-webhook") -> TLSFiles:
    """A CA and a leaf for 127.0.0.1/localhost signed by it, valid for one day."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("gpupool-test-ca"))
        .issuer_name(_name("gpupool-test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    files = TLSFiles(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


def gpu_node(name: str, model: str, memory_mib: int, count: int) -> dict[str, Any]:
    gpus = [GPU(uuid=f"GPU-{name}-{i}", index=i, model=model, memory_mib=memory_mib) for i in range(count)]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {ANN_INVENTORY: encode_inventory(name, gpus, split=10)}},
        "status": {"allocatable": {"cpu": "32", "memory": "256Gi"}},
    }


# The test cluster: 2 x A100-40GB (40960 MiB) on node-a, 4 x H100-80GB (81920 MiB) on node-b.
CLUSTER_NODES = [gpu_node("node-a", "A100-40GB", 40960, 2), gpu_node("node-b", "H100-80GB", 81920, 4)]


def pod(
    resources: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    name: str = "train",
    spec: dict[str, Any] | None = None,
    section: str = "limits",
) -> dict[str, Any]:
    """A pod as the API server hands it to admission (defaulted: schedulerName set, requests copied
    from limits for extended resources)."""
    container: dict[str, Any] = {"name": "main", "image": "nvcr.io/nvidia/pytorch:24.01-py3"}
    if resources is not None:
        container["resources"] = {section: dict(resources)}
        if section == "limits":
            container["resources"]["requests"] = dict(resources)
    meta: dict[str, Any] = {"name": name, "namespace": "ml"}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    body: dict[str, Any] = {"containers": [container], "schedulerName": "default-scheduler"}
    body.update(spec or {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def review(
    obj: dict[str, Any] | None,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    user: str = "alice",
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
    sub_resource: str = "",
) -> dict[str, Any]:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": operation,
            "userInfo": {"username": user},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
        },
    }
    if sub_resource:
        body["request"]["subResource"] = sub_resource  # type: ignore[index]
    return body


@dataclass
class Served:
    client: httpx.AsyncClient
    port: int
    inventory: InventoryView


async def start_webhook(
    tls: TLSFiles, inventory: InventoryView, max_body_bytes: int = 256 * 1024, settings: Settings | None = None,
    **transport: Any,
) -> tuple[Any, asyncio.Task[None], int]:
    """The webhook as `gpupool webhook` serves it (gpupool.commands.webhook.serving) on a free port of
    127.0.0.1; `transport` overrides WebhookConfig's timeouts and connection caps."""
    settings = settings or Settings(trusted_users=frozenset({SCHEDULER_SA}))
    app = create_app(settings, inventory, max_body_bytes)
    config = WebhookConfig(host="127.0.0.1", cert_file=tls.cert, key_file=tls.key, log_level="warning",
                           **transport).model_copy(update={"port": 0})  # 0: any free port (tests only)
    server, reloader = serving(app, config)
    task = asyncio.create_task(serve(server, 0.05, [], reloader))
    for _ in range(500):  # generous: only to avoid hanging when start-up fails
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if task.done():
        task.result()
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, port


@asynccontextmanager
async def webhook_client(tls: TLSFiles, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A real webhook server over TLS on the test cluster's nodes, and a client that trusts its CA."""
    inventory = InventoryView()
    inventory.replace(CLUSTER_NODES)
    server, task, port = await start_webhook(tls, inventory, settings=settings)
    context = ssl.create_default_context(cafile=str(tls.ca))
    try:
        async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{port}", verify=context, timeout=30) as c:
            yield c
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
