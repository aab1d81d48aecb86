"""Who may call the extender: real uvicorn servers on 127.0.0.1 with TLS client certificates or a bearer
token (gpupool.scheduler.auth, gpupool.scheduler.server), the slow-client timeouts, and the start-up refusal
of a non-loopback listener without either."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpupool.cli import main as cli
from gpupool.demo.extender_client import JsonClient
from gpupool.scheduler.auth import server_security
from gpupool.scheduler.config import ConfigError, SchedulerConfig
from gpupool.scheduler.server import ServerHandle, serve_in_background
from tests.tls_material import Pair, issue, make_ca

TOKEN = "s3cret-token-0123456789abcdef"


def _app() -> Starlette:
    async def bind(request: Request) -> JSONResponse:
        body = await request.body()
        return JSONResponse({"Error": "", "Got": len(body)})

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    return Starlette(routes=[Route("/bind", bind, methods=["POST"]), Route("/healthz", healthz)])


async def _serve(config: SchedulerConfig) -> ServerHandle:
    return await serve_in_background(_app(), config.host, 0, security=server_security(config))


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, Path | Pair]:
    ca = make_ca(tmp_path, "cluster-ca")
    other = make_ca(tmp_path, "other-ca")
    return {
        "ca": ca.path,
        "server": issue(ca, tmp_path, "extender", server=True),
        "client": issue(ca, tmp_path, "kube-scheduler", server=False),
        "stranger": issue(other, tmp_path, "kube-scheduler", server=False),
    }


@pytest.fixture
async def tls_server(certs: dict[str, Path | Pair]) -> AsyncIterator[ServerHandle]:
    server = certs["server"]
    assert isinstance(server, Pair)
    config = SchedulerConfig(auth="tls", tls_cert_file=str(server.cert), tls_key_file=str(server.key),
                             tls_client_ca_file=str(certs["ca"]), leader_elect=False)
    handle = await _serve(config)
    yield handle
    await handle.stop()


def _client_ctx(ca: Path, pair: Pair | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if pair is not None:
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
    return ctx


async def test_tls_serves_a_client_certificate_from_the_configured_ca(tls_server: ServerHandle, certs: dict) -> None:
    assert tls_server.url.startswith("https://127.0.0.1:")
    client = JsonClient(tls_server.url, verify=str(certs["ca"]), cert=(str(certs["client"].cert),
                                                                         str(certs["client"].key)))
    try:
        # 8 bytes of JSON body ({"a": 1} written by json.dumps) reach the handler.
        assert await client.post("/bind", {"a": 1}) == {"Error": "", "Got": 8}
    finally:
        await client.close()


@pytest.mark.parametrize("who", ["nobody", "stranger"])
async def test_tls_refuses_no_certificate_and_a_certificate_from_another_ca(
    tls_server: ServerHandle, certs: dict, who: str
) -> None:
    pair = None if who == "nobody" else certs["stranger"]
    async with httpx.AsyncClient(verify=_client_ctx(certs["ca"], pair)) as client:
        # The server ends the TLS handshake (TLS 1.3 reports it on the first read), so no request is served.
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            await client.post(tls_server.url + "/bind", content=b"{}")


async def test_plain_http_to_the_tls_port_is_not_served(tls_server: ServerHandle) -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError)):
            await client.post(tls_server.url.replace("https", "http") + "/bind", content=b"{}")


@pytest.fixture
async def token_server(tmp_path: Path) -> AsyncIterator[ServerHandle]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")  # a Secret mounted from a file written by hand ends in a newline
    handle = await _serve(SchedulerConfig(auth="token", token_file=str(token_file), leader_elect=False))
    yield handle
    await handle.stop()


@pytest.mark.parametrize(("header", "status", "why"), [
    (None, 401, "missing bearer token"),
    ("Bearer wrong-token-0123456789abcdef", 401, "wrong bearer token"),
    (f"Basic {TOKEN}", 401, "wrong bearer token"),
    (f"Bearer {TOKEN}", 200, None),
])
async def test_token_mode(token_server: ServerHandle, header: str | None, status: int, why: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    async with httpx.AsyncClient() as client:
        r = await client.post(token_server.url + "/bind", content=b"{}", headers=headers)
    assert r.status_code == status
    if why is not None:
        assert r.json() == {"Error": f"unauthorized: {why}"}
        assert r.headers["www-authenticate"] == "Bearer"
    else:
        assert r.json() == {"Error": "", "Got": 2}


async def test_token_mode_leaves_the_health_probe_open(token_server: ServerHandle) -> None:
    async with httpx.AsyncClient() as client:
        r = await client.get(token_server.url + "/healthz")
    assert r.status_code == 200


async def test_the_extender_client_sends_the_token(token_server: ServerHandle) -> None:
    client = JsonClient(token_server.url, token=TOKEN)
    try:
        assert await client.post("/bind", {}) == {"Error": "", "Got": 2}
    finally:
        await client.close()


# --- slow clients ----------------------------------------------------------------------------------------


@pytest.fixture
async def impatient_server() -> AsyncIterator[ServerHandle]:
    config = SchedulerConfig(header_timeout_s=0.3, body_timeout_s=0.3, leader_elect=False)
    handle = await _serve(config)
    yield handle
    await handle.stop()


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    # Generous bound: the server closes after 0.3 s; 10 s only guards a hang of the test itself.
    return await asyncio.wait_for(reader.read(), 10)


async def test_headers_sent_a_byte_at_a_time_lose_the_connection(impatient_server: ServerHandle) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", impatient_server.port)
    writer.write(b"POST /bind HTTP/1.1\r\nHost: x\r\n")  # never finished
    await writer.drain()
    assert await _read_all(reader) == b""  # closed without an answer
    writer.close()


async def test_an_idle_connection_that_never_speaks_is_closed(impatient_server: ServerHandle) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", impatient_server.port)
    assert await _read_all(reader) == b""
    writer.close()


async def test_a_body_that_stops_arriving_gets_408_and_a_close(impatient_server: ServerHandle) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", impatient_server.port)
    writer.write(b"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"{" * 10)  # 90 bytes short
    await writer.drain()
    answer = await _read_all(reader)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"connection: close" in answer.lower()
    assert answer.endswith(b'{"Error":"request body not received in time"}')
    writer.close()


async def test_a_keep_alive_connection_may_wait_between_requests(impatient_server: ServerHandle) -> None:
    """The header timer runs from a request's first byte, not across the idle time between requests
    (uvicorn's keep-alive timeout, 30 s, governs that)."""
    async with httpx.AsyncClient() as client:
        first = await client.post(impatient_server.url + "/bind", content=b"{}")
        await asyncio.sleep(0.6)  # twice the header timeout
        second = await client.post(impatient_server.url + "/bind", content=b"{}")
    assert (first.status_code, second.status_code) == (200, 200)


async def test_a_tls_client_that_never_completes_its_handshake_is_closed(certs: dict) -> None:
    """With auth=tls the handshake counts against the header deadline (asyncio's own waited 60 s), and a
    client certificate is still required once the deadline machinery makes the handshake."""
    server = certs["server"]
    config = SchedulerConfig(auth="tls", tls_cert_file=str(server.cert), tls_key_file=str(server.key),
                             tls_client_ca_file=str(certs["ca"]), leader_elect=False, header_timeout_s=0.3)
    handle = await _serve(config)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", handle.port)  # TCP only, no ClientHello
        assert await _read_all(reader) == b""
        writer.close()
        async with httpx.AsyncClient(verify=_client_ctx(certs["ca"], certs["client"])) as client:
            assert (await client.get(handle.url + "/healthz")).status_code == 200
        async with httpx.AsyncClient(verify=_client_ctx(certs["ca"], None)) as client:
            with pytest.raises(httpx.HTTPError):
                await client.get(handle.url + "/healthz")
    finally:
        await handle.stop()


# --- configuration ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({"host": "0.0.0.0"}, "auth: the extender listens on '0.0.0.0', which is not a loopback address"),
    ({"host": "10.1.2.3", "auth": "tls"}, "tls_cert_file: required with auth=tls"),
    ({"host": "10.1.2.3", "auth": "token"}, "token_file: required with auth=token"),
    ({"auth": "token", "token_file": "/nonexistent/token"}, "token_file: /nonexistent/token is not a readable file"),
])
def test_bad_auth_config_is_refused_with_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        server_security(SchedulerConfig(**fields))


