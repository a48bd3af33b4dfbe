"""Subscribing to the service's events over graphql-transport-ws, as a client does."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import websockets


class Subscriber:
    """A graphql-transport-ws client, as a scheduler reacting to lost nodes would run one."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.received: list[dict[str, Any]] = []

    async def next_event(self, within: float) -> dict[str, Any] | None:
        try:
            async with asyncio.timeout(within):
                while True:
                    message = json.loads(await self.socket.recv())
                    if message["type"] == "next":
                        event: dict[str, Any] = message["payload"]["data"]["events"]
                        self.received.append(event)
                        return event
                    if message["type"] in ("error", "complete"):
                        raise AssertionError(f"subscription ended: {message}")
                    if message["type"] == "ping":
                        await self.socket.send(json.dumps({"type": "pong"}))
        except TimeoutError:
            return None


@contextlib.asynccontextmanager
async def subscribe(graphql_url: str, query: str) -> AsyncIterator[Subscriber]:
    ws_url = graphql_url.replace("http://", "ws://", 1)
    async with websockets.connect(ws_url, subprotocols=["graphql-transport-ws"]) as socket:  # type: ignore[list-item]
        await socket.send(json.dumps({"type": "connection_init", "payload": {}}))
        ack = json.loads(await socket.recv())
        assert ack["type"] == "connection_ack", ack
        await socket.send(json.dumps({"id": "1", "type": "subscribe", "payload": {"query": query}}))
        yield Subscriber(socket)
