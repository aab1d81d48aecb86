"""A JSON client for the extender, as kube-scheduler's Go client uses it (POST a JSON body, read a JSON
answer over keep-alive connections), built on httpx. Used by the fake kube-scheduler and the benchmarks."""

from __future__ import annotations

import json
import ssl
from typing import Any

import httpx


class HTTPError(RuntimeError):
    pass


class JsonClient:
    """POST JSON to `base_url/<path>`. `verify`/`cert`/`token` reach an extender that requires TLS with
    client certificates or a bearer token (see `SchedulerConfig.auth`)."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 30.0,
        *,
        verify: str | bool = True,
        cert: tuple[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"{base_url!r}: only http(s)://host:port URLs are supported")
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        tls: ssl.SSLContext | bool = False
        if url.scheme == "https":
            tls = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
            if verify is False:
                tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
            if cert is not None:
                tls.load_cert_chain(*cert)
        self._settings: dict[str, Any] = {
            "base_url": str(url).rstrip("/"),
            "timeout": timeout_s,
            "headers": headers,
            "verify": tls,
            # One connection per concurrent bind at most; kube-scheduler keeps its connections alive too.
            "limits": httpx.Limits(max_connections=64, max_keepalive_connections=64),
        }
        self._client: httpx.AsyncClient | None = None

    @property
    def _http(self) -> httpx.AsyncClient:
        # Made on first use and again after close(), so one JsonClient serves several runs.
        if self._client is None:
            self._client = httpx.AsyncClient(**self._settings)
        return self._client

    async def post_raw(self, path: str, body: bytes) -> tuple[int, bytes]:
        response = await self._http.post(path, content=body)
        return response.status_code, response.content

    async def post(self, path: str, payload: Any) -> Any:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        status, data = await self.post_raw(path, body)
        if status != 200:
            raise HTTPError(f"POST {path} answered {status}: {data[:200].decode(errors='replace')}")
        return json.loads(data)

    async def close(self) -> None:
        """Close the connections (a later request opens new ones)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