def test_loopback_addresses_need_no_auth() -> None:
    for host in ("127.0.0.1", "127.8.9.10", "::1", "localhost"):
        assert server_security(SchedulerConfig(host=host)).tls is None


def test_short_token_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("short\n")
    with pytest.raises(ConfigError, match="holds 5 characters; a token needs at least 16"):
        server_security(SchedulerConfig(auth="token", token_file=str(tmp_path / "t")))


def test_tls_files_that_do_not_load_are_named(tmp_path: Path) -> None:
    for name in ("c", "k", "ca"):
        (tmp_path / name).write_text("not a certificate\n")
    config = SchedulerConfig(auth="tls", tls_cert_file=str(tmp_path / "c"), tls_key_file=str(tmp_path / "k"),
                             tls_client_ca_file=str(tmp_path / "ca"))
    with pytest.raises(ConfigError, match="tls_\\*: cannot load .*/c / .*/k / .*/ca"):
        server_security(config)


def test_the_command_exits_2_on_a_public_address_without_auth(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}\n")
    result = CliRunner().invoke(cli, ["scheduler", "--kubeconfig", str(kubeconfig), "--host", "0.0.0.0"])
    assert result.exit_code == 2, result.output
    assert "which is not a loopback address" in result.output
    assert "Traceback" not in result.output


def test_serving_a_public_address_without_security_is_refused() -> None:
    with pytest.raises(ValueError, match="refusing to serve on '0.0.0.0'"):
        asyncio.run(serve_in_background(_app(), "0.0.0.0", 0))

