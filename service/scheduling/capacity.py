"""The scheduler's questions about capacity: free GPUs, per-class totals, fabrics.

All read gpu_pools, the per-node per-class counts (and free GPU indices)
that every write keeps current. freeGpus' pages cost what the page holds in
any statistics state (free_gpus_query); gpuClasses and fabrics answer about
the whole cluster in one pass over one narrow table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text

from service.database.connections import Connection, cached_text
from service.database.plan_shapes import (
    key_row_exists,
    leading_key_is,
    ordered_walk,
    unseen_limit,
)
from service.errors import InvalidInput
from service.scheduling.availability import ADMITS_AT, PoolOffer, pool_offers, pool_withholds
from service.scheduling.freshness import check_max_age, gpu_facts_fresh
from service.scheduling.maintenance_rule import maintenance_on
from service.scheduling.taints import Toleration, toleration_problem, tolerations_json


@dataclass(frozen=True)
class NodeFreeGpus:
    node_id: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class GpuClassSummary:
    gpu_class: str
    total: int
    free: int
    allocated: int
    unhealthy: int
    unschedulable: int
    # Usable, unheld GPUs a NO_SCHEDULE or NO_EXECUTE taint withholds (not in free).
    tainted: int = 0
    # Usable, unheld GPUs set aside for a reservation (gpu_pools' reserved
    # bucket, not in free): with it the statuses add up to total.
    reserved: int = 0


@dataclass(frozen=True)
class FabricMembers:
    name: str
    node_ids: tuple[str, ...]


def on_fabric(node_id: str) -> str:
    """The node is on :fabric: probed per walked node by its key (service/database/plan_shapes.py)."""
    return key_row_exists("fabric_attachments", {"node_id": node_id, "fabric": ":fabric"})


def fresh(node_id: str) -> str:
    """The node's GPU facts are within :max_age (service/scheduling/freshness.py): one
    primary-key probe per walked node."""
    return f"EXISTS (SELECT 1 FROM nodes n WHERE n.id = {node_id} AND {gpu_facts_fresh('n')})"


def _walked_page(walk: str, pools: str, indices: str, on_it: str, offer_join: str = "") -> str:
    """SQL: the page of a walk of nodes in order (`walk`, a plan_shapes.ordered_walk named walk).

    Each node walked is answered with the GPUs its pools offer (`indices`,
    over the pool `q` of the node that `pools` selects, with `offer_join`
    after it), kept when that is at least :min_free and `on_it` (conditions
    over the walked node `w`, each after AND) holds, until :first nodes.
    The LIMIT stops the walk; the ORDER BY sorts only the page (over the walk
    it would run it to the end).
    """
    return f"""
        WITH RECURSIVE {walk}
        SELECT page.node_id, page.indices FROM (
            SELECT w.node_id, offered.indices
            FROM walk w CROSS JOIN LATERAL (
                SELECT array_agg(i ORDER BY i) AS indices
                FROM gpu_pools q{offer_join}, unnest({indices}) i
                WHERE q.node_id = w.node_id AND {pools}
                HAVING count(*) >= :min_free
            ) offered
            WHERE w.node_id IS NOT NULL{on_it}
            LIMIT :first
        ) page
        ORDER BY page.node_id
    """


def _walked_node_checks(params: dict[str, Any], fabric: str | None, max_age: int | None) -> str:
    """_walked_page's `on_it` for a node on `fabric` with GPU facts at most `max_age` old; their parameters into `params`."""
    on_it = ""
    if fabric is not None:
        params["fabric"] = fabric
        on_it += f" AND {on_fabric('w.node_id')}"
    if max_age is not None:
        check_max_age(max_age)
        params["max_age"] = max_age
        on_it += f" AND {fresh('w.node_id')}"
    return on_it


