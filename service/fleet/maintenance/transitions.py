"""A maintenance window's transitions on time, once, whichever service process is up; and cancelling one.

SCHEDULED -> DRAINING at start - drainLead: the nodes get a
PREFER_NO_SCHEDULE taint of source MAINTENANCE (key "maintenance", value the
window's id), and their replicas are asked to move in waves (waves.py).
DRAINING -> IN_PROGRESS at start: the taint becomes NO_SCHEDULE, and each
replica still on the nodes is released whole, its engines told to stop
(shardsToStop, StopReason MAINTENANCE); a deployment this takes below its
disruption budget gets an event maintenance_budget_broken naming the budget.
IN_PROGRESS -> DONE at end: the window's taint is lifted (other taints stay).
Each transition writes its event (maintenance_draining, _started, _done) in
its own transaction.

Every service process runs the round (SWEEP, in its timeline loop:
service/scheduling/timeline/). A round takes a
transaction-level advisory lock, or skips while another process holds it,
and claims each due transition with a conditional UPDATE ... RETURNING
(WHERE state = <old> AND <due> <= now()): a transition committed by another
process is not due any more when this one looks, so each happens once and
its event is written once. Times are the database's clock, as the liveness
sweep's.

A node's maintenance taint is settled from the windows in force on it
(settle_taints), never set or lifted blindly: adjacent windows on one node
([a, b) then [b, c), the second draining before the first ends) keep the
later one's taint when the first ends, and a taint of key "maintenance" an
operator set by hand (source OPERATOR) is neither replaced nor lifted.

cancelMaintenance undoes what has not happened: an open window becomes
CANCELLED, its taints are settled (lifted), its asks forgotten (shardsToMove
no longer lists them); replicas it already stopped stay released. A done or
cancelled window is answered as stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text

from service.database.connections import Connection
from service.errors import InvalidInput
from service.event_log.events import record_event
from service.fleet.fencing import StopReason
from service.fleet.health.taints import TaintRequest, lift_taint, put_taint
from service.fleet.maintenance.waves import next_wave
from service.fleet.maintenance.windows import WindowRecord, node_list, read_window
from service.scheduling.allocations import release_replica
from service.scheduling.maintenance_rule import OPEN_STATES_SQL, MaintenanceState
from service.scheduling.taints import MAINTENANCE_KEY, TaintEffect, TaintSource
from service.scheduling.timeline import Sweep

log = logging.getLogger(__name__)

ACTOR = "maintenance"

# One process's round at a time; the others skip it instead of waiting.
TRANSITIONS_LOCK_KEY = 0x6C6C6D6D  # "llmm", next to the sweep's "llmh"

_TRY_LOCK = text("SELECT pg_try_advisory_xact_lock(:key)")

_RETURNING = "RETURNING w.id, w.reason, w.start_at, w.end_at"
_TO_DRAINING = text(
    f"""
    UPDATE maintenance_windows w SET state = '{MaintenanceState.DRAINING.value}', changed_at = now()
    WHERE w.state = '{MaintenanceState.SCHEDULED.value}' AND w.drain_at <= now()
    {_RETURNING}
    """
)
_TO_IN_PROGRESS = text(
    f"""
    UPDATE maintenance_windows w SET state = '{MaintenanceState.IN_PROGRESS.value}',
        changed_at = now()
    WHERE w.state = '{MaintenanceState.DRAINING.value}' AND w.start_at <= now()
    {_RETURNING}
    """
)
_TO_DONE = text(
    f"""
    UPDATE maintenance_windows w SET state = '{MaintenanceState.DONE.value}', changed_at = now()
    WHERE w.state = '{MaintenanceState.IN_PROGRESS.value}' AND w.end_at <= now()
    {_RETURNING}
    """
)
_DRAINING = text(
    f"""
    SELECT w.id, w.reason FROM maintenance_windows w
    WHERE w.state = '{MaintenanceState.DRAINING.value}' ORDER BY w.start_at, w.id
    """
)
_NODES = text("SELECT node_id FROM maintenance_nodes WHERE window_id = :id ORDER BY node_id")
_LOCK_NODES = text(
    "SELECT id FROM nodes WHERE id = ANY(CAST(:ids AS text[])) ORDER BY id FOR NO KEY UPDATE"
)
_FORGET_MOVES = text("DELETE FROM maintenance_moves WHERE window_id = :id")

# Per node, the maintenance taint it should carry: from the window in force
# that started (NO_SCHEDULE), else the first draining one (PREFER_NO_SCHEDULE);
# and the one it carries.
_TAINTS = text(
    f"""
    SELECT n.id AS node_id, want.id AS window_id, want.state, want.reason,
           t.effect AS has_effect, t.value AS has_value, t.source AS has_source
    FROM unnest(CAST(:ids AS text[])) AS n(id)
    LEFT JOIN LATERAL (
        SELECT w.id, w.state, w.reason FROM maintenance_nodes mn
        JOIN maintenance_windows w ON w.id = mn.window_id
        WHERE mn.node_id = n.id
          AND w.state IN ('{MaintenanceState.DRAINING.value}', '{MaintenanceState.IN_PROGRESS.value}')
        ORDER BY w.state = '{MaintenanceState.IN_PROGRESS.value}' DESC, w.start_at, w.id
        LIMIT 1
    ) want ON true
    LEFT JOIN taints t ON t.node_id = n.id AND t.gpu_index IS NULL AND t.key = '{MAINTENANCE_KEY}'
    ORDER BY n.id
    """
)

# The replicas still on the nodes at the start, with their charge.
_STAYING = text(
    """
    SELECT s.replica_id, min(s.tenant) AS tenant, min(s.deployment) AS deployment
    FROM maintenance_nodes mn JOIN shards s ON s.node_id = mn.node_id
    WHERE mn.window_id = :id
    GROUP BY s.replica_id ORDER BY s.replica_id
    """
)
_BUDGET = text(
    """
    SELECT b.min_available,
           (SELECT count(DISTINCT s.replica_id) FROM shards s
            WHERE s.deployment = b.deployment AND s.tenant = b.tenant) AS placed
    FROM disruption_budgets b WHERE b.tenant = :tenant AND b.deployment = :deployment
    """
)


async def _lock_nodes(conn: Connection, window_id: str) -> list[str]:
    """The window's nodes, their rows locked in id order (as every writer of a node locks them)."""
    ids = [r.node_id for r in await conn.execute(_NODES, {"id": window_id})]
    await conn.execute(_LOCK_NODES, {"ids": ids})
    return ids


