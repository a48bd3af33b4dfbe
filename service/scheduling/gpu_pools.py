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
from service.scheduling.availability import (
    POOL_COUNTS,
    gpu_admitted,
    gpu_withheld,
    node_schedulable,
    pool_counts,
    taint_marks,
)


def _listed(alias: str, columns: tuple[str, ...]) -> str:
    return ", ".join(f"{alias}{c}" for c in columns)


_WRITTEN = (*POOL_COUNTS, "schedulable", "fabrics", "fabric_rates")
# The columns an INSERT of a recount lists, and the counts' own names over an
# alias (the recount's CTE): availability.pool_counts' order, then
# schedulable, then the node's fabrics (attached_fabrics).
POOL_INSERT_COLUMNS = f"node_id, gpu_class, {_listed('', _WRITTEN)}"


def attached_fabrics(attachments: str, prefix: str = "") -> str:
    """SQL select list: a node's fabrics by name and each one's link rate, in that order.

    NodeFacts.fabrics and fabric_rates, from the node's fabric_attachments
    rows that `attachments` gives (a FROM item aliased `fa`, with fabric and
    rate_gbps). Every pool of the node carries them too (gpu_pools.fabrics,
    fabric_rates), written by each recount from the attachments as they are
    then, so that a read of many pools (placement groups' board, the pool
    census) learns each node's fabrics from its pool, not from a lookup per
    node; a report that changes only the node's fabrics takes the recount
    (service/fleet/re_registration.py: fabrics_changed).
    """
    return (
        f"ARRAY(SELECT fa.fabric FROM {attachments} ORDER BY fa.fabric) AS {prefix}fabrics,"
        f" ARRAY(SELECT fa.rate_gbps FROM {attachments} ORDER BY fa.fabric) AS {prefix}fabric_rates"
    )


def node_attachments(node_id: str) -> str:
    """The FROM item of attached_fabrics for the node `node_id`'s stored attachments."""
    return f"fabric_attachments fa WHERE fa.node_id = {node_id}"


def counted(alias: str) -> str:
    """SQL select list: pool_counts' columns from a recount's row `alias`."""
    return _listed(f"{alias}.", POOL_COUNTS)


# How a recount lands in gpu_pools, for every statement that recounts: a row
# whose counts did not change is not rewritten (dead tuples slow the
# scheduler's index scans).
POOL_UPSERT = f"""ON CONFLICT (node_id, gpu_class) DO UPDATE
        SET {", ".join(f"{c} = excluded.{c}" for c in _WRITTEN)}
        WHERE ({_listed("p.", _WRITTEN)})
              IS DISTINCT FROM
              ({_listed("excluded.", _WRITTEN)})"""


