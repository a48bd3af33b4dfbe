"""Connections to a primary that stopped being one: dropped at once, and the writes they carried made again.

Stories on real servers (the loopback pair of tests/support/pg_cluster.py, or the
session's database):

- after a switchover behind a balancer (tests/support/forwarder.py) that still sends
  new connections to the demoted primary, every connection that answers
  "read-only transaction" is closed, in both pools, so once the balancer
  catches up the next write lands on the new primary (a connection kept
  would have answered "read-only" for as long as it lived);
- a session terminated before COMMIT wrote nothing: its write is made again,
  once, on a new connection;
- a session terminated during COMMIT (waiting for a synchronous standby) may
  have committed: a write that is not idempotent is answered
  DATABASE_UNAVAILABLE saying the outcome is unknown (and it was in fact
  committed), an idempotent one is made again and answers what is stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.database import connections, transactions
from service.database.connections import NativeConnection
from service.database.db import create_engine, dispose, libpq_url
from service.database.db_faults import DatabaseUnavailable
from service.database.migrations import upgrade
from service.database.transactions import in_transaction
from service.web.app import create_app
from tests.support.forwarder import Forwarder
from tests.support.pg_cluster import StandbyPair, running_pair
from tests.support.reports import REGISTER, node_input
from tests.support.waiting import until

pytestmark = [pytest.mark.serial, pytest.mark.process]


@pytest.fixture
def pair() -> Iterator[StandbyPair]:
    with running_pair() as cluster:
        upgrade(cluster.url)
        yield cluster


@pytest.fixture
async def forwarder(pair: StandbyPair) -> AsyncIterator[Forwarder]:
    balancer = Forwarder(pair.primary.port)
    await balancer.start()
    try:
        yield balancer
    finally:
        await balancer.stop()


def register(node_id: str) -> dict[str, Any]:
    return {"query": REGISTER, "variables": {"input": node_input(node_id)}}


def code_of(body: dict[str, Any]) -> str | None:
    errors = body.get("errors") or [{}]
    code: str | None = (errors[0].get("extensions") or {}).get("code")
    return code


async def test_connections_to_a_demoted_primary_are_dropped_in_both_pools(
    pair: StandbyPair, forwarder: Forwarder
) -> None:
    # No retries: each write's own fate is seen.
    settings = Settings(db_timeout=2, write_retry=0)
    engine = create_engine(f"postgresql://postgres@127.0.0.1:{forwarder.port}/postgres", settings)
    app = create_app(settings, engine=engine, sweep=False)
    insert = text("INSERT INTO events (kind) VALUES ('through-sqlalchemy')")
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://inventory"
        ) as client:
            # A few pooled connections, every one to the primary.
            answers = await asyncio.gather(
                *(client.post("/graphql", json=register(f"before-{i}")) for i in range(6))
            )
            assert all(not a.json().get("errors") for a in answers), [a.text for a in answers]
            async with engine.begin() as conn:
                await conn.execute(insert)

            # A switchover; the balancer still sends new connections to the old
            # primary, now a standby.
            await asyncio.to_thread(pair.switch_over)
            dropped = dict(connections.DROPPED.by_reason)
            refused = []
            for i in range(4):
                answer = await client.post("/graphql", json=register(f"during-{i}"))
                refused.append(answer)
                assert code_of(answer.json()) == "DATABASE_UNAVAILABLE", answer.text
                assert answer.headers.get("retry-after") == "1", answer.headers
            # Every connection that said "read-only" was dropped, none kept for later.
            read_only = connections.DROPPED.by_reason.get("read_only", 0) - dropped.get(
                "read_only", 0
            )
            assert read_only == len(refused), connections.DROPPED.by_reason
            # SQLAlchemy's pool: its connection from before died with the old
            # primary's stop; the next one reaches the standby.
            said = []
            while not said or "read-only" not in said[-1]:
                assert len(said) < 3, said
                with pytest.raises(DBAPIError) as failed:
                    async with engine.begin() as conn:
                        await conn.execute(insert)
                said.append(str(failed.value))

            # The balancer catches up: the very next writes are on the new primary.
            forwarder.point_at(pair.primary.port)
            for i in range(4):
                answer = await client.post("/graphql", json=register(f"after-{i}"))
                assert not answer.json().get("errors"), answer.text
            async with engine.begin() as conn:
                await conn.execute(insert)
    finally:
        await dispose(engine)
    stored = pair.primary.sql("SELECT string_agg(id, ',' ORDER BY id) FROM nodes").split(",")
    assert [n for n in stored if n.startswith("after-")] == [f"after-{i}" for i in range(4)]
    assert not [n for n in stored if n.startswith("during-")]
    assert pair.primary.sql("SELECT count(*) FROM events WHERE kind = 'through-sqlalchemy'") == "2"


async def test_a_write_whose_session_ends_before_commit_is_made_again_once(
    database_url: str, engine: AsyncEngine
) -> None:
    own = create_engine(database_url, Settings(write_retry=10))
    sessions: list[int] = []

    async def work(conn: NativeConnection) -> int:
        pid: int = await conn.scalar(text("SELECT pg_backend_pid()"))
        sessions.append(pid)
        await conn.execute(text("INSERT INTO events (kind) VALUES ('made-once')"))
        if len(sessions) == 1:
            # Another session ends this one in the middle of its transaction.
            killer = await asyncpg.connect(libpq_url(database_url))
            try:
                assert await killer.fetchval("SELECT pg_terminate_backend($1, 10000)", pid)
            finally:
                await killer.close()
            await conn.execute(text("SELECT 1"))
        return pid

    retried = dict(transactions.RETRIES.retried)
    try:
        last = await in_transaction(own, work)
    finally:
        await dispose(own)
    assert len(sessions) == 2 and last == sessions[1] != sessions[0]
    assert transactions.RETRIES.retried["unavailable"] == retried.get("unavailable", 0) + 1
    async with engine.connect() as conn:
        made = await conn.scalar(text("SELECT count(*) FROM events WHERE kind = 'made-once'"))
    assert made == 1


async def _waiting_for_the_standby(pair: StandbyPair) -> int:
    """The pid of the session whose COMMIT waits for the (stopped) synchronous standby."""

    async def waiting() -> str:
        return pair.primary.sql("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'")

    return int(await until(waiting, "a COMMIT waiting for the synchronous standby"))


async def test_a_commit_cut_off_in_flight_is_unknown_and_retried_only_when_idempotent(
    pair: StandbyPair,
) -> None:
    settings = Settings(db_timeout=2, write_retry=30)
    engine = create_engine(pair.url, settings)
    # Every COMMIT now waits for the synchronous standby, which is gone.
    await asyncio.to_thread(pair.standby.stop, "fast")
    try:

        async def once(conn: NativeConnection) -> None:
            await conn.execute(text("INSERT INTO events (kind) VALUES ('in-doubt')"))

        write = asyncio.create_task(in_transaction(engine, once))
        pair.primary.sql(
            f"SELECT pg_terminate_backend({await _waiting_for_the_standby(pair)}, 10000)"
        )
        with pytest.raises(DatabaseUnavailable) as refused:
            await write
        assert refused.value.outcome_unknown
        assert refused.value.extensions == {"code": "DATABASE_UNAVAILABLE", "outcome": "unknown"}
        # Not "without effect": PostgreSQL had committed it locally.
        assert pair.primary.sql("SELECT count(*) FROM events WHERE kind = 'in-doubt'") == "1"

        # A report is idempotent: cut off the same way, it is made again.
        app = create_app(settings, engine=engine, sweep=False)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://inventory"
        ) as client:
            report = asyncio.create_task(client.post("/graphql", json=register("in-doubt-node")))
            pair.primary.sql(
                f"SELECT pg_terminate_backend({await _waiting_for_the_standby(pair)}, 10000)"
            )
            await asyncio.to_thread(pair.standby.start)
            answer = await report
        assert not answer.json().get("errors"), answer.text
        assert answer.json()["data"]["registerNode"]["id"] == "in-doubt-node"
    finally:
        await dispose(engine)
    assert pair.primary.sql("SELECT count(*) FROM nodes WHERE id = 'in-doubt-node'") == "1"