async def settle_taints(conn: Connection, node_ids: Sequence[str], actor: str | None) -> None:
    """Each node's maintenance taint as the windows in force on it say; nodes locked by the caller."""
    for r in list(await conn.execute(_TAINTS, {"ids": list(node_ids)})):
        if r.has_source is not None and r.has_source != TaintSource.MAINTENANCE.value:
            # An operator's own taint of this key (set before windows had it):
            # kept as it is; the window still keeps new replicas off the node
            # (maintenance_rule.py), it only lacks its mark there.
            continue
        if r.window_id is None:
            if r.has_effect is not None:
                await lift_taint(conn, r.node_id, None, MAINTENANCE_KEY, actor)
            continue
        started = r.state == MaintenanceState.IN_PROGRESS.value
        effect = TaintEffect.NO_SCHEDULE if started else TaintEffect.PREFER_NO_SCHEDULE
        if r.has_effect == effect.value and r.has_value == r.window_id:
            continue
        await put_taint(
            conn,
            r.node_id,
            None,
            TaintRequest(
                key=MAINTENANCE_KEY,
                value=r.window_id,
                effect=effect,
                reason=f"maintenance {r.window_id}: {r.reason}",
                source=TaintSource.MAINTENANCE,
            ),
            actor,
        )


def _detail(row: Any, nodes: Sequence[str], **more: Any) -> dict[str, Any]:
    return {
        "maintenanceWindow": row.id,
        "nodeIds": list(nodes),
        "start": row.start_at.isoformat(),
        "end": row.end_at.isoformat(),
        **more,
    }


async def _stop_staying(conn: Connection, row: Any, nodes: Sequence[str]) -> list[str]:
    """Release every replica still on the window's nodes at its start; events for budgets broken."""
    staying = list(await conn.execute(_STAYING, {"id": row.id}))
    stopping: dict[tuple[str, str], int] = {}
    for r in staying:
        if r.deployment is not None:
            key = (r.tenant, r.deployment)
            stopping[key] = stopping.get(key, 0) + 1
    for (tenant, deployment), count in sorted(stopping.items()):
        budget = (await conn.execute(_BUDGET, {"tenant": tenant, "deployment": deployment})).first()
        if budget is None or budget.placed - count >= budget.min_available:
            continue
        await record_event(
            conn,
            "maintenance_budget_broken",
            actor=ACTOR,
            reason=(
                f"maintenance {row.id} started on {node_list(nodes)}: deployment {deployment} of "
                f"tenant {tenant} keeps {budget.placed - count} placed replicas, below its "
                f"disruption budget's minAvailable {budget.min_available}"
            ),
            detail={
                "maintenanceWindow": row.id,
                "tenant": tenant,
                "deployment": deployment,
                "minAvailable": budget.min_available,
                "placedBefore": budget.placed,
                "placedAfter": budget.placed - count,
            },
        )
    released = []
    for r in staying:
        freed = await release_replica(
            conn,
            r.replica_id,
            actor=ACTOR,
            reason=f"maintenance {row.id} started on {node_list(nodes)}: {row.reason}",
            stopped_for={
                "stopReason": StopReason.MAINTENANCE.value,
                "maintenanceWindow": row.id,
            },
        )
        if freed:
            released.append(r.replica_id)
    return released


