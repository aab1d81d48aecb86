"""Run the webhook over TLS with uvicorn, following certificate renewals without a restart.

cert-manager (or a re-run of the chart) rewrites the mounted certificate files; the server checks their
modification time every `cert_reload_s` and loads the new pair into the live SSL context, so new
connections get the new certificate and no admission request is refused during the rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path

import uvicorn
from starlette.applications import Starlette

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


def build_server(
    app: Starlette, host: str, port: int, cert_file: Path, key_file: Path, log_level: str
) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=str(cert_file),
        ssl_keyfile=str(key_file),
        log_level=log_level,
        access_log=False,  # one line per pod admission would drown the denials that matter
        timeout_keep_alive=30,  # the API server reuses connections
        h11_max_incomplete_event_size=64 * 1024,  # headers only; bodies are limited in the app
    )
    config.load()  # builds config.ssl now, so the reloader can hold the live context
    return uvicorn.Server(config)


async def serve(server: uvicorn.Server, reload_every_s: float, background: list[asyncio.Task[None]]) -> None:
    """Serve until stopped; `background` tasks (inventory watch) are cancelled on the way out."""
    ssl_context = server.config.ssl
    tasks = list(background)
    if ssl_context is not None and server.config.ssl_certfile and server.config.ssl_keyfile:
        reloader = CertReloader(ssl_context, Path(server.config.ssl_certfile), Path(str(server.config.ssl_keyfile)))
        tasks.append(asyncio.create_task(reloader.run(reload_every_s)))
    try:
        await server.serve()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
