"""The liveness sweep: nodes that stop heartbeating become UNREACHABLE, then LOST.

At LOST every replica with a shard on the node is declared dead and released
whole, its shards on healthy nodes included: one dead shard makes the others
useless, and the control plane rebuilds the replica rather than a piece of it.

Every service process runs the sweep. It is safe to run concurrently because
each transition is a conditional UPDATE ... RETURNING on the node's liveness
(a second sweeper re-checks the condition after the first commits and finds
nothing to do) and each release is a DELETE ... RETURNING of the shards (a
second DELETE of the same rows returns nothing), so a node changes state once,
a replica is released once, and each event is written once. A transaction-level
advisory lock on top lets one sweeper work while the others skip the round,
rather than queue on the same rows.

Times are compared with the database's clock: heartbeats are stamped with
now() by whichever process received them, and comparing against a process's
own clock would let a skewed host declare healthy nodes lost.

The operator's intent (admin_state: cordoned, draining) is never touched here:
a cordoned node that goes unreachable and comes back is still cordoned.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.events import prune_events, record_event
from service.gpu_pools import refresh_pools
from service.transactions import in_transaction

log = logging.getLogger(__name__)

ACTOR = "liveness-sweep"

# One sweeper at a time; the others skip the round instead of waiting.
SWEEP_LOCK_KEY = 0x6C6C6D68  # "llmh", next to the migration lock's "llmg"


@dataclass(frozen=True)
class ReleasedReplica:
    replica_id: str
    shard_ids: tuple[str, ...]
    node_ids: tuple[str, ...]


@dataclass(frozen=True)
class SweepResult:
    swept: bool = True
    unreachable: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    released: tuple[ReleasedReplica, ...] = field(default_factory=tuple)
    events_pruned: int = 0


_TRY_LOCK = text("SELECT pg_try_advisory_xact_lock(:key)")

# LOST first, so that a node silent for longer than lost_after (the sweep was
# not running, or the interval is long) goes straight to LOST in one sweep
# instead of stopping at UNREACHABLE for a round.
_MARK_LOST = text(
    """
    UPDATE nodes SET liveness = 'lost', liveness_reason = :reason
    WHERE liveness <> 'lost' AND last_seen < now() - make_interval(secs => :after)
    RETURNING id
    """
)

_MARK_UNREACHABLE = text(
    """
    UPDATE nodes SET liveness = 'unreachable', liveness_reason = :reason
    WHERE liveness = 'alive' AND last_seen < now() - make_interval(secs => :after)
    RETURNING id
    """
)

# Whole replicas: every shard of every replica that has one on a lost node.
# allocated_gpus rows go with their shards (ON DELETE CASCADE). Only rows this
# statement actually deleted come back, which is what makes a concurrent
# second release return nothing.
_RELEASE_REPLICAS_ON = text(
    """
    WITH doomed AS (
        SELECT DISTINCT replica_id FROM shards WHERE node_id = ANY(CAST(:node_ids AS text[]))
    ), gone AS (
        DELETE FROM shards s USING doomed d WHERE s.replica_id = d.replica_id
        RETURNING s.replica_id, s.shard_id, s.node_id
    )
    SELECT replica_id,
           array_agg(shard_id ORDER BY shard_id) AS shard_ids,
           array_agg(DISTINCT node_id ORDER BY node_id) AS node_ids
    FROM gone GROUP BY replica_id ORDER BY replica_id
    """
)


def _seconds(value: float) -> str:
    return f"{value:g} s"


async def sweep(
    conn: AsyncConnection,
    unreachable_after: float,
    lost_after: float,
    event_retention: float | None = None,
) -> SweepResult:
    """One round of the sweep, inside the caller's transaction (never commits).

    Returns swept=False when another process holds the sweep lock: it is
    doing this round, and this one has nothing to add.
    """
    if not (await conn.execute(_TRY_LOCK, {"key": SWEEP_LOCK_KEY})).scalar_one():
        return SweepResult(swept=False)

    lost_reason = f"no heartbeat for more than {_seconds(lost_after)}"
    lost = [
        r.id for r in await conn.execute(_MARK_LOST, {"after": lost_after, "reason": lost_reason})
    ]
    unreachable_reason = f"no heartbeat for more than {_seconds(unreachable_after)}"
    unreachable = [
        r.id
        for r in await conn.execute(
            _MARK_UNREACHABLE, {"after": unreachable_after, "reason": unreachable_reason}
        )
    ]

    released = await release_replicas_on(conn, lost) if lost else []

    touched = set(lost) | set(unreachable)
    for replica in released:
        touched.update(replica.node_ids)
    await refresh_pools(conn, sorted(touched))

    for node_id in sorted(unreachable):
        await record_event(
            conn, "unreachable", node_id=node_id, actor=ACTOR, reason=unreachable_reason
        )
    for node_id in sorted(lost):
        await record_event(conn, "lost", node_id=node_id, actor=ACTOR, reason=lost_reason)
    lost_set = set(lost)
    for replica in released:
        cause = sorted(lost_set.intersection(replica.node_ids))
        await record_event(
            conn,
            "released",
            node_id=cause[0] if cause else None,
            replica_id=replica.replica_id,
            actor=ACTOR,
            reason=f"node {', '.join(cause)} lost: the replica is released whole",
            detail={
                "shards": list(replica.shard_ids),
                "nodes": list(replica.node_ids),
                "lostNodes": cause,
            },
        )

    pruned = await prune_events(conn, event_retention) if event_retention is not None else 0
    if unreachable or lost:
        log.info(
            "liveness sweep",
            extra={
                "unreachable": sorted(unreachable),
                "lost": sorted(lost),
                "released": [r.replica_id for r in released],
            },
        )
    return SweepResult(
        unreachable=tuple(sorted(unreachable)),
        lost=tuple(sorted(lost)),
        released=tuple(released),
        events_pruned=pruned,
    )


async def release_replicas_on(
    conn: AsyncConnection, node_ids: Sequence[str]
) -> list[ReleasedReplica]:
    """Delete every shard of every replica that has a shard on one of these nodes."""
    rows = await conn.execute(_RELEASE_REPLICAS_ON, {"node_ids": sorted(set(node_ids))})
    return [ReleasedReplica(r.replica_id, tuple(r.shard_ids), tuple(r.node_ids)) for r in rows]


async def run_sweeper(
    engine: AsyncEngine,
    *,
    unreachable_after: float,
    lost_after: float,
    interval: float,
    event_retention: float | None = None,
) -> None:
    """Sweep every `interval` seconds until cancelled; a failed round is logged and retried.

    A database outage must not end the loop: the nodes that went silent
    meanwhile are still owed their transition when it comes back.
    """
    while True:
        try:

            async def work(conn: AsyncConnection) -> SweepResult:
                return await sweep(conn, unreachable_after, lost_after, event_retention)

            await in_transaction(engine, work)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("liveness sweep failed; retrying in %s", _seconds(interval))
        await asyncio.sleep(interval)