def free_gpus_query(
    *,
    gpu_class: str | None,
    fabric: str | None,
    min_free: int,
    first: int,
    after: str | None = None,
    max_age: int | None = None,
) -> tuple[str, dict[str, Any]]:
    """free_gpus' statement and parameters: rows (node_id, indices) in node order.

    Also the source of json_pages.FreeGpusPage, so both ways answer the same nodes.

    A page costs what the page holds, whatever the planner believes about
    the tables (issue 30: on a cluster just registered, before any ANALYZE,
    a page that joined the GPUs and allocations of its nodes ran into the
    request's time limit). So the statement reads gpu_pools alone: each
    pool row carries its free GPUs' indices (free_indices, kept by the writes
    that keep the counts: service/scheduling/gpu_pools.py), and there is no
    join for the planner to get wrong.
    - With a class, a node has one pool row of it (the key is node, class),
      so the page is a walk of ix_gpu_pools_free (class, node id, including
      free and free_indices) in node order from `after` that stops at
      `first` rows: no grouping, no sort of the rest of the list. The class
      is tested with plan_shapes.leading_key_is, so the primary key (node,
      class), which would walk every pool of every class and the full
      ones, cannot give the order; and the LIMIT is plan_shapes.unseen_limit,
      so a table never analyzed nor vacuumed is walked too, not read whole
      with a bitmap scan and sorted for every page (what its planner chose
      at 10,000 nodes with `LIMIT :first`).
    - Without a class, a node's pools are summed. The walk goes node by
      node (plan_shapes.ordered_walk over the primary key), so it too stops
      at the page's end, where a GROUP BY over every pool would be hashed
      whole when the planner guesses few groups.
    Either walk passes over nodes that offer fewer than minFree (or are not
    on the fabric) and reads nothing else.

    The SQL generated below looks like this: docs/internals/sql/scheduling.capacity/free_gpus_query.class.sql
    (every shape beside it).
    """
    if min_free < 1:
        raise InvalidInput("minFree", min_free, "must be at least 1")
    params: dict[str, Any] = {"min_free": min_free, "first": first}

    if fabric is not None:
        params["fabric"] = fabric
    if max_age is not None:
        check_max_age(max_age)
        params["max_age"] = max_age
    if gpu_class is not None:
        params["cls"] = gpu_class
        # In (class, node) order, which only ix_gpu_pools_free gives
        # (service/database/plan_shapes.py).
        class_is = leading_key_is("p.gpu_class", ":cls")
        where = [pool_offers("p"), class_is, "p.free >= :min_free"]
        if fabric is not None:
            where.append(on_fabric("p.node_id"))
        if max_age is not None:
            where.append(fresh("p.node_id"))
        if after is not None:
            where.append("p.node_id > :after")
            params["after"] = after
        sql = f"""
            SELECT p.node_id, p.free_indices AS indices FROM gpu_pools p
            WHERE {" AND ".join(where)}
            ORDER BY p.gpu_class, p.node_id {unseen_limit(":first")}
        """
        return sql, params
    params["after"] = after if after is not None else ""
    # Nodes with a pool that offers GPUs, in order, from the primary key
    # (service/database/plan_shapes.py).
    walk = ordered_walk("walk", "gpu_pools", "node_id", pool_offers("t"), "CAST(:after AS text)")
    on_it = _walked_node_checks(params, fabric, max_age)
    return _walked_page(walk, pool_offers("q"), "q.free_indices", on_it), params


def tolerated_gpus_query(
    *,
    gpu_class: str | None,
    fabric: str | None,
    min_free: int,
    first: int,
    after: str | None = None,
    max_age: int | None = None,
) -> tuple[str, dict[str, Any]]:
    """The nodes where tolerations add GPUs, in node order: rows (node_id, indices).

    What free_gpus reads besides free_gpus_query for a request with
    tolerations (:tolerations): the nodes that have a pool with withheld
    GPUs (availability.pool_withholds), walked in node order on
    ix_gpu_pools_withheld, or with a class ix_gpu_pools_withheld_class
    (plan_shapes.ordered_walk, a descent per node), each
    answered with everything its pools offer the request
    (availability.PoolOffer: the free GPUs and the tolerated withheld ones),
    kept when that is at least minFree. A page costs its rows and the
    tainted nodes it passes over, not the cluster.

    The SQL generated below looks like this: docs/internals/sql/scheduling.capacity/tolerated_gpus_query.class.sql
    (every shape beside it).
    """
    params: dict[str, Any] = {"min_free": min_free, "first": first, "after": after or ""}
    start = "CAST(:after AS text)"
    if gpu_class is None:
        # ix_gpu_pools_withheld: every class's, in node order.
        walk = ordered_walk("walk", "gpu_pools", "node_id", pool_withholds("t"), start)
    else:
        # ix_gpu_pools_withheld_class: the class's, in node order; the class
        # is tested with leading_key_is, so no other index gives the order.
        where = f"{pool_withholds('t')} AND {leading_key_is('t.gpu_class', ':cls')}"
        walk = ordered_walk("walk", "gpu_pools", "node_id", where, start, leading="gpu_class")
    offer = PoolOffer("q", True)
    pools = f"({pool_offers('q')} OR {pool_withholds('q')})"
    if gpu_class is not None:
        params["cls"] = gpu_class
        pools += " AND q.gpu_class = :cls"
    on_it = _walked_node_checks(params, fabric, max_age)
    return _walked_page(walk, pools, offer.indices, on_it, offer.join), params


