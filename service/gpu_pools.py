"""Per-node, per-class GPU counts, kept current by every write that changes them.

Any transaction that changes a node's GPUs, its allocations or its state calls
refresh_pools for that node before it commits. Recounting one node's handful of
GPUs costs one statement; it buys scheduler questions that read a few index
entries instead of aggregating every GPU in the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text

from service.connections import Connection

# Counts partition a node's GPUs: total = free + allocated + unhealthy, where
# an allocated GPU counts as allocated even if it has since gone unhealthy
# (its holder must be told, but it is not spare capacity either way).
_REFRESH = text(
    """
    WITH counts AS (
        SELECT g.node_id, g.gpu_class,
               count(*) AS total,
               count(*) FILTER (WHERE NOT g.healthy AND a.gpu_index IS NULL) AS unhealthy,
               count(a.gpu_index) AS allocated,
               count(*) FILTER (WHERE g.healthy AND a.gpu_index IS NULL) AS free
        FROM gpus g
        LEFT JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx
        WHERE g.node_id = ANY(CAST(:node_ids AS text[]))
        GROUP BY g.node_id, g.gpu_class
    ), gone AS (
        DELETE FROM gpu_pools p
        WHERE p.node_id = ANY(CAST(:node_ids AS text[]))
          AND NOT EXISTS (
              SELECT 1 FROM counts c WHERE c.node_id = p.node_id AND c.gpu_class = p.gpu_class
          )
    )
    INSERT INTO gpu_pools AS p (node_id, gpu_class, total, unhealthy, allocated, free, schedulable)
    SELECT c.node_id, c.gpu_class, c.total, c.unhealthy, c.allocated, c.free, n.state = 'ready'
    FROM counts c JOIN nodes n ON n.id = c.node_id
    ORDER BY c.node_id, c.gpu_class
    ON CONFLICT (node_id, gpu_class) DO UPDATE
    SET total = excluded.total, unhealthy = excluded.unhealthy, allocated = excluded.allocated,
        free = excluded.free, schedulable = excluded.schedulable
    -- An unchanged row is not rewritten: dead tuples are what slows the
    -- scheduler's index scans after a burst of identical re-registrations.
    WHERE (p.total, p.unhealthy, p.allocated, p.free, p.schedulable)
          IS DISTINCT FROM
          (excluded.total, excluded.unhealthy, excluded.allocated, excluded.free,
           excluded.schedulable)
    """
)


# How a recount lands in gpu_pools, for every statement that recounts: a row
# whose counts did not change is not rewritten (dead tuples slow the
# scheduler's index scans).
POOL_UPSERT = """ON CONFLICT (node_id, gpu_class) DO UPDATE
        SET total = excluded.total, unhealthy = excluded.unhealthy,
            allocated = excluded.allocated, free = excluded.free,
            schedulable = excluded.schedulable
        WHERE (p.total, p.unhealthy, p.allocated, p.free, p.schedulable)
              IS DISTINCT FROM
              (excluded.total, excluded.unhealthy, excluded.allocated, excluded.free,
               excluded.schedulable)"""


def recount_after_holding(held: str, when: str) -> str:
    """CTEs that recount the pools of the nodes in `held`, for a statement that holds GPUs.

    For a statement that inserts allocated_gpus rows and must leave the pools
    right in the same round trip (allocations.store_statement). Its own
    inserts are invisible to its reads, so `held` names them: a CTE (the
    insert's RETURNING) with node_id and gpu_index, counted as allocated on
    top of what the statement's snapshot holds. The partition is _REFRESH's.
    The statement must start after it holds the nodes' row locks, so that its
    snapshot has every allocation committed on them and none can commit
    before it does. `when` is a boolean expression: nothing is written unless
    it is true (a claim that came out incomplete leaves the pools alone).
    Holding GPUs adds or removes no class, so no pool row goes away here.
    """
    return f"""
    pool_counts AS (
        SELECT g.node_id, g.gpu_class,
               count(*) AS total,
               count(*) FILTER (WHERE NOT g.healthy AND a.gpu_index IS NULL AND h.gpu_index IS NULL)
                   AS unhealthy,
               count(a.gpu_index) + count(h.gpu_index) AS allocated,
               count(*) FILTER (WHERE g.healthy AND a.gpu_index IS NULL AND h.gpu_index IS NULL)
                   AS free
        FROM gpus g
        LEFT JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx
        LEFT JOIN {held} h ON h.node_id = g.node_id AND h.gpu_index = g.idx
        WHERE g.node_id IN (SELECT node_id FROM {held}) AND ({when})
        GROUP BY g.node_id, g.gpu_class
    ), pools_recounted AS (
        INSERT INTO gpu_pools AS p (
            node_id, gpu_class, total, unhealthy, allocated, free, schedulable)
        SELECT c.node_id, c.gpu_class, c.total, c.unhealthy, c.allocated, c.free,
               n.state = 'ready'
        FROM pool_counts c JOIN nodes n ON n.id = c.node_id
        ORDER BY c.node_id, c.gpu_class
        {POOL_UPSERT}
    )"""


async def refresh_pools(conn: Connection, node_ids: Sequence[str]) -> None:
    if node_ids:
        await conn.execute(_REFRESH, {"node_ids": sorted(set(node_ids))})
