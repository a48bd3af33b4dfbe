"""The census of a class's pools: how many nodes of each kind, one index descent per kind.

Some answers need every node of a class but not every node's row: fit counts
how many replicas the class holds and what limits the rest, and nodes whose
gpu_pools rows agree on KIND are one node to judge() for any request that
reads nothing else (availability.pool_counts partitions their GPUs into
those columns; topology_fit.pool_facts builds nvlinkShards' facts from
free_groups and nvlink_known). So the census reads the distinct values of
KIND from ix_gpu_pools_census (plan_shapes.distinct_keys) and, per value,
how many pools have it and the first of their ids, from the same index:
index entries counted, no row of the table read, no row compared with a
group (what a GROUP BY over every pool of the class spends its time on). Its
cost follows the kinds of pool and the pools counted, whatever the
statistics; a class with more than MOST_KINDS kinds is declined (the caller
reads the pools) and counted in DECLINED.
"""

from __future__ import annotations

import threading
from collections import Counter

from service.database.plan_shapes import distinct_keys

# The columns of gpu_pools that tell one kind of node from another, in
# ix_gpu_pools_census' order after gpu_class (tables.py; migration 0018).
KIND = (
    "schedulable", "free", "withheld", "last_resort", "nvlink_known", "free_groups", "fabrics",
    "fabric_rates", "nvlink_domain",
)  # fmt: skip
# Past this many kinds the walk costs more descents than a pass over the pools.
MOST_KINDS = 512


def census_predicate(p: str = "p") -> str:
    """SQL: ix_gpu_pools_census' predicate over the pool row `p` (with `p` empty, the index's own).

    True of every pool (its CHECK says free >= 0) and written only by the
    census, so a statement that reads a class's pools in another order
    (explainPlacement's walk in node order, before any ANALYZE) is not
    offered this index, which leads with the class, in place of the one it
    was written for.
    """
    column = f"{p}." if p else ""
    return f"{column}free >= 0"


def census_sql(
    ids_when: str = "true", start: str = "true", counts: bool = True, skip: bool = False
) -> str:
    """SQL: one row per kind of pool of class :cls, in KIND's order, at most :most of them.

    Columns: KIND's, `nodes` (how many pools of the kind; NULL without
    `counts`) and `members` (the first :ids node ids of the kind,
    ascending; one when `ids_when` is false for the kind). `ids_when`: SQL
    over the kind `k`, whether its members are worth :ids ids (the caller's
    necessary condition for a node it may list). `start`: SQL over the pool
    `t`, the first kind read (a row comparison `>=` on KIND's leading
    columns: plan_shapes.distinct_keys), so the kinds before it are skipped.
    `skip`: the pools of the nodes :skip are not counted nor listed (a kind of
    only such pools counts 0): node_id is in the index, so the count stays
    index-only.
    """
    of_class = f"t.gpu_class = :cls AND {census_predicate('t')}"
    walk = distinct_keys("kinds", "gpu_pools", KIND, of_class, leading=("gpu_class",), start=start)
    same = " AND ".join(f"p.{column} = k.{column}" for column in KIND)
    of_kind = f"FROM gpu_pools p WHERE p.gpu_class = :cls AND {census_predicate()} AND {same}"
    if skip:
        of_kind += " AND p.node_id <> ALL(CAST(:skip AS text[]))"
    nodes = f"(SELECT count(*) {of_kind})" if counts else "CAST(NULL AS bigint)"
    # With every KIND column fixed, the index gives the ids in order.
    return f"""
    WITH RECURSIVE {walk}
    SELECT k.*, {nodes} AS nodes,
           ARRAY(SELECT p.node_id {of_kind} ORDER BY p.node_id
                 LIMIT CASE WHEN {ids_when} THEN :ids ELSE 1 END) AS members
    FROM (SELECT * FROM kinds LIMIT :most) k"""


class Declines:
    """Why a read that could count by the census read every pool instead, by reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def count(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


DECLINED = Declines()
