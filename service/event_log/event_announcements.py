"""NOTIFY listeners of new events after the writing transaction commits, not inside it.

A NOTIFY inside a transaction makes PostgreSQL take one database-wide lock at
commit and hold it through the commit's WAL flush, so every writing
transaction that records an event commits one at a time, which caps
allocation and placement throughput at one flush per commit. Announcing after commit keeps
commits concurrent (group commit works again) and batches the ids of many
transactions into one notification per flush.

The cost: an event whose announcement is lost (the process dies between its
commit and the flush, or the database drops right then) is stored but not
pushed live; a listener that reconnects catches up on it, and `events(after:)`
always has it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from weakref import WeakKeyDictionary

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections

# The PostgreSQL channel new events are announced on (event_stream listens).
EVENTS_CHANNEL = "inventory_events"

log = logging.getLogger(__name__)

# PostgreSQL refuses payloads of 8000 bytes or more; ids are at most 20
# digits and a comma, so 300 of them always fit.
IDS_PER_NOTIFICATION = 300

_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


def parse_payload(payload: str) -> list[int]:
    return [int(part) for part in payload.split(",") if part]


class _Announcer:
    """One per engine: a single flush in flight, carrying every id that arrived meanwhile."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._pending: list[int] = []
        self._flush: asyncio.Task[None] | None = None

    def add(self, ids: Sequence[int]) -> None:
        self._pending.extend(ids)
        if self._flush is None or self._flush.done():
            self._flush = asyncio.get_running_loop().create_task(self._send())

    async def drain(self) -> None:
        while self._flush is not None and not self._flush.done():
            await asyncio.shield(self._flush)

    async def _send(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                # Autocommit: one round trip, no transaction to hold a lock in.
                async with connections.autocommit(self._engine) as conn:
                    for start in range(0, len(batch), IDS_PER_NOTIFICATION):
                        chunk = batch[start : start + IDS_PER_NOTIFICATION]
                        await conn.execute(
                            _NOTIFY,
                            {"channel": EVENTS_CHANNEL, "payload": ",".join(map(str, chunk))},
                        )
            except Exception as error:
                log.warning(
                    "could not announce %d events (stored, not pushed): %s", len(batch), error
                )


_announcers: WeakKeyDictionary[AsyncEngine, _Announcer] = WeakKeyDictionary()


def announce(engine: AsyncEngine, ids: Sequence[int]) -> None:
    """Queue a NOTIFY for committed events; returns at once."""
    if not ids:
        return
    announcer = _announcers.get(engine)
    if announcer is None:
        announcer = _announcers[engine] = _Announcer(engine)
    announcer.add(ids)


async def drain_announcements(engine: AsyncEngine) -> None:
    """Wait until queued announcements are sent (at shutdown, and in tests)."""
    announcer = _announcers.get(engine)
    if announcer is not None:
        await announcer.drain()
