"""The liveness sweep: nodes that stop heartbeating become UNREACHABLE, then LOST.

At LOST every replica with a shard on the node is declared dead and released
whole, its shards on healthy nodes included: one dead shard makes the others
useless, and the control plane rebuilds the replica rather than a piece of it.

Every service process runs the sweep. It is safe to run concurrently because
each transition is a conditional UPDATE ... RETURNING on the node's liveness
(a second sweeper re-checks the condition after the first commits and finds
nothing to do) and each release is allocations.release_replica, a
DELETE ... RETURNING of the shards (a second DELETE of the same rows returns
nothing), so a node changes state once, a shard is released once, and each
event is written once. A transaction-level advisory lock on top lets one
sweeper work while the others skip the round, rather than queue on the same
rows.

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
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.connections import Connection
from service.database.db_faults import is_database_unavailable
from service.database.transactions import in_transaction
from service.event_log.events import prune_events, record_event
from service.fleet.fencing import hold_shards_on
from service.scheduling.allocations import forget_expired_tombstones, release_replica
from service.scheduling.gpu_pools import refresh_pools

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

# The sweep has been watching for at least `after` seconds (see run_sweeper).
# Kept apart from the last_seen comparison (a scan of nodes: last_seen is
# deliberately unindexed, see migration 0003).
_WATCHED = (
    "(CAST(:observing_since AS timestamptz) IS NULL"
    " OR CAST(:observing_since AS timestamptz) < now() - make_interval(secs => :after))"
)

# LOST first, so that a node silent for longer than lost_after (the sweep was
# not running, or the interval is long) goes straight to LOST in one sweep
# instead of stopping at UNREACHABLE for a round.
#
# Due nodes are locked in id order, as allocations lock them, so a sweep and
# an allocation touching the same nodes queue instead of deadlocking. The
# locking read re-checks its condition after waiting: a node whose heartbeat
# committed meanwhile is no longer due and is left alone.
_MARK_LOST = text(
    """
    WITH due AS (
        SELECT id FROM nodes
        WHERE liveness <> 'lost'
          AND last_seen < now() - make_interval(secs => :after)
          AND {WATCHED}
        ORDER BY id FOR NO KEY UPDATE
    )
    UPDATE nodes n SET liveness = 'lost', liveness_reason = :reason
    FROM due WHERE n.id = due.id
    RETURNING n.id
    """.replace("{WATCHED}", _WATCHED)
)

_MARK_UNREACHABLE = text(
    """
    WITH due AS (
        SELECT id FROM nodes
        WHERE liveness = 'alive'
          AND last_seen < now() - make_interval(secs => :after)
          AND {WATCHED}
        ORDER BY id FOR NO KEY UPDATE
    )
    UPDATE nodes n SET liveness = 'unreachable', liveness_reason = :reason
    FROM due WHERE n.id = due.id
    RETURNING n.id
    """.replace("{WATCHED}", _WATCHED)
)

# Whole replicas: every shard of every replica that has one on a lost node.
_DOOMED_REPLICAS = text(
    """
    SELECT replica_id,
           array_agg(shard_id ORDER BY shard_id) AS shard_ids,
           array_agg(DISTINCT node_id ORDER BY node_id) AS node_ids
    FROM shards
    WHERE replica_id IN (
        SELECT replica_id FROM shards WHERE node_id = ANY(CAST(:node_ids AS text[]))
    )
    GROUP BY replica_id ORDER BY replica_id
    """
)


def _seconds(value: float) -> str:
    return f"{value:g} s"


async def sweep(
    conn: Connection,
    unreachable_after: float,
    lost_after: float,
    event_retention: float | None = None,
    observing_since: datetime | None = None,
    lost_policy: str = "free",
) -> SweepResult:
    """One round of the sweep, inside the caller's transaction (never commits).

    Silence counts only from `observing_since` (None: from the last
    heartbeat): see run_sweeper. Returns swept=False when another process
    holds the sweep lock: it is doing this round, and this one has nothing
    to add.
    """
    if not (await conn.execute(_TRY_LOCK, {"key": SWEEP_LOCK_KEY})).scalar_one():
        return SweepResult(swept=False)

    lost_reason = f"no heartbeat for more than {_seconds(lost_after)}"
    lost = [
        r.id
        for r in await conn.execute(
            _MARK_LOST,
            {"after": lost_after, "reason": lost_reason, "observing_since": observing_since},
        )
    ]
    unreachable_reason = f"no heartbeat for more than {_seconds(unreachable_after)}"
    unreachable = [
        r.id
        for r in await conn.execute(
            _MARK_UNREACHABLE,
            {
                "after": unreachable_after,
                "reason": unreachable_reason,
                "observing_since": observing_since,
            },
        )
    ]

    await refresh_pools(conn, sorted(set(lost) | set(unreachable)))

    for node_id in sorted(unreachable):
        await record_event(
            conn, "unreachable", node_id=node_id, actor=ACTOR, reason=unreachable_reason
        )
    for node_id in sorted(lost):
        await record_event(conn, "lost", node_id=node_id, actor=ACTOR, reason=lost_reason)
    # After the "lost" events, so a node's history reads in causal order. The
    # released replicas' nodes are refreshed by release_replica. Under the
    # hold policy nothing is released: the lost nodes' shards keep their GPUs
    # until the node confirms them or an operator frees them
    # (service/fleet/fencing.py).
    released: list[ReleasedReplica] = []
    if lost and lost_policy == "hold":
        await hold_shards_on(conn, lost, ACTOR)
    elif lost:
        released = await release_replicas_on(conn, lost)

    pruned = await prune_events(conn, event_retention) if event_retention is not None else 0
    await forget_expired_tombstones(conn)
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


async def release_replicas_on(conn: Connection, node_ids: Sequence[str]) -> list[ReleasedReplica]:
    """Release every replica with a shard on one of these (lost) nodes, all its shards.

    Through allocations.release_replica, the same path a scheduler's
    releaseReplica takes: it locks the replica's nodes in id order before
    deleting, writes one "released" event per shard (each on its own node,
    so a healthy node's history shows what left it), and refreshes their
    pools. Its DELETE ... RETURNING reports only rows it removed, so a
    replica some other transaction already released frees nothing here and
    writes no event.
    """
    lost = sorted(set(node_ids))
    released: list[ReleasedReplica] = []
    for row in list(await conn.execute(_DOOMED_REPLICAS, {"node_ids": lost})):
        cause = sorted(set(lost).intersection(row.node_ids))
        reason = (
            f"node {', '.join(cause)} lost: its replica {row.replica_id} is released whole, "
            "shards on healthy nodes included"
        )
        if await release_replica(conn, row.replica_id, actor=ACTOR, reason=reason, after_loss=True):
            released.append(
                ReleasedReplica(row.replica_id, tuple(row.shard_ids), tuple(row.node_ids))
            )
    return released


async def run_sweeper(
    engine: AsyncEngine,
    *,
    unreachable_after: float,
    lost_after: float,
    interval: float,
    event_retention: float | None = None,
    lost_policy: str = "free",
) -> None:
    """Sweep every `interval` seconds until cancelled; a failed round is logged and retried.

    Silence is counted only over time this process was watching: from its
    first successful sweep, and again from the first one after the database
    was unreachable or the process stalled. Heartbeats cannot land while the
    service or its database is down, so without this a service restarted
    after a ten-minute outage would find every node silent for ten minutes
    and release every replica in the cluster. Another process that stayed up
    meanwhile still sweeps with its own, longer window.
    """
    watch = Watch(stall=max(unreachable_after, 3 * interval))
    while True:
        try:

            async def work(conn: Connection) -> datetime:
                now: datetime = (await conn.execute(_NOW)).scalar_one()
                await sweep(
                    conn,
                    unreachable_after,
                    lost_after,
                    event_retention,
                    observing_since=watch.since(now),
                    lost_policy=lost_policy,
                )
                return now

            watch.succeeded(await in_transaction(engine, work))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            watch.failed()
            if is_database_unavailable(error):
                # A restart or failover: expected, one line (no traceback).
                log.warning(
                    "liveness sweep: database unavailable (%s); retrying in %s",
                    str(error).splitlines()[0] if str(error) else type(error).__name__,
                    _seconds(interval),
                )
            else:
                log.exception("liveness sweep failed; retrying in %s", _seconds(interval))
        await asyncio.sleep(interval)


_NOW = text("SELECT now()")


class Watch:
    """Since when this process has been watching without a gap, by the database's clock."""

    def __init__(self, stall: float) -> None:
        self._stall = stall
        self._since: datetime | None = None
        self._last: datetime | None = None

    def since(self, now: datetime) -> datetime:
        gap = None if self._last is None else (now - self._last).total_seconds()
        if self._since is None or gap is None or gap > self._stall:
            return now
        return self._since

    def succeeded(self, now: datetime) -> None:
        started = self.since(now)
        if started != self._since:
            log.info("liveness sweep counts silence from %s", started.isoformat())
        self._since, self._last = started, now

    def failed(self) -> None:
        # The next success starts a new window: heartbeats could not be
        # recorded while the database was out of reach.
        self._since = None
