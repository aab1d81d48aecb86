"""Who may call the extender. A `/bind` moves pods and hands out GPU shares, so anything that can reach the
port must prove it is kube-scheduler:

- on a loopback address (the default: kube-scheduler in the same pod) no proof is asked, because only
  processes of the pod's network namespace can connect;
- anywhere else the config must choose `tls` (HTTPS with a client certificate signed by a CA it names,
  which kube-scheduler's extender `tlsConfig` sends) or `token` (a bearer token from a mounted Secret file,
  for clients that can send a header). Neither is a configuration error: the command exits 2 before it
  listens.

`server_security` turns the config into what the HTTP server needs, reading and checking the files once.
"""

from __future__ import annotations

import hmac
import ipaddress
import ssl
from dataclasses import dataclass, replace
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from gpupool.scheduler.config import ConfigError, SchedulerConfig

# kubelet probes carry no credentials; these two answer "up / ready" and nothing else.
UNAUTHENTICATED_PATHS = frozenset({"/healthz", "/readyz"})


@dataclass(frozen=True, slots=True)
class TLSFiles:
    cert_file: str
    key_file: str
    client_ca_file: str


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    """What the HTTP server enforces: TLS with client certificates, a bearer token, or neither (loopback
    only), plus the read timeouts that keep a slow client from holding a connection."""

    tls: TLSFiles | None = None
    token: str | None = None
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name or "" (every address): not provably loopback
        return False


def _readable(field: str, value: str | None, mode: str) -> str:
    if not value:
        raise ConfigError(f"scheduler config {field}: required with auth={mode}")
    if not Path(value).is_file():
        raise ConfigError(f"scheduler config {field}: {value} is not a readable file")
    return value


def server_security(config: SchedulerConfig) -> ServerSecurity:
    """Check the auth settings against the listen address and load them; ConfigError names the field."""
    plain = ServerSecurity(header_timeout_s=config.header_timeout_s, body_timeout_s=config.body_timeout_s)
    if config.auth == "none":
        if not is_loopback(config.host):
            raise ConfigError(
                f"scheduler config auth: the extender listens on {config.host!r}, which is not a loopback "
                "address, so anyone who reaches it could bind pods; set auth to 'tls' (with tls_cert_file, "
                "tls_key_file, tls_client_ca_file) or 'token' (with token_file), or listen on 127.0.0.1"
            )
        return plain
    if config.auth == "token":
        path = _readable("token_file", config.token_file, "token")
        try:
            token = Path(path).read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"scheduler config token_file: cannot read {path}: {e}") from None
        if len(token) < 16:
            raise ConfigError(f"scheduler config token_file: {path} holds {len(token)} characters; "
                              "a token needs at least 16")
        return replace(plain, token=token)
    files = TLSFiles(
        _readable("tls_cert_file", config.tls_cert_file, "tls"),
        _readable("tls_key_file", config.tls_key_file, "tls"),
        _readable("tls_client_ca_file", config.tls_client_ca_file, "tls"),
    )
    try:  # fail here with the file's name rather than inside uvicorn's start-up
        server_ssl_context(files)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"scheduler config tls_*: cannot load {files.cert_file} / {files.key_file} / "
                          f"{files.client_ca_file}: {e}") from None
    return replace(plain, tls=files)


def server_ssl_context(files: TLSFiles) -> ssl.SSLContext:
    """TLS 1.2+ server context that refuses a handshake without a client certificate from the CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(files.cert_file, files.key_file)
    ctx.load_verify_locations(cafile=files.client_ca_file)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class BearerToken:
    """ASGI middleware: 401 unless `Authorization: Bearer <token>` (compared in constant time)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNAUTHENTICATED_PATHS:
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if hmac.compare_digest(given, self._expected):
            await self.app(scope, receive, send)
            return
        reason = b"missing bearer token" if not given else b"wrong bearer token"
        body = b'{"Error":"unauthorized: ' + reason + b'"}'
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]})
        await send({"type": "http.response.body", "body": body})
