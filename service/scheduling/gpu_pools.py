"""Per-node, per-class GPU counts, kept current by every write that changes them.

Any transaction that changes a node's GPUs, its allocations or its state calls
refresh_pools for that node before it commits. Recounting one node's handful of
GPUs costs one statement; it buys scheduler questions that read a few index
entries instead of aggregating every GPU in the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text

from service.database.connections import Connection
from service.scheduling.availability import node_schedulable, pool_counts

# How a recount lands in gpu_pools, for every statement that recounts: a row
# whose counts did not change is not rewritten (dead tuples slow the
# scheduler's index scans).
POOL_UPSERT = """ON CONFLICT (node_id, gpu_class) DO UPDATE
        SET total = excluded.total, unhealthy = excluded.unhealthy,
            allocated = excluded.allocated, free = excluded.free,
            free_indices = excluded.free_indices, free_groups = excluded.free_groups,
            nvlink_known = excluded.nvlink_known, schedulable = excluded.schedulable
        WHERE (p.total, p.unhealthy, p.allocated, p.free, p.free_indices, p.free_groups,
               p.nvlink_known, p.schedulable)
              IS DISTINCT FROM
              (excluded.total, excluded.unhealthy, excluded.allocated, excluded.free,
               excluded.free_indices, excluded.free_groups, excluded.nvlink_known,
               excluded.schedulable)"""

# The columns a recount writes (availability.pool_counts), in INSERT order.
POOL_INSERT = (
    "node_id, gpu_class, total, unhealthy, allocated, free, free_indices, free_groups,"
    " nvlink_known, schedulable"
)
# The same from a recount `c`, node id and schedulable aside.
RECOUNTED = (
    "c.total, c.unhealthy, c.allocated, c.free, c.free_indices, c.free_groups, c.nvlink_known"
)


# The counts are availability.pool_counts' partition, and schedulable is
# availability.node_schedulable.
_REFRESH = text(
    f"""
    WITH counts AS (
        SELECT g.node_id, g.gpu_class, {pool_counts("g", "a.gpu_index IS NOT NULL")}
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
    INSERT INTO gpu_pools AS p ({POOL_INSERT})
    SELECT c.node_id, c.gpu_class, {RECOUNTED}, {node_schedulable("n")}
    FROM counts c JOIN nodes n ON n.id = c.node_id
    ORDER BY c.node_id, c.gpu_class
    {POOL_UPSERT}
    """
)


def move_to_allocated(held: str, when: str) -> str:
    """A CTE that moves the GPUs in `held` from free to allocated in their pools.

    For a statement that inserts allocated_gpus rows and must leave the pools
    right in the same round trip (allocations.store_statement): `held` names
    the insert's RETURNING (node_id, gpu_index); `when` is a boolean
    expression, and nothing is written unless it is true (a claim that came
    out incomplete leaves the pools alone).

    A delta, not a recount: every GPU a claim holds was free
    (availability.gpu_free) when the claim was checked, under the row locks of its nodes, and every writer
    of a node's GPUs, allocations, state or pools takes that lock first (and
    keeps the pools right before it commits), so the pool rows are right
    before this statement and adding to them is as right as recounting them.
    A recount (the node's GPUs joined with its allocations and the held
    rows, then an upsert) would read every GPU of every held node on every
    place; the delta writes only what changed. tests/consistency.py
    recounts every pool after the fuzzed and the faulted sequences, so a
    delta that drifts from the recount fails there.
    """
    # `= ANY(ARRAY(...))` makes the held nodes one array, so gpu_pools is read
    # through its primary key: joined to `held` directly, the planner (which
    # guesses 100 rows for a statement's input) hashed all of gpu_pools.
    # The held indices leave free_indices with the count, and their NVLink
    # groups leave free_groups (the same positions), so the pool row stays
    # what a recount (availability.pool_counts) would write.
    return f"""
    pools_moved AS (
        UPDATE gpu_pools p SET allocated = p.allocated + m.n, free = p.free - m.n,
            free_indices = ARRAY(SELECT i FROM unnest(p.free_indices) i
                                 WHERE i <> ALL(m.indices) ORDER BY i),
            free_groups = ARRAY(SELECT u.grp FROM unnest(p.free_indices, p.free_groups) u(i, grp)
                                WHERE u.i <> ALL(m.indices) ORDER BY u.i)
        FROM (SELECT h.node_id, g.gpu_class, count(*) AS n,
                     array_agg(h.gpu_index) AS indices
              FROM {held} h JOIN gpus g ON g.node_id = h.node_id AND g.idx = h.gpu_index
              GROUP BY h.node_id, g.gpu_class) m
        WHERE p.node_id = ANY(ARRAY(SELECT node_id FROM {held}))
          AND p.node_id = m.node_id AND p.gpu_class = m.gpu_class AND ({when})
    )"""


async def refresh_pools(conn: Connection, node_ids: Sequence[str]) -> None:
    if node_ids:
        await conn.execute(_REFRESH, {"node_ids": sorted(set(node_ids))})
