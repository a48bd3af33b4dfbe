"""Heartbeats arriving together are written together: one UPDATE per batch, not per node.

Thousands of agents beat every few seconds. One transaction per beat costs
four round trips and a commit each, which caps a service at a few thousand
beats a second; PostgreSQL updates a hundred rows in one statement at about
the cost of one. So each process keeps one batch open: a beat that arrives
while the previous batch is being written waits for the next one, and the
next one leaves as soon as the previous commits (no timer: an idle service
answers a lone beat at once, a busy one answers in batches).

Each beat's reply still waits for the commit of the batch that carries it,
an unknown node still gets NODE_NOT_FOUND, and a node coming back from
UNREACHABLE or LOST still gets its pools refreshed and its "back" event, in
the same transaction (node_writes.heartbeat_many). Beats of nodes that were alive,
nearly all of them, are one statement without BEGIN or COMMIT
(node_writes.heartbeat_alive).
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Awaitable, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from service.batches import Batches
from service.database import connections
from service.database.connections import NativeConnection
from service.database.transactions import in_transaction, retried
from service.errors import NodeNotFound
from service.fleet import node_writes
from service.fleet.node_reads import BeatRecord

log = logging.getLogger(__name__)

# Enough to amortize a commit; small enough that one batch's row locks are
# held for a millisecond or two, not long enough to stall an allocation.
MAX_BATCH = 500


class HeartbeatBatcher:
    """One process's open batch of heartbeats over one engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._batches: Batches[NativeConnection, str, BeatRecord] = Batches(
            lambda: connections.autocommit(engine), self._write, NodeNotFound, MAX_BATCH
        )

    def beat(self, node_id: str) -> Awaitable[BeatRecord]:
        """Record the beat; returns the node's id and state as committed, or raises NodeNotFound."""
        return self._batches.ask(node_id)

    async def _write(self, conn: NativeConnection, batch: Sequence[str]) -> dict[str, BeatRecord]:
        # One statement outside a transaction block: PostgreSQL makes it a
        # transaction of its own, as atomic as in_transaction without the
        # BEGIN and COMMIT round trips. It records no events (nothing here announces any).
        found = await node_writes.heartbeat_alive(conn, batch)
        # Unknown nodes and nodes coming back: their pools and "back" events
        # in one transaction with their beat.
        rest = [node_id for node_id in batch if node_id not in found]
        if rest:
            found |= await in_transaction(
                self._engine,
                functools.partial(node_writes.heartbeat_many, node_ids=rest),
                idempotent=True,
            )
        return found


_batchers: weakref.WeakKeyDictionary[AsyncEngine, HeartbeatBatcher] = weakref.WeakKeyDictionary()


# A process has one engine: its batcher found without the weak dictionary's
# lookup (a weak reference made and AsyncEngine's Python-level __eq__ per beat).
_last: tuple[weakref.ref[AsyncEngine], HeartbeatBatcher] | None = None


async def beat(engine: AsyncEngine, node_id: str) -> BeatRecord:
    """The node's heartbeat through this process's batch for `engine`.

    A batch that failed because the database was away is not the beat's
    answer while the write's retry budget lasts: a beat is idempotent, so it
    joins a later batch (transactions.retried). The batch's future is awaited
    here directly, one coroutine level in all (service/batches.py says why
    each level counts).
    """
    batcher = _batcher(engine)
    try:
        return await batcher.beat(node_id)
    except NodeNotFound:
        raise
    except Exception:
        return await retried(lambda: batcher.beat(node_id), engine)


def _batcher(engine: AsyncEngine) -> HeartbeatBatcher:
    global _last
    if _last is not None and _last[0]() is engine:
        return _last[1]
    batcher = _batchers.get(engine)
    if batcher is None:
        batcher = _batchers[engine] = HeartbeatBatcher(engine)
    _last = (weakref.ref(engine), batcher)
    return batcher
