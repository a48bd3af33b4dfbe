"""The event log: every state change, allocation and release, with who and why.

Written in the same transaction as the change it describes, so an event exists
exactly when the change committed. Once it commits, its id is announced with
NOTIFY to every service process listening (service/event_log/event_announcements.py),
which is how a subscriber on one process sees a change made through another.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.connections import Connection, cached_text
from service.database.transactions import watch_transactions
from service.event_log.event_announcements import EVENTS_CHANNEL as EVENTS_CHANNEL
from service.event_log.event_announcements import announce

# Every kind of event the service writes: a closed set, so a client filtering
# on a misspelt kind ("cordonned") is told so instead of silently getting
# nothing. Add a kind here before writing it (record_event refuses others; the
# kinds written in SQL by service/fleet/node_writes.py and
# service/scheduling/allocations/ are checked by
# tests/api/test_request_errors.py against the rows they leave behind).
EVENT_KINDS: frozenset[str] = frozenset(
    {
        "registered",
        "report_changed",
        "back",
        "cordoned",
        "drained",
        "uncordoned",
        "removed",
        "unreachable",
        "lost",
        "allocated",
        "released",
        "gpu_cordoned",
        "gpu_uncordoned",
        "gpu_xid",
        "gpu_health_cleared",
        "gpu_failed_under_allocation",
        # service/fleet/fencing.py
        "replica_held_while_lost",
        "replica_reconciled",
        "replica_freed_after_loss",
        "future_incarnation",
        # service/scheduling/placement/preemption.py: a replica stopped to make room
        "replica_preempted",
        "weights_lost_under_replica",
        # service/fleet/health/
        "gpu_tainted",
        "gpu_untainted",
        "node_tainted",
        "node_untainted",
        "replica_must_move",
        "remediation_created",
        "remediation_joined",
        "remediation_started",
        "remediation_finished",
        "remediation_done",
        "remediation_escalated",
        "validation_recorded",
        "drift_found",
        "drift_cleared",
        "hardware_profile_set",
        "hardware_profile_removed",
        # service/restores.py
        "restored",
        # service/fleet/maintenance/: one per transition of a window, and one
        # per disruption budget a window's start breaks.
        "maintenance_draining",
        "maintenance_started",
        "maintenance_done",
        "maintenance_cancelled",
        "maintenance_budget_broken",
        # service/scheduling/reservations/
        "reservation_created",
        "reservation_active",
        "reservation_degraded",
        "reservation_ended",
    }
)


def unknown_kinds(kinds: Sequence[str]) -> list[str]:
    """The kinds of `kinds` the service never writes, in the order given."""
    return [kind for kind in kinds if kind not in EVENT_KINDS]


_RECORD = text(
    """
    INSERT INTO events (kind, node_id, replica_id, shard_id, actor, reason, detail)
    VALUES (:kind, :node_id, :replica_id, :shard_id, :actor, :reason, CAST(:detail AS jsonb))
    RETURNING id
    """
)


# Ids of the events the running transaction wrote, announced once it commits
# (service/event_log/event_announcements.py); unset outside service.database.transactions.
_recorded: ContextVar[list[int] | None] = ContextVar("recorded_event_ids", default=None)


def note_recorded(ids: Sequence[int]) -> None:
    """Remember events this transaction wrote, for announcing once it commits."""
    pending = _recorded.get()
    if pending is not None:
        pending.extend(ids)


@contextlib.contextmanager
def collecting_recorded() -> Iterator[list[int]]:
    """The ids of the events recorded by the transaction run inside this block."""
    ids: list[int] = []
    token = _recorded.set(ids)
    try:
        yield ids
    finally:
        _recorded.reset(token)


@contextlib.contextmanager
def _announced_after_commit(engine: AsyncEngine) -> Iterator[Callable[[], None]]:
    """Collect the events an in_transaction attempt records; announce them when it has committed."""
    with collecting_recorded() as recorded:
        yield lambda: announce(engine, recorded)


# Every transaction of service/database/transactions.py's in_transaction
# announces the events it recorded, once committed: the database layer runs
# the watcher without knowing of events.
watch_transactions(_announced_after_commit)


async def record_event(
    conn: Connection,
    kind: str,
    *,
    node_id: str | None = None,
    replica_id: str | None = None,
    shard_id: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    if kind not in EVENT_KINDS:
        raise ValueError(f"event kind {kind!r} is not in EVENT_KINDS")
    result = await conn.execute(
        _RECORD,
        {
            "kind": kind,
            "node_id": node_id,
            "replica_id": replica_id,
            "shard_id": shard_id,
            "actor": actor,
            "reason": reason,
            "detail": json.dumps(detail or {}),
        },
    )
    note_recorded([result.scalar_one()])


@dataclass(frozen=True)
class EventRecord:
    id: int
    at: datetime
    kind: str
    node_id: str | None
    replica_id: str | None
    shard_id: str | None
    actor: str | None
    reason: str | None
    detail: dict[str, Any]


@dataclass(frozen=True)
class EventFilter:
    node_id: str | None = None
    replica_id: str | None = None
    kinds: tuple[str, ...] | None = None

    def matches(self, event: EventRecord) -> bool:
        """The same test list_events applies in SQL, for events arriving live."""
        return (
            (self.node_id is None or event.node_id == self.node_id)
            and (self.replica_id is None or event.replica_id == self.replica_id)
            and (self.kinds is None or event.kind in self.kinds)
        )


_EVENT_COLUMNS = (
    "e.id, e.at, e.kind, e.node_id, e.replica_id, e.shard_id, e.actor, e.reason, e.detail"
)


def event_from_row(row: Row[Any]) -> EventRecord:
    detail = row.detail
    if isinstance(detail, str):
        detail = json.loads(detail)
    return EventRecord(
        id=row.id,
        at=row.at,
        kind=row.kind,
        node_id=row.node_id,
        replica_id=row.replica_id,
        shard_id=row.shard_id,
        actor=row.actor,
        reason=row.reason,
        detail=dict(detail or {}),
    )


async def list_events(
    conn: Connection,
    event_filter: EventFilter,
    *,
    first: int,
    after: int | None = None,
    since: datetime | None = None,
    retention: float | None = None,
) -> list[EventRecord]:
    """A page of events, oldest first; `after` is the last id of the previous page.

    Ordered by id rather than time: ids order events across service processes
    the way they were written, and paging by id never skips or repeats one.
    Events older than the retention are hidden even before the sweep prunes
    them, so what a caller sees does not depend on when the sweep last ran.
    """
    where: list[str] = []
    params: dict[str, Any] = {"first": first}
    if event_filter.node_id is not None:
        where.append("e.node_id = :node_id")
        params["node_id"] = event_filter.node_id
    if event_filter.replica_id is not None:
        where.append("e.replica_id = :replica_id")
        params["replica_id"] = event_filter.replica_id
    if event_filter.kinds is not None:
        where.append("e.kind = ANY(CAST(:kinds AS text[]))")
        params["kinds"] = list(event_filter.kinds)
    if after is not None:
        where.append("e.id > :after")
        params["after"] = after
    if since is not None:
        where.append("e.at >= :since")
        params["since"] = since
    if retention is not None:
        where.append("e.at >= now() - make_interval(secs => :retention)")
        params["retention"] = retention
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = await conn.execute(
        cached_text(f"SELECT {_EVENT_COLUMNS} FROM events e {clause} ORDER BY e.id LIMIT :first"),
        params,
    )
    return [event_from_row(r) for r in rows]


async def events_by_id(conn: Connection, ids: Sequence[int]) -> list[EventRecord]:
    rows = await conn.execute(
        text(
            f"SELECT {_EVENT_COLUMNS} FROM events e WHERE e.id = ANY(CAST(:ids AS bigint[]))"
            " ORDER BY e.id"
        ),
        {"ids": sorted(set(ids))},
    )
    return [event_from_row(r) for r in rows]


# Bounded so that a first prune after a long outage does not hold one huge
# transaction: the next sweep takes the next batch.
PRUNE_BATCH = 10_000

_PRUNE = text(
    """
    WITH old AS (
        SELECT id FROM events WHERE at < now() - make_interval(secs => :retention)
        ORDER BY id LIMIT :batch
    ), gone AS (
        DELETE FROM events e USING old WHERE e.id = old.id RETURNING 1
    )
    -- Counted in SQL: asyncpg reports no row count for a statement it fetches.
    SELECT count(*) FROM gone
    """
)


async def prune_events(conn: Connection, retention: float) -> int:
    """Forget events older than the retention (by the database's clock); how many went."""
    result = await conn.execute(_PRUNE, {"retention": retention, "batch": PRUNE_BATCH})
    return int(result.scalar_one())
