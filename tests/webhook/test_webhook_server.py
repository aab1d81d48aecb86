"""Serving concerns: certificate renewal without a restart, and the `gpupool webhook` command's checks."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
from pathlib import Path

from click.testing import CliRunner
from cryptography import x509

from gpupool.commands.webhook import webhook
from gpupool.webhook.inventory import InventoryView
from tests.webhook.helpers import TLSFiles, make_tls, start_webhook


async def served_certificate(port: int, ca: Path) -> x509.Certificate:
    context = ssl.create_default_context(cafile=str(ca))
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der)


async def test_renewed_certificate_is_served_without_restart(tmp_path: Path) -> None:
    first = make_tls(tmp_path / "first", common_name="first")
    live = TLSFiles(first.ca, tmp_path / "tls.crt", tmp_path / "tls.key")
    shutil.copy(first.cert, live.cert)
    shutil.copy(first.key, live.key)
    server, task, port = await start_webhook(live, InventoryView())
    try:
        assert (await served_certificate(port, first.ca)).subject.rfc4514_string() == "CN=first"
        second = make_tls(tmp_path / "second", common_name="second")
        # cert-manager replaces the files; bump mtimes explicitly so a coarse filesystem clock still differs
        shutil.copy(second.key, live.key)
        shutil.copy(second.cert, live.cert)
        later = os.stat(live.cert).st_mtime + 5
        os.utime(live.cert, (later, later))
        os.utime(live.key, (later, later))
        for _ in range(500):  # the test server checks every 0.05 s; the bound only prevents a hang
            cert = await served_certificate(port, second.ca) if await _trusts(port, second.ca) else None
            if cert is not None:
                break
            await asyncio.sleep(0.02)
        assert cert is not None and cert.subject.rfc4514_string() == "CN=second"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


async def _trusts(port: int, ca: Path) -> bool:
    try:
        await served_certificate(port, ca)
        return True
    except ssl.SSLError:
        return False


def test_command_refuses_to_serve_without_tls(tmp_path: Path) -> None:
    result = CliRunner().invoke(webhook, ["--no-watch-inventory"], env={})
    assert result.exit_code == 2
    assert "serves HTTPS only: give --cert-file and --key-file" in result.output
    missing = CliRunner().invoke(
        webhook, ["--cert-file", str(tmp_path / "nope.crt"), "--key-file", str(tmp_path / "nope.key")]
    )
    assert missing.exit_code == 2 and "nope.crt does not exist" in missing.output


def test_command_reports_bad_settings() -> None:
    result = CliRunner().invoke(webhook, ["--default-isolation", "vfio"], env={"GPUPOOL_WEBHOOK_PORT": "0"})
    assert result.exit_code == 2
    assert "default_isolation" in result.output and "port" in result.output


def test_gpupool_webhook_command_serves_over_tls(tmp_path: Path) -> None:
    """The real command in its own process: config from flags and environment, TLS, one admission."""
    import base64
    import json
    import socket
    import subprocess
    import sys
    import time

    import httpx

    from tests.webhook.helpers import pod, review

    tls = make_tls(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GPUPOOL_WEBHOOK_SCHEDULER_NAME": "from-env"}
    args = ["webhook", "--host", "127.0.0.1", "--port", str(port), "--cert-file", str(tls.cert)]
    args += ["--key-file", str(tls.key), "--no-watch-inventory", "--log-level", "warning"]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gpupool.cli import main; main()", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        context = ssl.create_default_context(cafile=str(tls.ca))
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=context, timeout=10) as client:
            for _ in range(300):  # start-up can be slow on a loaded machine; the bound only avoids a hang
                if proc.poll() is not None:
                    raise AssertionError(f"webhook exited: {proc.stdout.read() if proc.stdout else ''}")
                try:
                    client.get("/healthz")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            r = client.post("/mutate", json=review(pod({"gpupool.io/gpu": "1"})))
            ops = json.loads(base64.b64decode(r.json()["response"]["patch"]))
            assert {"op": "replace", "path": "/spec/schedulerName", "value": "from-env"} in ops
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "gpupool webhook starting:" in out and "scheduler_name=from-env" in out