@dataclass
class Round:
    """What one round did (swept False: another process held the round)."""

    swept: bool = True
    draining: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)


async def run_round(conn: Connection) -> Round:
    """One round, inside the caller's transaction (never commits): every due transition, then the waves."""
    if not (await conn.execute(_TRY_LOCK, {"key": TRANSITIONS_LOCK_KEY})).scalar_one():
        return Round(swept=False)
    did = Round()
    for row in list(await conn.execute(_TO_DRAINING)):
        nodes = await _lock_nodes(conn, row.id)
        await settle_taints(conn, nodes, ACTOR)
        await record_event(
            conn,
            "maintenance_draining",
            actor=ACTOR,
            reason=f"maintenance {row.id} drains {node_list(nodes)}: {row.reason}",
            detail=_detail(row, nodes),
        )
        did.draining.append(row.id)
    for row in list(await conn.execute(_TO_IN_PROGRESS)):
        nodes = await _lock_nodes(conn, row.id)
        await settle_taints(conn, nodes, ACTOR)
        stopped = await _stop_staying(conn, row, nodes)
        await record_event(
            conn,
            "maintenance_started",
            actor=ACTOR,
            reason=f"maintenance {row.id} started on {node_list(nodes)}: {row.reason}",
            detail=_detail(row, nodes, stoppedReplicas=stopped),
        )
        did.started.append(row.id)
        did.stopped += stopped
    for row in list(await conn.execute(_TO_DONE)):
        nodes = await _lock_nodes(conn, row.id)
        await settle_taints(conn, nodes, ACTOR)
        await conn.execute(_FORGET_MOVES, {"id": row.id})
        await record_event(
            conn,
            "maintenance_done",
            actor=ACTOR,
            reason=f"maintenance {row.id} done on {node_list(nodes)}: {row.reason}",
            detail=_detail(row, nodes),
        )
        did.done.append(row.id)
    for row in list(await conn.execute(_DRAINING)):
        wave = await next_wave(conn, row.id, f"maintenance {row.id}: {row.reason}", ACTOR)
        did.asked += wave.asked
    return did


_CANCEL = text(
    f"""
    UPDATE maintenance_windows w SET state = '{MaintenanceState.CANCELLED.value}',
        changed_at = now()
    WHERE w.id = :id AND w.state IN {OPEN_STATES_SQL}
    RETURNING w.id, w.reason, w.start_at, w.end_at, w.state
    """
)


async def cancel(conn: Connection, window_id: str, actor: str | None) -> WindowRecord:
    """Cancel an open window (undoing its taints and asks); a closed one is answered as stored."""
    stored = await read_window(conn, window_id)
    if stored is None:
        raise InvalidInput("id", window_id, "no such maintenance window")
    row = (await conn.execute(_CANCEL, {"id": window_id})).first()
    if row is not None:
        nodes = await _lock_nodes(conn, window_id)
        await settle_taints(conn, nodes, actor)
        await conn.execute(_FORGET_MOVES, {"id": window_id})
        await record_event(
            conn,
            "maintenance_cancelled",
            actor=actor,
            reason=f"maintenance {window_id} cancelled ({stored.state.value}): {row.reason}",
            detail=_detail(row, nodes, was=stored.state.value),
        )
    after = await read_window(conn, window_id)
    assert after is not None
    return after


def said(result: Round) -> str | None:
    """What a round did, for the timeline's log line; None when it changed nothing."""
    parts = [
        f"{what} {', '.join(ids)}"
        for what, ids in (
            ("draining", result.draining),
            ("started", result.started),
            ("done", result.done),
            ("asked to move", result.asked),
            ("stopped", result.stopped),
        )
        if ids
    ]
    return "; ".join(parts) if parts else None


# The windows' changes on time, made by every process's timeline loop
# (service/scheduling/timeline/, started in service/web/operations.py).
SWEEP = Sweep("maintenance", run_round, said)
