"""Maintenance windows as an operator books and reads them: scheduleMaintenance, the listing, one window.

A window names nodes and a half-open time [start, end), and how long before
its start the nodes' replicas are asked to move (drainLead). Booking checks
everything before writing anything: an unknown node or one listed twice, an
end at or before the start, a start too far in the past, a window longer than
MAX_MAINTENANCE_SECONDS, a negative or too long drainLead (BAD_INPUT naming the
field), a window overlapping another open one on the same node (CONFLICT,
naming the node and the other window). The overlap check runs with the nodes'
rows locked (in id order, as every writer of a node locks them), so two
bookings of one node cannot both pass it: the second waits for the first to
commit and then sees its window. A booking re-sent with the same id and spec
answers what is stored; with the same id and another spec, CONFLICT.

What happens on time is transitions.py's; cancelling is there too, beside
the transitions it undoes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text

from service.bounds import (
    MAX_DRAIN_LEAD_SECONDS,
    MAX_ID_LENGTH,
    MAX_MAINTENANCE_NODES,
    MAX_MAINTENANCE_SECONDS,
    MAX_MAINTENANCE_START_PAST_SECONDS,
)
from service.database.connections import Connection
from service.errors import InvalidInput, InventoryError, TooManyEntries, shown
from service.fleet.gpu_changes import check_reason
from service.scheduling.maintenance_rule import OPEN_STATES_SQL, MaintenanceState
from service.stored_text import id_problem


@dataclass(frozen=True)
class MaintenanceSpec:
    """A window as an operator asks for it."""

    id: str
    node_ids: tuple[str, ...]
    start: datetime
    end: datetime
    reason: str
    # Seconds before start.
    drain_lead: int = 3600


@dataclass(frozen=True)
class WindowRecord:
    id: str
    node_ids: tuple[str, ...]
    start: datetime
    end: datetime
    reason: str
    drain_lead: int
    state: MaintenanceState
    # Replicas with a shard on the window's nodes, while it is open (0 once done or cancelled).
    replicas_left: int

    def same_spec(self, spec: MaintenanceSpec) -> bool:
        return (
            sorted(self.node_ids) == sorted(spec.node_ids)
            and self.start == spec.start
            and self.end == spec.end
            and self.reason == spec.reason
            and self.drain_lead == spec.drain_lead
        )


class MaintenanceConflict(InventoryError):
    """A booking that collides with what is stored: nothing written."""

    code = "CONFLICT"

    def __init__(self, field: str, value: object, message: str, **more: object) -> None:
        super().__init__(message)
        self.field, self.value, self.more = field, value, more

    @property
    def extensions(self) -> dict[str, object]:
        return {"code": self.code, "field": self.field, "value": self.value, **self.more}


def checked(spec: MaintenanceSpec, now: datetime) -> MaintenanceSpec:
    """The spec with its reason trimmed, or BAD_INPUT naming the field; reads no table."""
    if not spec.id or id_problem(spec.id) is not None:
        raise InvalidInput("id", spec.id, f"a window id is 1 to {MAX_ID_LENGTH} characters")
    if not spec.node_ids:
        raise InvalidInput("nodeIds", [], "name at least one node")
    if len(spec.node_ids) > MAX_MAINTENANCE_NODES:
        raise TooManyEntries("nodeIds", len(spec.node_ids), MAX_MAINTENANCE_NODES)
    seen: set[str] = set()
    for i, node_id in enumerate(spec.node_ids):
        if node_id in seen:
            raise InvalidInput(f"nodeIds[{i}]", node_id, "listed twice")
        seen.add(node_id)
    if spec.end <= spec.start:
        raise InvalidInput(
            "end", spec.end.isoformat(), f"at or before start {spec.start.isoformat()}"
        )
    if spec.start < now - timedelta(seconds=MAX_MAINTENANCE_START_PAST_SECONDS):
        raise InvalidInput(
            "start",
            spec.start.isoformat(),
            f"more than {MAX_MAINTENANCE_START_PAST_SECONDS} s in the past",
        )
    if spec.end - spec.start > timedelta(seconds=MAX_MAINTENANCE_SECONDS):
        raise InvalidInput(
            "end",
            spec.end.isoformat(),
            f"the window is longer than {MAX_MAINTENANCE_SECONDS} s (MAX_MAINTENANCE_SECONDS)",
        )
    if not 0 <= spec.drain_lead <= MAX_DRAIN_LEAD_SECONDS:
        raise InvalidInput(
            "drainLead", spec.drain_lead, f"seconds from 0 to {MAX_DRAIN_LEAD_SECONDS}"
        )
    try:
        reason = check_reason(spec.reason)
    except InvalidInput as error:
        raise InvalidInput("reason", spec.reason, error.message) from None
    return MaintenanceSpec(spec.id, spec.node_ids, spec.start, spec.end, reason, spec.drain_lead)


_NOW = text("SELECT now()")
# The windows' nodes, locked in id order (as every writer of a node locks
# them): what serializes two bookings of one node.
_LOCK_NODES = text(
    "SELECT id FROM nodes WHERE id = ANY(CAST(:ids AS text[])) ORDER BY id FOR NO KEY UPDATE"
)
# An open window on one of the nodes whose [start, end) meets the new one's.
_OVERLAP = text(
    f"""
    SELECT mn.node_id, w.id, w.start_at, w.end_at
    FROM maintenance_nodes mn JOIN maintenance_windows w ON w.id = mn.window_id
    WHERE mn.node_id = ANY(CAST(:ids AS text[])) AND w.state IN {OPEN_STATES_SQL}
      AND w.start_at < :end AND :start < w.end_at AND w.id <> :id
    ORDER BY mn.node_id, w.start_at LIMIT 1
    """
)
_INSERT = text(
    """
    WITH w AS (
        INSERT INTO maintenance_windows (id, start_at, end_at, drain_lead, drain_at, reason, actor)
        VALUES (:id, :start, :end, :drain_lead,
                CAST(:start AS timestamptz) - make_interval(secs => CAST(:drain_lead AS int)),
                :reason, :actor)
        -- The same id booked by a request committing meanwhile (a client's
        -- retry racing its first try): waited for, then nothing written here.
        ON CONFLICT (id) DO NOTHING
        RETURNING id
    )
    INSERT INTO maintenance_nodes (window_id, node_id)
    SELECT w.id, n FROM w, unnest(CAST(:ids AS text[])) AS n
    RETURNING window_id
    """
)

# One window's columns and replicas_left: replicas with a shard on its nodes, while open.
_COLUMNS = f"""
    w.id, w.start_at, w.end_at, w.reason, w.drain_lead, w.state,
    ARRAY(SELECT mn.node_id FROM maintenance_nodes mn WHERE mn.window_id = w.id
          ORDER BY mn.node_id) AS node_ids,
    CASE WHEN w.state IN {OPEN_STATES_SQL} THEN (
        SELECT count(DISTINCT s.replica_id) FROM maintenance_nodes mn
        JOIN shards s ON s.node_id = mn.node_id WHERE mn.window_id = w.id) ELSE 0 END
        AS replicas_left
