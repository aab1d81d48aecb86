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
