"""A minimal HTTP/1.1 keep-alive JSON client for loopback calls to the extender (the demo's fake
kube-scheduler and the benchmarks). It does what kube-scheduler's Go client does for the extender (POST a
JSON body, read a JSON answer) with a fraction of a general-purpose client's per-request overhead, so the
figures measure the extender rather than the client."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class HTTPError(RuntimeError):
    pass


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def request(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        self.writer.write(head + body)
        status_line = await self.reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        length = -1
        chunked = False
        while True:
            line = await self.reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.partition(b":")
            lname = name.strip().lower()
            if lname == b"content-length":
                length = int(value.strip())
            elif lname == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                data = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(data[:-2])
            return status, b"".join(parts)
        if length < 0:
            raise HTTPError("response without Content-Length")
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


class JsonClient:
    """POST JSON to `base_url/<path>` over a small pool of keep-alive connections."""

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{base_url!r}: only http://host:port URLs are supported")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s = timeout_s
        self._idle: list[_Connection] = []
        self._host_header = f"{self.host}:{self.port}".encode()

    async def _connect(self) -> _Connection:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return _Connection(reader, writer)

    async def post_raw(self, path: str, body: bytes) -> tuple[int, bytes]:
        head = (
            b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + self._host_header
            + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        conn = self._idle.pop() if self._idle else await self._connect()
        try:
            status, data = await asyncio.wait_for(conn.request(head, body), self.timeout_s)
        except BaseException:
            conn.close()
            raise
        self._idle.append(conn)
        return status, data

    async def post(self, path: str, payload: Any) -> Any:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        status, data = await self.post_raw(path, body)
        if status != 200:
            raise HTTPError(f"POST {path} answered {status}: {data[:200].decode(errors='replace')}")
        return json.loads(data)

    async def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
