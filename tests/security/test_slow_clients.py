"""Issue 26: slow and idle clients against the real webhook (HTTPS, served as `gpupool webhook` serves it)
and the agent's real /metrics server, over real sockets. Each server runs with short deadlines here
(0.5 s for headers and body, 1 s keep-alive) so that the tests wait for the server to act; the waits are
bounded only to turn a hang into a failure, nothing asserts how long anything took."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpupool.commands.agent_metrics import start_metrics_server
from gpupool.scheduler.server import ConnectionLimits
from gpupool.webhook.inventory import InventoryView
from tests.webhook.helpers import TLSFiles, make_tls, pod, review, start_webhook

HANG = 30.0  # a bound against hanging, never a measurement
FAST = {"header_timeout_s": 0.5, "body_timeout_s": 0.5, "keep_alive_s": 1}


@dataclass
class Target:
    name: str
    port: int
    tls: ssl.SSLContext | None  # the client's context (None: plain HTTP)
    path: str  # a GET every server answers

    async def connect(self, handshake: bool = True) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=self.tls if handshake else None)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls(tmp_path_factory.mktemp("tls"))


@contextlib.asynccontextmanager
async def webhook(tls: TLSFiles, **transport: Any) -> AsyncIterator[Target]:
    server, task, port = await start_webhook(tls, InventoryView(), **{**FAST, **transport})
    try:
        yield Target("webhook", port, ssl.create_default_context(cafile=str(tls.ca)), "/healthz")
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, HANG)


@contextlib.asynccontextmanager
async def agent_metrics(tmp_path: Path, **limits: Any) -> AsyncIterator[Target]:
    async def no_pods(node: str) -> list[dict[str, Any]]:
        return []

    agent = SimpleNamespace(table=SimpleNamespace(known={}), config=SimpleNamespace(node_name="n1", hook_root=tmp_path),
                            cluster=SimpleNamespace(list_pods_on_node=no_pods), mps=None, watchdog=None,
                            dra=None, remote=None, moves=None)
    settings = {"header_timeout_s": 0.5, "body_timeout_s": 0.5, "keep_alive_s": 1.0, **limits}
    server = await start_metrics_server(agent, "127.0.0.1", 0, limits=ConnectionLimits(**settings))  # type: ignore[arg-type]
    try:
        yield Target("agent-metrics", server.port, None, "/metrics")
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def target(kind: str, tls: TLSFiles, tmp_path: Path, **limits: Any) -> AsyncIterator[Target]:
    if kind == "webhook":
        per_peer = limits.pop("max_per_peer", None)
        extra = {"max_connections_per_peer": per_peer} if per_peer is not None else {}
        async with webhook(tls, **limits, **extra) as t:
            yield t
    else:
        async with agent_metrics(tmp_path, **limits) as t:
            yield t


KINDS = ["webhook", "agent-metrics"]


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), HANG):
            data += chunk
    except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
        pass
    return data


async def get(t: Target, path: str | None = None) -> bytes:
    reader, writer = await t.connect()
    writer.write(f"GET {path or t.path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await closed_by_server(reader)
    writer.close()
    return data


@pytest.mark.parametrize("kind", KINDS)
async def test_idle_connections_are_closed(kind: str, tls: TLSFiles, tmp_path: Path) -> None:
    """200 connections that send nothing (for the webhook: not even a TLS handshake) are all closed by
    the server; before, all 200 were still open 20 s later."""
    async with target(kind, tls, tmp_path, max_per_peer=256, max_connections=1024) as t:
        conns = [await t.connect(handshake=False) for _ in range(200)]
        assert await asyncio.gather(*(closed_by_server(r) for r, _ in conns)) == [b""] * 200
        for _, w in conns:
            w.close()
        assert b" 200 " in await get(t)


@pytest.mark.parametrize("kind", KINDS)
async def test_slow_headers_lose_the_connection(kind: str, tls: TLSFiles, tmp_path: Path) -> None:
    async with target(kind, tls, tmp_path) as t:
        reader, writer = await t.connect()
        writer.write(f"GET {t.path} HTTP/1.1\r\nHost: x\r\n".encode())
        sent = 0
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while not reader.at_eof() and sent < 10 * HANG:  # one header line every 0.1 s, never the end
                writer.write(f"X-Slow-{sent}: y\r\n".encode())
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1), 0.1)
                sent += 1
        assert reader.at_eof() or writer.is_closing(), "the server kept a connection whose headers never ended"
        writer.close()
        assert b" 200 " in await get(t)


async def test_a_slow_body_gets_408_and_the_connection_closed(tls: TLSFiles) -> None:
    async with webhook(tls) as t:
        reader, writer = await t.connect()
        writer.write(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n{\"apiVersion\":")
        await writer.drain()
        answer = await closed_by_server(reader)  # no more bytes sent: the body never completes
        assert answer.startswith(b"HTTP/1.1 408 ") and b"request body not received in time" in answer
        writer.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_an_idle_kept_alive_connection_is_closed(kind: str, tls: TLSFiles, tmp_path: Path) -> None:
    async with target(kind, tls, tmp_path) as t:
        reader, writer = await t.connect()
        writer.write(f"GET {t.path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())  # keep-alive
        await writer.drain()
        assert b" 200 " in await closed_by_server(reader)  # answered, then closed once idle
        writer.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_connections_are_capped_per_peer(kind: str, tls: TLSFiles, tmp_path: Path) -> None:
    async with target(kind, tls, tmp_path, header_timeout_s=HANG, max_per_peer=4) as t:
        held = [await t.connect(handshake=False) for _ in range(4)]
        extra, writer = await t.connect(handshake=False)
        assert await closed_by_server(extra) == b""  # closed at once: the address holds 4 already
        writer.close()
        held.pop()[1].close()  # one of the four leaves: a new connection is served
        reply = b""
        for _ in range(100):  # the server notices the close asynchronously; the bound only avoids a hang
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                reply = await get(t)
            if reply:
                break
            await asyncio.sleep(0.05)
        assert b" 200 " in reply
        for _, w in held:
            w.close()


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def logged() -> Iterator[Records]:
    """Every record of uvicorn's error logger (it does not propagate to pytest's capture) and the root's;
    entered once the server runs (uvicorn's logging set-up replaces its loggers' handlers)."""
    handler = Records()
    for name in ("uvicorn.error", ""):
        logging.getLogger(name).addHandler(handler)
    yield handler
    for name in ("uvicorn.error", ""):
        logging.getLogger(name).removeHandler(handler)


async def test_a_client_leaving_mid_body_logs_no_traceback(tls: TLSFiles) -> None:
    raw = json.dumps(review(pod({"gpupool.io/gpu": "1"}))).encode()
    head = b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    async with webhook(tls, body_timeout_s=HANG) as t:
        with logged() as records:
            for _ in range(5):
                reader, writer = await t.connect()
                writer.write(head + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw[: len(raw) // 2])
                await writer.drain()
                writer.close()  # gone mid-body
                with contextlib.suppress(ConnectionError, ssl.SSLError):
                    await writer.wait_closed()
            reader, writer = await t.connect()
            writer.write(head + f"Connection: close\r\nContent-Length: {len(raw)}\r\n\r\n".encode() + raw)
            await writer.drain()
            assert b" 200 " in await closed_by_server(reader)  # still serving (and after the five left)
            writer.close()
        failures = [r for r in records.records if r.exc_info or r.levelno >= logging.ERROR]
        assert failures == [], [r.getMessage() for r in failures]
