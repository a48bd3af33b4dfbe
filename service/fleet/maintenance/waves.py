"""Asking a draining window's replicas to move, in waves within their deployments' disruption budgets.

While a window drains, each round of the transitions loop asks the next
replicas on its nodes to move: a row in maintenance_moves, and a
replica_must_move event per shard on the window's nodes (the scheduler's
subscription learns of it; shardsToMove lists the shards, naming the window
and its taint, with stopBy the window's start). The scheduler places a
replacement elsewhere (placement avoids the window's nodes: verdict
MAINTENANCE) and releases the old replica; then the next wave goes.

The wave rule, per deployment with a disruption budget (tenant, deployment,
minAvailable; service/scheduling/tenancy/budgets.py): a new wave is asked
only when no replica of the deployment asked to move (by any window) is still
placed, and it asks at most placed - minAvailable of them. So a deployment of
3 with minAvailable 2 is asked one replica at a time, and the next only once
the previous one is released; counting the replacement as room for another
ask before the old one is gone would let a scheduler that is slow to release
hold two asked replicas at once. Replicas in no deployment, or in one without
a budget, are asked all at once. A deployment whose budget allows no
disruption (placed <= minAvailable) is never asked: its replicas stay until
the window starts, and the start says which budget it breaks.

Runs under the transitions loop's advisory lock (transitions.py), so two
processes never ask waves of one deployment at the same time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import text

from service.database.connections import Connection
from service.event_log.events import note_recorded
from service.scheduling.maintenance_rule import MaintenanceState
from service.scheduling.taints import MAINTENANCE_KEY, TaintEffect, TaintSource

ASKING_STATES_SQL = f"('{MaintenanceState.DRAINING.value}', '{MaintenanceState.IN_PROGRESS.value}')"

# Replicas with a shard on the window's nodes not yet asked by it, with their
# charge. A replica that promised to be released by the start (shards.until,
# PlaceInput.until) is not asked: it leaves in time, or the start stops it.
_UNASKED = text(
    """
    SELECT s.replica_id, min(s.tenant) AS tenant, min(s.deployment) AS deployment
    FROM maintenance_windows w
    JOIN maintenance_nodes mn ON mn.window_id = w.id
    JOIN shards s ON s.node_id = mn.node_id
    WHERE w.id = :window_id AND (s.until IS NULL OR s.until > w.start_at)
      AND NOT EXISTS (SELECT 1 FROM maintenance_moves mm
                      WHERE mm.window_id = :window_id AND mm.replica_id = s.replica_id)
    GROUP BY s.replica_id ORDER BY s.replica_id
    """
)
# A deployment's budget, its placed replicas, and those asked to move (by an
# open window) still placed.
_BUDGET = text(
    f"""
    SELECT b.min_available,
           (SELECT count(DISTINCT s.replica_id) FROM shards s
            WHERE s.deployment = b.deployment AND s.tenant = b.tenant) AS placed,
           (SELECT count(DISTINCT s.replica_id) FROM shards s
            WHERE s.deployment = b.deployment AND s.tenant = b.tenant
              AND EXISTS (SELECT 1 FROM maintenance_moves mm
                          JOIN maintenance_windows w ON w.id = mm.window_id
                          WHERE mm.replica_id = s.replica_id
                            AND w.state IN {ASKING_STATES_SQL})) AS outstanding
    FROM disruption_budgets b WHERE b.tenant = :tenant AND b.deployment = :deployment
    """
)
_ASK = text(
    """
    INSERT INTO maintenance_moves (window_id, replica_id)
    SELECT :window_id, r FROM unnest(CAST(:replicas AS text[])) AS r
    ON CONFLICT DO NOTHING
    """
)
# One event per shard of the asked replicas on the window's nodes, as a
# NO_EXECUTE taint's replica_must_move says it (fleet/health/taints.py), with
# the window.
_MUST_MOVE = text(
    f"""
    INSERT INTO events (kind, node_id, replica_id, shard_id, actor, reason, detail)
    SELECT 'replica_must_move', s.node_id, s.replica_id, s.shard_id, :actor, :reason,
           jsonb_build_object('key', '{MAINTENANCE_KEY}', 'value', w.id,
                              'effect', '{TaintEffect.PREFER_NO_SCHEDULE.value}',
                              'source', '{TaintSource.MAINTENANCE.value}',
                              'maintenanceWindow', w.id,
                              'gpuIndices', to_jsonb(s.gpu_indices), 'stopBy', w.start_at)
    FROM maintenance_windows w
    JOIN maintenance_nodes mn ON mn.window_id = w.id
    JOIN shards s ON s.node_id = mn.node_id
    WHERE w.id = :window_id AND s.replica_id = ANY(CAST(:replicas AS text[]))
    ORDER BY s.shard_id
    RETURNING id
    """
)


@dataclass(frozen=True)
class Wave:
    window_id: str
    asked: tuple[str, ...]
    # Deployments with replicas left to ask that must wait (budget), by "tenant/deployment".
    waiting: tuple[str, ...]


async def next_wave(conn: Connection, window_id: str, reason: str, actor: str) -> Wave:
    """Ask the replicas the budgets allow now; none twice for one window."""
    by_deployment: dict[tuple[str, str], list[str]] = defaultdict(list)
    asked: list[str] = []
    for r in await conn.execute(_UNASKED, {"window_id": window_id}):
        if r.deployment is None:
            asked.append(r.replica_id)
        else:
            by_deployment[(r.tenant, r.deployment)].append(r.replica_id)
    waiting: list[str] = []
    for (tenant, deployment), replicas in sorted(by_deployment.items()):
        budget = (await conn.execute(_BUDGET, {"tenant": tenant, "deployment": deployment})).first()
        if budget is None:
            asked += replicas
            continue
        room = 0 if budget.outstanding else max(0, budget.placed - budget.min_available)
        asked += replicas[:room]
        if len(replicas) > room:
            waiting.append(f"{tenant}/{deployment}")
    asked.sort()
    if asked:
        await conn.execute(_ASK, {"window_id": window_id, "replicas": asked})
        moved = await conn.execute(
            _MUST_MOVE,
            {"window_id": window_id, "replicas": asked, "actor": actor, "reason": reason},
        )
        note_recorded(list(moved.scalars()))
    return Wave(window_id, tuple(asked), tuple(waiting))
