"""Run the webhook over TLS with uvicorn, following certificate renewals without a restart.

cert-manager (or a re-run of the chart) rewrites the mounted certificate files; the server checks their
modification time every `cert_reload_s` and loads the new pair into the live SSL context, so new
connections get the new certificate and no admission request is refused during the rotation.

The HTTP protocol is the caller's (`http`): the entry layer passes one that makes the TLS handshake itself
and bounds what each caller may hold (header and body deadlines, connections per peer and in total;
gpupool.commands.webhook), so uvicorn is given no certificate of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp

log = logging.getLogger("gpupool.webhook.server")


class CertReloader:
    def __init__(self, context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
        self.context = context
        self.cert_file = cert_file
        self.key_file = key_file
        self._stamp = self._mtimes()

    def _mtimes(self) -> tuple[float, float]:
        return (self.cert_file.stat().st_mtime, self.key_file.stat().st_mtime)

    def check(self) -> bool:
        """Reload when either file changed; True when a new pair is in use. A half-written pair (cert
        and key that do not match yet) is skipped and retried next time."""
        try:
            stamp = self._mtimes()
        except OSError as e:
            log.warning("certificate files unreadable: %s", e)
            return False
        if stamp == self._stamp:
            return False
        try:
            self.context.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (ssl.SSLError, OSError) as e:
            log.warning("new certificate not loaded yet (%s); will retry", e)
            return False
        self._stamp = stamp
        log.info("serving certificate reloaded from %s", self.cert_file)
        return True

    async def run(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.check()


def tls_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """The serving context (TLS 1.2 at least), loaded from the mounted pair; the reloader updates it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert_file), str(key_file))
    return context


def build_server(app: ASGIApp | Starlette, host: str, port: int, log_level: str, http: type[asyncio.Protocol],
                 keep_alive_s: int) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,  # one line per pod admission would drown the denials that matter
        lifespan="off",  # the app has no start-up or shutdown hooks (and "auto" logs a cancelled wait at exit)
        timeout_keep_alive=keep_alive_s,  # the API server reuses connections
        http=http,  # (it caps connections; uvicorn runs one request per connection at a time)
    )
    return uvicorn.Server(config)


async def serve(server: uvicorn.Server, reload_every_s: float, background: list[asyncio.Task[None]],
                reloader: CertReloader | None = None) -> None:
    """Serve until stopped; `background` tasks (inventory watch) are cancelled on the way out."""
    tasks = list(background)
    if reloader is not None:
        tasks.append(asyncio.create_task(reloader.run(reload_every_s)))
    try:
        await server.serve()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
