"""The event log: every state change, allocation and release, with who and why.

Written in the same transaction as the change it describes, so an event exists
exactly when the change committed. The NOTIFY is delivered by PostgreSQL at
commit to every service process listening, which is how a subscriber on one
process sees a change made through another.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

EVENTS_CHANNEL = "inventory_events"

_RECORD = text(
    """
    WITH e AS (
        INSERT INTO events (kind, node_id, replica_id, shard_id, actor, reason, detail)
        VALUES (:kind, :node_id, :replica_id, :shard_id, :actor, :reason, CAST(:detail AS jsonb))
        RETURNING id
    )
    SELECT pg_notify(:channel, e.id::text) FROM e
    """
)


async def record_event(
    conn: AsyncConnection,
    kind: str,
    *,
    node_id: str | None = None,
    replica_id: str | None = None,
    shard_id: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    await conn.execute(
        _RECORD,
        {
            "kind": kind,
            "node_id": node_id,
            "replica_id": replica_id,
            "shard_id": shard_id,
            "actor": actor,
            "reason": reason,
            "detail": json.dumps(detail or {}),
            "channel": EVENTS_CHANNEL,
        },
    )
