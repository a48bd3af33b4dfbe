"""Listeners hear of an event only after the transaction that wrote it committed."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.connections import Connection
from service.database.transactions import in_transaction
from service.event_log.event_announcements import IDS_PER_NOTIFICATION, parse_payload
from service.event_log.events import EVENTS_CHANNEL, record_event


class Changed(Exception):
    """The writer changed its mind: the transaction rolls back."""


async def test_only_committed_events_are_announced(engine: AsyncEngine, database_url: str) -> None:
    heard: asyncio.Queue[list[int]] = asyncio.Queue()
    listener = await asyncpg.connect(database_url)
    await listener.add_listener(
        EVENTS_CHANNEL, lambda *args: heard.put_nowait(parse_payload(args[-1]))
    )
    try:

        async def rolled_back(conn: Connection) -> None:
            await record_event(conn, "cordoned", node_id="gpu-01")
            raise Changed

        with pytest.raises(Changed):
            await in_transaction(engine, rolled_back)

        async def committed(conn: Connection) -> list[int]:
            await record_event(conn, "cordoned", node_id="gpu-02")
            await record_event(conn, "drained", node_id="gpu-02")
            rows = await conn.execute(text("SELECT id FROM events ORDER BY id"))
            return [r[0] for r in rows]

        stored = await in_transaction(engine, committed)

        # Notifications arrive in the order they were sent: the first one
        # heard is the committed transaction's, with both of its events.
        assert await asyncio.wait_for(heard.get(), 10) == stored
        assert len(stored) == 2
    finally:
        await listener.close()


def test_a_payload_carries_many_ids_within_postgres_limit() -> None:
    ids = [10**19 + i for i in range(IDS_PER_NOTIFICATION)]
    payload = ",".join(map(str, ids))
    assert len(payload.encode()) < 8000
    assert parse_payload(payload) == ids
