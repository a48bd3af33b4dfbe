"""SIGTERM under traffic: the process leaves the load balancer, finishes what it started, then stops.

A real `llmgw-inventory serve` process, a client reusing keep-alive
connections as a proxy does, and a subscriber. After SIGTERM, for the drain:
/readyz answers 503 "shutting down" and requests are still answered on the
connections they came on; then the process stops accepting (a new connection
is refused, which a proxy may retry elsewhere) and ends each connection with
its next response (`Connection: close`), and no request that was sent on an
open connection is ever dropped unanswered, which is what a proxy must not
retry for a mutation. The subscriber is told 1012 (service restart: reconnect).
"""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from tests.support.live_service import LiveService, free_port
from tests.support.reports import REGISTER, node_input
from tests.support.waiting import until_sync

pytestmark = pytest.mark.process

DRAIN = 1.5


def test_sigterm_drains_then_stops_dropping_no_request_and_tells_subscribers_to_reconnect(
    database_url: str, engine: AsyncEngine
) -> None:
    service = LiveService(
        database_url=database_url, port=free_port(), env={"INVENTORY_SHUTDOWN_DRAIN": str(DRAIN)}
    )
    service.start()
    base = service.url.removesuffix("/graphql")
    answered: list[tuple[float, int, str]] = []  # (at, status, Connection header)
    refused: list[float] = []
    dropped: list[tuple[float, str]] = []
    stop = threading.Event()

    def client_loop() -> None:
        n = 0
        with httpx.Client(timeout=httpx.Timeout(10, connect=2)) as client:
            while not stop.is_set():
                n += 1
                try:
                    response = client.post(
                        service.url,
                        json={"query": REGISTER, "variables": {"input": node_input(f"gs-{n}")}},
                    )
                except httpx.ConnectError:
                    refused.append(time.monotonic())  # never reached the process: retryable
                    time.sleep(0.01)
                    continue
                except httpx.TransportError as error:
                    dropped.append((time.monotonic(), f"{type(error).__name__}: {error}"))
                    continue
                body = response.json()
                assert not body.get("errors"), body
                answered.append(
                    (time.monotonic(), response.status_code, response.headers.get("connection", ""))
                )

    socket = ws_connect(
        service.url.replace("http://", "ws://"), subprotocols=["graphql-transport-ws"]
    )  # type: ignore[list-item]
    socket.send(json.dumps({"type": "connection_init", "payload": {}}))
    assert json.loads(socket.recv(timeout=10))["type"] == "connection_ack"
    socket.send(
        json.dumps(
            {"id": "1", "type": "subscribe", "payload": {"query": "subscription { events { id } }"}}
        )
    )
    clients = [threading.Thread(target=client_loop) for _ in range(3)]
    for c in clients:
        c.start()
    try:
        # Traffic under way: a few requests answered already.
        until_sync(lambda: len(answered) >= len(clients), "the clients' first answers")
        assert service.process is not None
        service.process.send_signal(signal.SIGTERM)
        term = time.monotonic()

        def draining() -> httpx.Response | None:
            ready = httpx.get(f"{base}/readyz", timeout=5)
            return ready if ready.status_code == 503 else None

        # Within the drain the process is still there and says why it is not ready.
        ready = until_sync(draining, "/readyz to answer 503", within=DRAIN)
        assert ready.json()["reason"] == "shutting down"
        # The subscriber is closed with 1012 once the drain is over, not before.
        code = None
        try:
            while True:
                socket.recv(timeout=DRAIN + 10)
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd is not None else None
            closed_at = time.monotonic()
        assert code == 1012
        assert closed_at - term >= DRAIN * 0.9
        assert service.process.wait(timeout=20) in (0, -signal.SIGTERM)
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=20)
        socket.close()
        service.stop()

    # Closing the listener must not reset connections the kernel had queued
    # (draining.serve_the_backlog), nor close ones whose request was written
    # but not yet read: nothing sent on a connection is ever dropped.
    assert dropped == []
    during = [a for a in answered if a[0] > term + 0.05]
    assert during, "no request was answered during the drain"
    assert all(status == 200 for _, status, _ in during), during[:5]
    # Until the listener closes, connections are kept: a proxy goes on reusing
    # its pooled ones instead of opening a new one per request, which the
    # listener's close could reset. Once it is closed, responses end them.
    kept = [a for a in during if a[0] < term + DRAIN * 0.9]
    assert kept and all(conn != "close" for _, _, conn in kept), kept[:5]
    assert any(conn == "close" for _, _, conn in during), "no response ended its connection"
    assert all(at >= term + DRAIN * 0.9 for at in refused), "refused before the drain was over"