"""
_ONE = text(f"SELECT {_COLUMNS} FROM maintenance_windows w WHERE w.id = :id")
_LIST = text(
    f"""
    SELECT {_COLUMNS} FROM maintenance_windows w
    WHERE (CAST(:state AS text) IS NULL OR w.state = :state)
      AND (CAST(:after AS text) IS NULL OR w.id > :after)
    ORDER BY w.id LIMIT :first
    """
)


def _record(row: Any) -> WindowRecord:
    return WindowRecord(
        id=row.id,
        node_ids=tuple(row.node_ids),
        start=row.start_at,
        end=row.end_at,
        reason=row.reason,
        drain_lead=row.drain_lead,
        state=MaintenanceState(row.state),
        replicas_left=row.replicas_left,
    )


async def read_window(conn: Connection, window_id: str) -> WindowRecord | None:
    row = (await conn.execute(_ONE, {"id": window_id})).first()
    return None if row is None else _record(row)


async def list_windows(
    conn: Connection, *, state: MaintenanceState | None, first: int, after: str | None
) -> list[WindowRecord]:
    """A page of windows by id (of one state, when named)."""
    rows = await conn.execute(
        _LIST,
        {"state": None if state is None else state.value, "after": after, "first": first},
    )
    return [_record(r) for r in rows]


async def schedule(conn: Connection, spec: MaintenanceSpec, actor: str | None) -> WindowRecord:
    """Book a window (one transaction, the caller's); the stored one when re-sent with the same spec."""
    now: datetime = (await conn.execute(_NOW)).scalar_one()
    stored = await read_window(conn, spec.id)
    if stored is not None:
        # Compared before the checks: a re-sent booking whose start has since
        # passed is still the same booking.
        trimmed = MaintenanceSpec(
            spec.id, spec.node_ids, spec.start, spec.end, spec.reason.strip(), spec.drain_lead
        )
        if stored.same_spec(trimmed):
            return stored
        raise MaintenanceConflict(
            "id",
            spec.id,
            f"id={spec.id!r}: a window with this id is stored with another spec "
            f"({', '.join(stored.node_ids)} from {stored.start.isoformat()} to "
            f"{stored.end.isoformat()}, {stored.state.value})",
        )
    spec = checked(spec, now)
    ids = list(spec.node_ids)
    locked = {r.id for r in await conn.execute(_LOCK_NODES, {"ids": ids})}
    for i, node_id in enumerate(ids):
        if node_id not in locked:
            raise InvalidInput(f"nodeIds[{i}]", node_id, "no such node")
    params = {
        "id": spec.id,
        "ids": ids,
        "start": spec.start,
        "end": spec.end,
        "drain_lead": spec.drain_lead,
        "reason": spec.reason,
        "actor": actor,
    }
    clash = (await conn.execute(_OVERLAP, params)).first()
    if clash is not None:
        raise MaintenanceConflict(
            "nodeIds",
            clash.node_id,
            f"node {shown(clash.node_id)} is already in maintenance window {clash.id!r} from "
            f"{clash.start_at.isoformat()} to {clash.end_at.isoformat()}, which this one overlaps",
            window=clash.id,
        )
    if not list(await conn.execute(_INSERT, params)):
        # Booked by a concurrent request under the same id: answered as a re-send.
        return await schedule(conn, spec, actor)
    stored = await read_window(conn, spec.id)
    assert stored is not None
    return stored


def node_list(node_ids: Sequence[str]) -> str:
    """How an event or message lists a window's nodes."""
    return ", ".join(node_ids)
