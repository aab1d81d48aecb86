"""Run an ASGI app under uvicorn inside the current event loop (demo, tests, benchmarks, the command), with
the extender's transport rules: TLS with client certificates or a bearer token (`ServerSecurity`, from
gpupool.scheduler.auth), and read timeouts so that a client sending its headers or body a byte at a time
(slowloris) loses its connection instead of holding it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from asyncio.sslproto import SSLProtocol
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpupool.scheduler.auth import BearerToken, ServerSecurity, is_loopback, server_ssl_context


@dataclass(slots=True)
class ServerHandle:
    server: uvicorn.Server
    task: asyncio.Task[None]
    host: str
    port: int
    scheme: str = "http"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

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


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one HTTP server keeps for its callers (the extender, the webhook, the agent's /metrics).

    A connection must complete its request headers within `header_timeout_s` of being accepted (the TLS
    handshake included) or of its request's first byte, and its body within `body_timeout_s` of the
    headers (else 408); the head may not exceed `max_header_bytes`. An idle connection is closed
    `keep_alive_s` after its last response. At most `max_connections` connections are open at once, at
    most `max_per_peer` from one address: past either a new connection is closed at once, before
    anything is read from it."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 1024
    max_per_peer: int = 256
    max_header_bytes: int = 64 * 1024


def guarded_protocol(limits: ConnectionLimits, tls: ssl.SSLContext | None = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the bounds of `limits`, counted per server (one class per call).
    uvicorn bounds the idle time between requests (timeout_keep_alive) but not the time a request's
    headers take, nor the number of connections. With `tls`, the TLS handshake is made here (uvicorn must
    then serve without ssl_*): asyncio's own handshake waits 60 s and happens before any protocol
    sees the connection, so neither the header deadline nor the caps could reach it."""
    per_peer: dict[str, int] = {}
    total = [0]

    class GuardedProtocol(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None
        _peer: str | None = None
        _raw: asyncio.BaseTransport | None = None
        _handshaking = False
        _head_bytes = 0

        def _arm(self) -> None:
            self._disarm()
            self._head_bytes = 0
            self._timer = self.loop.call_later(limits.header_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            transport = self._raw if self._raw is not None else self.transport
            if transport is not None and not transport.is_closing():
                transport.close()

        def _release(self) -> None:
            if self._peer is not None:
                left = per_peer.pop(self._peer) - 1
                if left:
                    per_peer[self._peer] = left
                total[0] -= 1
                self._peer = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if self._handshaking:  # the TLS layer below says the handshake is done: uvicorn takes over
                self._handshaking = False
                self._raw = None
                super().connection_made(transport)
                return
            peer = transport.get_extra_info("peername")
            host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            if total[0] >= limits.max_connections or per_peer.get(host, 0) >= limits.max_per_peer:
                transport.abort()  # nothing read, nothing kept; connection_lost is not ours to follow
                return
            self._peer = host
            per_peer[host] = per_peer.get(host, 0) + 1
            total[0] += 1
            if tls is None:
                super().connection_made(transport)
                self._arm()
                return
            # The TLS layer calls connection_made again once the handshake is done, before any data.
            self._raw, self._handshaking = transport, True
            self._arm()  # the handshake counts against the header deadline
            waiter = self.loop.create_future()
            waiter.add_done_callback(self._handshake_done)
            layer = SSLProtocol(self.loop, self, tls, waiter, server_side=True, call_connection_made=True,
                                ssl_handshake_timeout=limits.header_timeout_s)  # type: ignore[arg-type]  # a float at runtime
            transport.set_protocol(layer)
            layer.connection_made(transport)

        def _handshake_done(self, waiter: asyncio.Future[None]) -> None:
            if waiter.cancelled() or waiter.exception() is not None:  # a failed or abandoned handshake
                # (nothing to log per connection; the TLS layer closed it and tells the protocol nothing more)
                self._disarm()
                self._release()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._timer is not None:  # still waiting for the head
                self._head_bytes += len(data)
                if self._head_bytes > limits.max_header_bytes + 256 * 1024:  # one read may carry body bytes
                    self._too_slow()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            # Between requests uvicorn's keep-alive timer applies; the next request re-arms at its first byte.
            self._disarm()
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._release()
            if self.transport is not None:  # uvicorn's state exists only once it saw the connection
                super().connection_lost(exc)

    return GuardedProtocol


class BodyTimeout:
    """ASGI middleware: a request body not complete within `timeout_s` of the headers gets 408 and the
    connection is closed; the app sees a disconnect (app.py answers nothing more for it)."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app, self.timeout_s = app, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body_done = False
        timed_out = False

        async def timed_receive() -> Message:
            nonlocal body_done, timed_out
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):  # no task per call, unlike wait_for
                    message = await receive()
            except TimeoutError:
                timed_out = True
                return {"type": "http.disconnect"}
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def guarded_send(message: Message) -> None:
            if not timed_out:
                await send(message)

        try:
            await self.app(scope, timed_receive, guarded_send)
        except Exception:
            if not timed_out:  # an app that does not expect a disconnect may raise on it; we answer 408
                raise
        if timed_out:
            body = b'{"Error":"request body not received in time"}'
            await send({"type": "http.response.start", "status": 408, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),  # the rest of the body must not be read as the next request
            ]})
            await send({"type": "http.response.body", "body": body})


async def serve_in_background(
    app: Any, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 10.0,
    security: ServerSecurity | None = None,
) -> ServerHandle:
    """Bind `host:port` (0 = a free port), start serving, and return once the server accepts requests.
    Without TLS or a token only a loopback host is accepted (see gpupool.scheduler.auth)."""
    security = security or ServerSecurity()
    if security.tls is None and security.token is None and not is_loopback(host):
        raise ValueError(f"refusing to serve on {host!r} without TLS client certificates or a bearer token")
    wrapped: ASGIApp = BodyTimeout(app, security.body_timeout_s)
    if security.token is not None:
        wrapped = BearerToken(wrapped, security.token)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it on Linux
    sock.bind((host, port))
    actual_port = sock.getsockname()[1]
    # The client CA and CERT_REQUIRED make the TLS handshake itself fail for a client without a certificate
    # from that CA; the handshake is made by the guarded protocol, within the header deadline.
    tls = server_ssl_context(security.tls) if security.tls is not None else None
    limits = ConnectionLimits(header_timeout_s=security.header_timeout_s, body_timeout_s=security.body_timeout_s,
                              keep_alive_s=30.0)  # kube-scheduler reuses its connections
    config = uvicorn.Config(
        wrapped, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=int(limits.keep_alive_s),
        http=guarded_protocol(limits, tls),  # (it caps connections; uvicorn runs one request per connection)
    )
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
    return ServerHandle(server, task, host, actual_port, "https" if security.tls is not None else "http")
