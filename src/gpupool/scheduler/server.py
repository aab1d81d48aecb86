"""Run an ASGI app under uvicorn inside the current event loop (demo, tests, benchmarks, the command)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass
from typing import Any

import uvicorn


@dataclass(slots=True)
class ServerHandle:
    server: uvicorn.Server
    task: asyncio.Task[None]
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the embedding program owns signals (older uvicorn)
        pass

    @contextlib.contextmanager
    def capture_signals(self) -> Any:  # the embedding program owns signals (newer uvicorn)
        yield


async def serve_in_background(
    app: Any, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 10.0
) -> ServerHandle:
    """Bind `host:port` (0 = a free port), start serving, and return once the server accepts requests."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it on Linux
    sock.bind((host, port))
    actual_port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30)
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not server.started:
        if task.done():
            task.result()  # raises the start-up error
        if loop.time() > deadline:
            raise TimeoutError(f"HTTP server on {host}:{actual_port} did not start within {timeout_s}s")
        await asyncio.sleep(0.01)
    return ServerHandle(server, task, host, actual_port)