# The counts are availability.pool_counts' partition, schedulable is
# availability.node_schedulable, the fabrics the node's attachments.
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
    INSERT INTO gpu_pools AS p ({POOL_INSERT_COLUMNS})
    SELECT c.node_id, c.gpu_class, {counted("c")}, {node_schedulable("n")},
           {attached_fabrics(node_attachments("c.node_id"))}
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
    (availability.gpu_free), or withheld and tolerated
    (availability.gpu_offered), when the claim was checked, under the row locks of its nodes, and every writer
    of a node's GPUs, allocations, state or pools takes that lock first (and
    keeps the pools right before it commits), so the pool rows are right
    before this statement and adding to them is as right as recounting them.
    A recount (the node's GPUs joined with its allocations and the held
    rows, then an upsert) would read every GPU of every held node on every
    place; the delta writes only what changed. tests/support/consistency.py
    recounts every pool after the fuzzed and the faulted sequences, so a
    delta that drifts from the recount fails there.
    """
    # `= ANY(ARRAY(...))` makes the held nodes one array, so gpu_pools is read
    # through its primary key: joined to `held` directly, the planner (which
    # guesses 100 rows for a statement's input) hashed all of gpu_pools.
    # The held indices leave free_indices (or withheld_indices, for a
    # tolerated GPU, or reserved_indices, for a GPU set aside that the
    # request was admitted to: availability.gpu_admitted) and last_resort_indices with their counts, and their
    # NVLink groups leave free_groups (the same positions), so the pool row
    # stays what a recount (availability.pool_counts) would write.
    return f"""
    pools_moved AS (
        UPDATE gpu_pools p SET allocated = p.allocated + m.n,
            free = p.free - (m.n - m.withheld - m.reserved), withheld = p.withheld - m.withheld,
            reserved = p.reserved - m.reserved,
            reserved_indices = CASE WHEN m.reserved = 0 THEN p.reserved_indices
                ELSE ARRAY(SELECT i FROM unnest(p.reserved_indices) i
                           WHERE i <> ALL(m.indices) ORDER BY i) END,
            free_indices = ARRAY(SELECT i FROM unnest(p.free_indices) i
                                 WHERE i <> ALL(m.indices) ORDER BY i),
            free_groups = ARRAY(SELECT u.grp FROM unnest(p.free_indices, p.free_groups) u(i, grp)
                                WHERE u.i <> ALL(m.indices) ORDER BY u.i),
            withheld_indices = CASE WHEN m.withheld = 0 THEN p.withheld_indices
                ELSE ARRAY(SELECT i FROM unnest(p.withheld_indices) i
                           WHERE i <> ALL(m.indices) ORDER BY i) END,
            last_resort = p.last_resort - m.last_resort,
            last_resort_indices = CASE WHEN m.last_resort = 0 THEN p.last_resort_indices
                ELSE ARRAY(SELECT i FROM unnest(p.last_resort_indices) i
                           WHERE i <> ALL(m.indices) ORDER BY i) END
        FROM (SELECT h.node_id, g.gpu_class, count(*) AS n,
                     count(*) FILTER (WHERE {gpu_withheld("g")}) AS withheld,
                     count(*) FILTER (WHERE NOT {gpu_withheld("g")} AND {gpu_admitted("g")}
                                            AND g.last_resort) AS last_resort,
                     count(*) FILTER (WHERE NOT {gpu_withheld("g")}
                                      AND NOT {gpu_admitted("g")}) AS reserved,
                     array_agg(h.gpu_index) AS indices
              FROM {held} h JOIN gpus g ON g.node_id = h.node_id AND g.idx = h.gpu_index
              GROUP BY h.node_id, g.gpu_class) m
        WHERE p.node_id = ANY(ARRAY(SELECT node_id FROM {held}))
          AND p.node_id = m.node_id AND p.gpu_class = m.gpu_class AND ({when})
    )"""


async def refresh_pools(conn: Connection, node_ids: Sequence[str]) -> None:
    if node_ids:
        await conn.execute(_REFRESH, {"node_ids": sorted(set(node_ids))})


# The taint marks of the nodes' GPUs (gpus.withheld, gpus.last_resort) as the
# taints table says they are now; a row whose marks did not change is not
# rewritten.
_MARKS = text(
    f"""
    UPDATE gpus g SET withheld = m.withheld, last_resort = m.last_resort
    FROM (SELECT x.node_id, x.idx, {taint_marks("x.node_id", "x.idx")}
          FROM gpus x WHERE x.node_id = ANY(CAST(:node_ids AS text[]))) m
    WHERE g.node_id = m.node_id AND g.idx = m.idx
      AND (g.withheld, g.last_resort) IS DISTINCT FROM (m.withheld, m.last_resort)
    """
)


async def refresh_taint_marks(conn: Connection, node_ids: Sequence[str]) -> None:
    """After a change of the nodes' taints: their GPUs' marks, then their pools.

    The caller holds the nodes' row locks, as every writer of pools does.
    """
    if node_ids:
        ids = sorted(set(node_ids))
        await conn.execute(_MARKS, {"node_ids": ids})
        await refresh_pools(conn, ids)
