"""PostgreSQL failover, followed with no restart and no new URL: the primary dies, the standby is promoted.

The service is given both hosts in libpq's multi-host form with
`target_session_attrs=read-write` (what a Patroni cluster or a managed
PostgreSQL with a standby hands an operator). An agent-like writer registers a
new node every 50 ms throughout; the primary is stopped (immediately, as a
crash) and the standby promoted. The story a user relies on:

- writes succeed again, through the same URL, within 30 s;
- none is refused in between once it is running: a write that found the
  primary gone is made again on the promoted standby (INVENTORY_WRITE_RETRY),
  never a 500. The one refusal docs/deployment/failover.md allows is the token
  check's, which is a read and is not retried: HTTP 503 DATABASE_UNAVAILABLE with
  Retry-After, before anything ran;
- the standby was synchronous, so every write that was acknowledged is there;
- the liveness sweep and an open subscription carry on against the new primary.

The figures it prints are the README's ("Deployment and high availability").
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from tests.support.live_service import LiveService, free_port
from tests.support.pg_cluster import StandbyPair, running_pair
from tests.support.reports import REGISTER, node_input
from tests.support.waiting import until_sync

pytestmark = [pytest.mark.serial, pytest.mark.process]

WRITE_EVERY = 0.05
FOLLOW_WITHIN = 30.0


@dataclass
class Writes:
    acked: list[tuple[float, str]] = field(default_factory=list)  # (answered at, node id)
    refused: list[tuple[int, str | None]] = field(default_factory=list)  # (status, code)
    lock: threading.Lock = field(default_factory=threading.Lock)


def write_every_50ms(url: str, writes: Writes, stop: threading.Event) -> None:
    n = 0
    with httpx.Client(timeout=20) as client:
        while not stop.is_set():
            node_id = f"fo-{n:05d}"
            n += 1
            body: dict[str, Any] = {}
            try:
                response = client.post(
                    url, json={"query": REGISTER, "variables": {"input": node_input(node_id)}}
                )
                status, body = response.status_code, response.json()
            except httpx.TransportError:
                status = 0
            with writes.lock:
                if status == 200 and not body.get("errors"):
                    writes.acked.append((time.monotonic(), node_id))
                else:
                    error = (body.get("errors") or [{}])[0]
                    writes.refused.append((status, (error.get("extensions") or {}).get("code")))
            time.sleep(WRITE_EVERY)


def unavailable_retries(service: LiveService) -> float:
    """Writes the service retried because the database was away (its metric; 0 before any)."""
    metrics = httpx.get(service.url.replace("/graphql", "/metrics"), timeout=10).text
    retried = [
        line for line in metrics.splitlines()
        if line.startswith('inventory_db_write_retries_total{cause="unavailable"}')
    ]  # fmt: skip
    return float(retried[0].split()[-1]) if retried else 0.0


@pytest.fixture
def pair() -> Iterator[StandbyPair]:
    with running_pair() as cluster:
        yield cluster


def gql(url: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = httpx.post(
        url, json={"query": query, "variables": variables or {}}, timeout=20
    ).json()
    return body


def test_primary_dies_standby_promoted_service_follows_and_loses_no_acknowledged_write(
    pair: StandbyPair,
) -> None:
    service = LiveService(
        database_url=pair.url,
        port=free_port(),
        env={
            "INVENTORY_DB_TIMEOUT": "1",
            "INVENTORY_UNREACHABLE_AFTER": "1.5",
            "INVENTORY_LOST_AFTER": "600",
            "INVENTORY_SWEEP_INTERVAL": "0.2",
        },
    )
    service.start()
    writes = Writes()
    stop = threading.Event()
    writer = threading.Thread(target=write_every_50ms, args=(service.url, writes, stop))
    socket = ws_connect(
        service.url.replace("http://", "ws://"), subprotocols=["graphql-transport-ws"]
    )  # type: ignore[list-item]
    try:
        # A subscriber watching one node, opened before the failover.
        socket.send(json.dumps({"type": "connection_init", "payload": {}}))
        assert json.loads(socket.recv(timeout=10))["type"] == "connection_ack"
        subscription = 'subscription { events(nodeId: "fo-watched") { kind nodeId } }'
        socket.send(
            json.dumps({"id": "1", "type": "subscribe", "payload": {"query": subscription}})
        )

        writer.start()

        def acked() -> int:
            with writes.lock:
                return len(writes.acked)

        until_sync(lambda: acked() >= 10, "10 writes acknowledged before the failover")

        pair.primary.stop("immediate")
        died = time.monotonic()
        # The standby is promoted once the service has met the outage (a write retried):
        # promoted at once, a writer starved by a loaded machine could sleep through the
        # whole outage, and the retry counted below never happen (a flake, not a finding).
        until_sync(lambda: unavailable_retries(service) >= 1, "a write retried while down")
        pair.standby.promote()
        promoted = time.monotonic()

        # Writes resume through the same URL.
        deadline = died + FOLLOW_WITHIN
        first_after: float | None = None
        while first_after is None and time.monotonic() < deadline:
            with writes.lock:
                first_after = next((t for t, _ in writes.acked if t > promoted), None)
            time.sleep(0.02)
        assert first_after is not None, f"no write succeeded within {FOLLOW_WITHIN:g} s"
        # A stretch of writes on the promoted primary, counted, not timed.
        settled = acked()
        until_sync(lambda: acked() >= settled + 10, "10 more writes after the failover")
    finally:
        stop.set()
        writer.join(timeout=30)

    try:
        # No write refused once running: the ones the failover caught were retried on
        # the new primary. Only the token check may refuse, before anything runs (503).
        with writes.lock:
            refused = list(writes.refused)
            acked = [node_id for _, node_id in writes.acked]
        assert all(r == (503, "DATABASE_UNAVAILABLE") for r in refused), refused
        assert unavailable_retries(service) >= 1

        # The standby was synchronous: every acknowledged write is on the new primary.
        stored = set(pair.standby.sql("SELECT id FROM nodes WHERE id LIKE 'fo-%'").split())
        missing = sorted(set(acked) - stored)
        assert not missing, f"acknowledged but lost: {missing}"

        # After the failover: the sweep still runs (a silent node goes
        # UNREACHABLE), and the subscription opened before it sees that.
        registered = gql(service.url, REGISTER, {"input": node_input("fo-watched")})
        assert not registered.get("errors"), registered
        seen: list[str] = []
        until = time.monotonic() + 20
        while "unreachable" not in seen and time.monotonic() < until:
            message = json.loads(socket.recv(timeout=max(0.1, until - time.monotonic())))
            if message["type"] == "next":
                seen.append(message["payload"]["data"]["events"]["kind"])
            elif message["type"] == "ping":
                socket.send(json.dumps({"type": "pong"}))
            else:
                raise AssertionError(f"subscription ended: {message}")
        assert "unreachable" in seen, seen
        state = gql(service.url, '{ node(id: "fo-watched") { state } }')
        assert state["data"]["node"]["state"] == "UNREACHABLE", state

        print(
            f"\nfailover: primary stopped, standby promoted in {promoted - died:.2f} s; "
            f"first successful write {first_after - died:.2f} s after the primary stopped; "
            f"{len(acked)} writes acknowledged, {len(refused)} refused at the token check ({unavailable_retries(service):g} "
            "retried), 0 lost"
        )
    finally:
        socket.close()
        service.stop()


async def test_a_silent_first_host_costs_its_own_timeout_and_the_next_host_is_tried(
    pair: StandbyPair,
) -> None:
    """A dead machine does not refuse, it stays silent: asyncpg alone spent the
    whole timeout on it and never tried the primary behind it."""
    import asyncio

    from service.database import database_url

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accept, then say nothing until the client gives up

    silent = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    silent_port = silent.sockets[0].getsockname()[1]
    url = (
        f"postgresql://postgres@127.0.0.1:{silent_port},127.0.0.1:{pair.standby.port},"
        f"127.0.0.1:{pair.primary.port}/postgres?target_session_attrs=read-write"
    )
    try:
        started = asyncio.get_running_loop().time()
        conn = await database_url.connect(url, timeout=1)
        took = asyncio.get_running_loop().time() - started
        try:
            # Past the silent host and the (read-only) standby, on the primary.
            assert await conn.fetchval("SELECT pg_is_in_recovery()") is False
            assert await conn.fetchval("SELECT current_setting('port')") == str(pair.primary.port)
        finally:
            await conn.close()
        assert 0.9 < took < 5, took
    finally:
        silent.close()
