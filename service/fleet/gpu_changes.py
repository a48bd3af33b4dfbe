"""A node's GPUs locked and read, and the events a change of them records.

The one way a writer of a node's GPU state (XIDs and sticky health,
cordons, taints, remediations: service/fleet/gpu_health.py,
service/fleet/gpu_cordons.py, service/fleet/health/) takes the node's row lock
and reads its GPUs, refreshes its pools and tells the holders of GPUs that
became unusable; and the check of an operator's reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import text

from service.bounds import MAX_TEXT_LENGTH
from service.database.connections import Connection
from service.errors import InvalidInput, NodeNotFound
from service.event_log.events import note_recorded, unknown_kinds
from service.scheduling.availability import gpu_usable
from service.scheduling.gpu_pools import refresh_pools
from service.scheduling.rejections import index_ranges, shown


def check_reason(reason: str) -> str:
    """An operator's reason, trimmed; BAD_INPUT when empty or too long."""
    cleaned = reason.strip()
    if not cleaned:
        raise InvalidInput("reason", reason, "say why, for the next operator to read")
    if len(cleaned) > MAX_TEXT_LENGTH:
        raise InvalidInput("reason", reason, f"longer than {MAX_TEXT_LENGTH} characters")
    return cleaned


@dataclass(frozen=True)
class _Gpu:
    idx: int
    uuid: str | None
    gpu_class: str
    usable: bool
    sticky: tuple[str, ...]
    shard_id: str | None
    replica_id: str | None


# A node's GPUs as this module and gpu_cordons need them, read under the
# node's row lock (taken first: every writer of a node's GPUs, allocations or
# pools takes it, so the pools this module refreshes cannot race).
_LOCK_NODE = text("SELECT id FROM nodes WHERE id = :node_id FOR NO KEY UPDATE")
_GPUS = text(
    f"""
    SELECT g.idx, g.uuid, g.gpu_class, {gpu_usable("g")} AS usable, g.sticky_reasons,
           a.shard_id, s.replica_id
    FROM gpus g
    LEFT JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx
    LEFT JOIN shards s ON s.shard_id = a.shard_id
    WHERE g.node_id = :node_id
    ORDER BY g.idx
    """
)


async def lock_gpus(conn: Connection, node_id: str) -> dict[int, _Gpu]:
    """Lock the node's row and read its GPUs; NodeNotFound when it is not registered."""
    if (await conn.execute(_LOCK_NODE, {"node_id": node_id})).one_or_none() is None:
        raise NodeNotFound(node_id)
    rows = await conn.execute(_GPUS, {"node_id": node_id})
    return {
        r.idx: _Gpu(
            r.idx, r.uuid, r.gpu_class, r.usable, tuple(r.sticky_reasons), r.shard_id, r.replica_id
        )
        for r in rows
    }


def gpu_of(gpus: Mapping[int, _Gpu], node_id: str, index: int) -> _Gpu:
    """The GPU at `index`, or a BAD_INPUT naming the index and the GPUs the node has."""
    gpu = gpus.get(index)
    if gpu is None:
        raise InvalidInput(
            "index",
            index,
            f"node {shown(node_id)} has no GPU {index}; its GPUs are {index_ranges(gpus)}",
        )
    return gpu


_RECORD_MANY = text(
    """
    INSERT INTO events (kind, node_id, replica_id, shard_id, actor, reason, detail)
    SELECT e.item ->> 'kind', CAST(:node_id AS text), e.item ->> 'replica_id',
           e.item ->> 'shard_id', CAST(:actor AS text), e.item ->> 'reason',
           coalesce(e.item -> 'detail', '{}')
    FROM jsonb_array_elements(CAST(:events AS jsonb)) WITH ORDINALITY AS e(item, ord)
    ORDER BY e.ord
    RETURNING id
    """
)


async def record_events(
    conn: Connection, node_id: str, actor: str | None, events: Sequence[Mapping[str, object]]
) -> None:
    """Several events of one node in one statement, in order (the rows record_event writes).

    The kinds are checked against the closed set as record_event checks them:
    a kind no reader can ask for would be an event nobody ever sees.
    """
    stray = unknown_kinds([str(e["kind"]) for e in events])
    if stray:
        raise ValueError(f"event kinds {stray!r} are not in EVENT_KINDS")
    if events:
        rows = await conn.execute(
            _RECORD_MANY, {"node_id": node_id, "actor": actor, "events": json.dumps(events)}
        )
        note_recorded(list(rows.scalars()))


def gpu_detail(gpu: _Gpu, **more: object) -> dict[str, object]:
    return {"index": gpu.idx, "uuid": gpu.uuid, **more}


async def after_change(
    conn: Connection,
    node_id: str,
    before: Mapping[int, _Gpu],
    why: Mapping[int, str],
    events: list[dict[str, object]],
) -> None:
    """Refresh the node's pools; tell the holders of GPUs that just became unusable.

    What runs on such a GPU keeps running (its allocation stays): the event
    gpu_failed_under_allocation names the shard and the replica, so a
    scheduler's subscription learns to move it.
    """
    await refresh_pools(conn, [node_id])
    after = await conn.execute(_GPUS, {"node_id": node_id})
    for row in after:
        old = before.get(row.idx)
        if old is None or not old.usable or row.usable or row.shard_id is None:
            continue
        events.append(
            {
                "kind": "gpu_failed_under_allocation",
                "replica_id": row.replica_id,
                "shard_id": row.shard_id,
                "reason": why.get(row.idx, "unusable"),
                "detail": gpu_detail(old),
            }
        )
