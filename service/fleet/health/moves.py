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
from service.scheduling.taints import Taint, evicting, first_taint, stop_by_sql


@dataclass(frozen=True)
class ShardToMove:
    shard: ShardRecord
    # By when its engine must stop (it is told TAINTED from then on).
    stop_by: datetime
    overdue: bool
    # The first NO_EXECUTE taint on it (the node's first, then by GPU and key).
    taint: Taint


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
           {first_taint("s.node_id", "ANY(s.gpu_indices)", evicting("t"))} AS taint
    FROM shards s CROSS JOIN LATERAL (SELECT {stop_by_sql("s")} AS stop_by) x
    WHERE {" AND ".join(where)} AND x.stop_by IS NOT NULL
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
    """
    params: dict[str, Any] = {"first": first, "node_id": node_id, "after": after}
    rows = await conn.execute(cached_text(shards_to_move_sql(node_id, after)), params)
    found: list[ShardToMove] = []
    for r in rows:
        taint = r.taint
        found.append(
            ShardToMove(
                shard=shard_from_row(r),
                stop_by=r.stop_by,
                overdue=bool(r.overdue),
                taint=taint_of(taint, taint["gpu"]),
            )
        )
    return found
