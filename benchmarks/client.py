"""A lean keep-alive HTTP/1.1 client for the load generators.

The load generator shares two cores with the service and PostgreSQL: httpx
spends several times more CPU per request than this, and every microsecond
the client burns is taken from the service being measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit


class GraphQLErrors(RuntimeError):
    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors[0].get("message", "error") if errors else "error")
        self.errors = errors


class Connection:
    """One keep-alive connection; one request at a time, like an agent or a scheduler."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = parts.path or "/"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\n{extra}Content-Length: "
        ).encode()
        self._used = False
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            sock = self._writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._used = False
        return self._reader, self._writer

    async def post(self, body: bytes) -> tuple[int, bytes]:
        try:
            return await self._post(body)
        except (asyncio.IncompleteReadError, ConnectionError):
            # uvicorn closes a keep-alive connection idle for 5 s; a request
            # sent on one that was already closed is sent again, once.
            if not self._used:
                raise
            await self.close()
            return await self._post(body)

    async def _post(self, body: bytes) -> tuple[int, bytes]:
        reader, writer = await self._connect()
        writer.write(self._head + str(len(body)).encode() + b"\r\n\r\n" + body)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = -1
        chunked = False
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"connection" and b"close" in value.lower():
                close = True
        if chunked:
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            data = b"".join(parts)
        else:
            data = await reader.readexactly(length)
        self._used = True
        if close:
            await self.close()
        return status, data

    async def graphql(self, body: bytes) -> dict[str, Any]:
        status, data = await self.post(body)
        reply: dict[str, Any] = json.loads(data)
        if status >= 400 or reply.get("errors"):
            raise GraphQLErrors(reply.get("errors") or [{"message": f"HTTP {status}"}])
        return reply

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None


def cycling(connection: Connection, bodies: list[bytes]) -> Callable[[], Awaitable[int]]:
    """A load worker: each call sends the next of `bodies` on `connection` (1 operation)."""
    position = 0

    async def call() -> int:
        nonlocal position
        await connection.graphql(bodies[position % len(bodies)])
        position += 1
        return 1

    return call


def request_body(query: str, variables: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"query": query, "variables": variables or {}}).encode()
