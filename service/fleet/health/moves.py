"""The shards NO_EXECUTE taints move: which, since when, by when (`ctl allocations --stale`).

A NO_EXECUTE taint on a GPU (or on its node) tells the engine of each shard
there to stop once its toleration runs out (service/scheduling/taints.py,
stop_by_sql; the heartbeat's shardsToStop says TAINTED from then on). The
inventory frees nothing itself: the scheduler replaces the replica and
releases it, or the node confirms the shard stopped. Until then the shard is
stale, and this is the list an operator reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from service.database.connections import Connection, cached_text
from service.fleet.health.taint_rows import taint_of
from service.scheduling.allocations import ShardRecord, shard_columns, shard_from_row
from service.scheduling.maintenance_rule import MaintenanceState
from service.scheduling.taints import (
    MAINTENANCE_KEY,
    Taint,
    evicting,
    first_taint,
    stop_by_sql,
    taint_json,
)


@dataclass(frozen=True)
class ShardToMove:
    shard: ShardRecord
    # By when its engine must stop (it is told TAINTED from then on).
    stop_by: datetime
    overdue: bool
    # The first NO_EXECUTE taint on it (the node's first, then by GPU and key);
    # for a maintenance window's ask, the window's taint on the node.
    taint: Taint
    # The maintenance window that asked it to move (service/fleet/maintenance/waves.py).
    maintenance_window: str | None = None


def shards_to_move_sql(node_id: str | None, after: str | None) -> str:
    """shards_to_move's statement: with `node_id`, on that node only; with `after`, past that shard id.

    The SQL generated below looks like this: docs/internals/sql/fleet.health.moves/shards_to_move_sql.all.sql
    (every shape beside it).
    """
    where = [f"s.node_id IN (SELECT t.node_id FROM taints t WHERE {evicting('t')})"]
    if node_id is not None:
        where.append("s.node_id = :node_id")
    if after is not None:
        where.append("s.shard_id > :after")
    return f"""
    SELECT {shard_columns("s")}, x.stop_by, x.stop_by <= now() AS overdue,
           {first_taint("s.node_id", "ANY(s.gpu_indices)", evicting("t"))} AS taint,
           CAST(NULL AS text) AS maintenance_window
    FROM shards s CROSS JOIN LATERAL (SELECT {stop_by_sql("s")} AS stop_by) x
    WHERE {" AND ".join(where)} AND x.stop_by IS NOT NULL
    ORDER BY s.shard_id LIMIT :first
    """


def maintenance_moves_sql(node_id: str | None, after: str | None) -> str:
    """The shards a draining (or started) maintenance window asked to move: as shards_to_move_sql's rows.

    A replica asked by a window (maintenance_moves), its shards on the
    window's nodes, while the window is open; stopBy is the window's start,
    the taint the window's on the node.
    """
    where = [
        f"w.state IN ('{MaintenanceState.DRAINING.value}', '{MaintenanceState.IN_PROGRESS.value}')"
    ]
    if node_id is not None:
        where.append("s.node_id = :node_id")
    if after is not None:
        where.append("s.shard_id > :after")
    return f"""
    SELECT {shard_columns("s")}, w.start_at AS stop_by, w.start_at <= now() AS overdue,
           {taint_json("t")} AS taint, w.id AS maintenance_window
    FROM maintenance_moves mm
    JOIN maintenance_windows w ON w.id = mm.window_id
    JOIN shards s ON s.replica_id = mm.replica_id
    JOIN maintenance_nodes mn ON mn.window_id = w.id AND mn.node_id = s.node_id
    JOIN taints t ON t.node_id = s.node_id AND t.gpu_index IS NULL AND t.key = '{MAINTENANCE_KEY}'
    WHERE {" AND ".join(where)}
    ORDER BY s.shard_id LIMIT :first
    """


async def shards_to_move(
    conn: Connection, *, node_id: str | None, first: int, after: str | None = None
) -> list[ShardToMove]:
    """A page of the shards NO_EXECUTE taints move, by shard id; `after`: the last of the page before.

    Only nodes with a NO_EXECUTE taint are read (found through
    ix_taints_no_execute once the taints table is larger than a few pages),
    and on them the shards whose stop time is known: a shard that tolerates
    every such taint for ever is not stale.

    A page merges the shards NO_EXECUTE taints move with those maintenance
    windows asked to move (maintenance_moves_sql), each read a page long in
    shard order; a shard in both is listed once, by its earlier stopBy.
    """
    params: dict[str, Any] = {"first": first, "node_id": node_id, "after": after}
    found: dict[str, ShardToMove] = {}
    for sql in (shards_to_move_sql(node_id, after), maintenance_moves_sql(node_id, after)):
        for r in await conn.execute(cached_text(sql), params):
            taint = r.taint
            move = ShardToMove(
                shard=shard_from_row(r),
                stop_by=r.stop_by,
                overdue=bool(r.overdue),
                taint=taint_of(taint, taint["gpu"]),
                maintenance_window=r.maintenance_window,
            )
            known = found.get(move.shard.shard_id)
            if known is None or move.stop_by < known.stop_by:
                found[move.shard.shard_id] = move
    return [found[k] for k in sorted(found)][:first]