def gpus_at_query(
    *,
    gpu_class: str | None,
    fabric: str | None,
    min_free: int,
    first: int,
    after: str | None = None,
    max_age: int | None = None,
) -> tuple[str, dict[str, Any]]:
    """freeGpus with `at`: the GPUs an ordinary place would be offered at :at, rows (node_id, indices).

    The nodes with a schedulable pool, walked in node order on the primary
    key (plan_shapes.ordered_walk), each answered with what its pools offer
    then (availability.PoolOffer with ADMITS_AT: a pool with neither GPUs set
    aside nor a replica due to be gone reads its row as now), except a node
    that a maintenance window in force at :at keeps an ordinary place off
    (maintenance_rule.maintenance_on, as fit(at:) and place judge it: a
    request with no `until`). A page costs the nodes it passes over, and one
    probe of the window's nodes per node walked.

    The SQL generated below looks like this: docs/internals/sql/scheduling.capacity/gpus_at_query.class.sql
    (every shape beside it).
    """
    if min_free < 1:
        raise InvalidInput("minFree", min_free, "must be at least 1")
    params: dict[str, Any] = {"min_free": min_free, "first": first, "after": after or ""}
    walk = ordered_walk("walk", "gpu_pools", "node_id", "t.schedulable", "CAST(:after AS text)")
    offer = PoolOffer("q", False, ADMITS_AT)
    pools = "q.schedulable"
    if gpu_class is not None:
        params["cls"] = gpu_class
        pools += " AND q.gpu_class = :cls"
    on_it = _walked_node_checks(params, fabric, max_age)
    # freeGpus asks for no replica, so no promise to leave: a window in
    # force at :at keeps its nodes out (place's verdict MAINTENANCE then).
    on_it += f" AND NOT {maintenance_on('w.node_id', until='CAST(NULL AS timestamptz)')}"
    return _walked_page(walk, pools, offer.indices, on_it, offer.join), params


async def free_gpus(
    conn: Connection,
    *,
    gpu_class: str | None,
    fabric: str | None,
    min_free: int,
    first: int,
    after: str | None = None,
    max_age: int | None = None,
    tolerations: Sequence[Toleration] = (),
    at: datetime | None = None,
) -> list[NodeFreeGpus]:
    """Free GPUs (availability) on schedulable nodes: one entry per node with at least min_free.

    `max_age`: only nodes whose GPU facts are at most that many seconds old (freshness).
    `tolerations`: the GPUs withheld by taints they all tolerate count too
    (availability.PoolOffer, as placement counts them). The nodes are then
    the union of two walks in node order: free_gpus_query's (a node with
    minFree free GPUs has at least minFree offered) and
    tolerated_gpus_query's (the nodes where tolerations add GPUs, answered
    whole), so the first `first` of the union are the page.
    `at`: what an ordinary place would be offered at that later instant
    (gpus_at_query; without tolerations).
    """
    problem = toleration_problem(tolerations)
    if problem is not None:
        raise InvalidInput(*problem)
    arguments: dict[str, Any] = {
        "gpu_class": gpu_class,
        "fabric": fabric,
        "min_free": min_free,
        "first": first,
        "after": after,
        "max_age": max_age,
    }
    if at is not None:
        if tolerations:
            raise InvalidInput("tolerations", "...", "not asked with `at`")
        sql, params = gpus_at_query(**arguments)
        rows = await conn.execute(cached_text(sql), {**params, "at": at})
        return [NodeFreeGpus(r.node_id, tuple(r.indices or ())) for r in rows]
    sql, params = free_gpus_query(**arguments)
    rows = await conn.execute(cached_text(sql), params)
    found = {r.node_id: tuple(r.indices or ()) for r in rows}
    if tolerations:
        sql, params = tolerated_gpus_query(**arguments)
        params["tolerations"] = tolerations_json(tolerations)
        found.update(
            (r.node_id, tuple(r.indices)) for r in await conn.execute(cached_text(sql), params)
        )
    return [NodeFreeGpus(node_id, found[node_id]) for node_id in sorted(found)[:first]]


# Whole-cluster answers: one pass over one narrow table (gpu_pools, one row
# per node and class; fabric_attachments), the only plan there is, so no
# statistics make it worse; the answer sums or lists every node, so the pass
# is its cost (tests/scheduling/test_page_costs.py bounds it by the table).
CLASS_SUMMARY = text(
    """
    SELECT gpu_class,
           sum(total) AS total,
           sum(free) FILTER (WHERE schedulable) AS free,
           sum(allocated) AS allocated,
           sum(unhealthy) AS unhealthy,
           sum(free) FILTER (WHERE NOT schedulable) AS unschedulable,
           sum(withheld) AS tainted,
           sum(reserved) AS reserved
    FROM gpu_pools GROUP BY gpu_class ORDER BY gpu_class
    """
)


async def gpu_classes(conn: Connection) -> list[GpuClassSummary]:
    rows = await conn.execute(CLASS_SUMMARY)
    return [
        GpuClassSummary(
            gpu_class=r.gpu_class,
            total=int(r.total or 0),
            free=int(r.free or 0),
            allocated=int(r.allocated or 0),
            unhealthy=int(r.unhealthy or 0),
            unschedulable=int(r.unschedulable or 0),
            tainted=int(r.tainted or 0),
            reserved=int(r.reserved or 0),
        )
        for r in rows
    ]


FABRIC_MEMBERS = text(
    """
    SELECT fabric, array_agg(node_id ORDER BY node_id) AS node_ids
    FROM fabric_attachments GROUP BY fabric ORDER BY fabric
    """
)


async def fabrics(conn: Connection) -> list[FabricMembers]:
    rows = await conn.execute(FABRIC_MEMBERS)
    return [FabricMembers(r.fabric, tuple(r.node_ids)) for r in rows]
