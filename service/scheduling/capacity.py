"""The scheduler's questions about capacity: free GPUs, per-class totals, fabrics.

All read gpu_pools, the per-node per-class counts that every write keeps
current, so each answer is one indexed statement whose cost follows the size
of the answer rather than of the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from service.database.connections import Connection, cached_text
from service.errors import InvalidInput
from service.scheduling.availability import gpu_free_given, pool_offers
from service.scheduling.freshness import check_max_age, gpu_facts_fresh


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


@dataclass(frozen=True)
class FabricMembers:
    name: str
    node_ids: tuple[str, ...]


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

    Also the source of node_pages.FreeGpusPage, so both ways answer the same nodes.

    Why it is shaped so (a client paging through the whole answer at 10,000
    nodes reads it in a few pages of a thousand; issue 18 asks that to cost no
    more than one plain aggregate over every GPU):
    - With a class, a node has one pool row of it (the key is node, class),
      so the page is a walk of ix_gpu_pools_free in node order from `after`
      that stops at `first` rows: no grouping, no sort of the rest of the list.
    - The page's usable GPUs (ix_gpus_usable, index-only) and its
      allocations are each read by one index scan over the page's node ids
      as one sorted array (`= ANY(ARRAY(...))`: PostgreSQL 17+ walks the leaf
      pages once instead of descending per node), merged on (node, index)
      and grouped per node. Per node, a LATERAL that looked up the GPUs'
      table rows and probed allocated_gpus once per GPU cost about four
      times the PostgreSQL CPU. The free test is availability.gpu_free_given,
      the same rule with the holder joined.
    Both indexes come with migration 0008.
    """
    if min_free < 1:
        raise InvalidInput("minFree", min_free, "must be at least 1")
    params: dict[str, Any] = {"min_free": min_free, "first": first}
    where = [pool_offers("p")]
    if gpu_class is not None:
        where.append("p.gpu_class = :cls")
        params["cls"] = gpu_class
    if fabric is not None:
        where.append(
            "EXISTS (SELECT 1 FROM fabric_attachments fa"
            " WHERE fa.node_id = p.node_id AND fa.fabric = :fabric)"
        )
        params["fabric"] = fabric
    if after is not None:
        where.append("p.node_id > :after")
        params["after"] = after
    if max_age is not None:
        # Freshness (service/scheduling/freshness.py): one primary-key probe per pool row.
        check_max_age(max_age)
        fresh = gpu_facts_fresh("n")
        where.append(f"EXISTS (SELECT 1 FROM nodes n WHERE n.id = p.node_id AND {fresh})")
        params["max_age"] = max_age
    if gpu_class is not None:
        where.append("p.free >= :min_free")
        page = f"""
            SELECT p.node_id FROM gpu_pools p WHERE {" AND ".join(where)}
            ORDER BY p.node_id LIMIT :first"""
    else:
        page = f"""
            SELECT p.node_id FROM gpu_pools p WHERE {" AND ".join(where)}
            GROUP BY p.node_id HAVING sum(p.free) >= :min_free
            ORDER BY p.node_id LIMIT :first"""
    gpu_class_match = "AND g.gpu_class = :cls" if gpu_class is not None else ""
    # In the WHERE, so the planner makes the LEFT JOIN an anti join and reads
    # the GPUs from ix_gpus_usable (whose predicate gpu_free_given implies).
    free = gpu_free_given("g", "a.gpu_index IS NOT NULL")
    sql = f"""
        WITH page AS MATERIALIZED ({page}
        )
        SELECT page.node_id, free.indices
        FROM page LEFT JOIN (
            SELECT g.node_id, array_agg(g.idx ORDER BY g.idx) AS indices
            FROM gpus g
            LEFT JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx
                AND a.node_id = ANY(ARRAY(SELECT node_id FROM page))
            WHERE g.node_id = ANY(ARRAY(SELECT node_id FROM page)) {gpu_class_match} AND {free}
            GROUP BY g.node_id
        ) free ON free.node_id = page.node_id
        ORDER BY page.node_id
    """
    return sql, params


async def free_gpus(
    conn: Connection,
    *,
    gpu_class: str | None,
    fabric: str | None,
    min_free: int,
    first: int,
    after: str | None = None,
    max_age: int | None = None,
) -> list[NodeFreeGpus]:
    """Free GPUs (availability) on schedulable nodes: one entry per node with at least min_free.

    `max_age`: only nodes whose GPU facts are at most that many seconds old (freshness).
    """
    sql, params = free_gpus_query(
        gpu_class=gpu_class,
        fabric=fabric,
        min_free=min_free,
        first=first,
        after=after,
        max_age=max_age,
    )
    rows = await conn.execute(cached_text(sql), params)
    return [NodeFreeGpus(r.node_id, tuple(r.indices or ())) for r in rows]


_CLASSES = text(
    """
    SELECT gpu_class,
           sum(total) AS total,
           sum(free) FILTER (WHERE schedulable) AS free,
           sum(allocated) AS allocated,
           sum(unhealthy) AS unhealthy,
           sum(free) FILTER (WHERE NOT schedulable) AS unschedulable
    FROM gpu_pools GROUP BY gpu_class ORDER BY gpu_class
    """
)


async def gpu_classes(conn: Connection) -> list[GpuClassSummary]:
    rows = await conn.execute(_CLASSES)
    return [
        GpuClassSummary(
            gpu_class=r.gpu_class,
            total=int(r.total or 0),
            free=int(r.free or 0),
            allocated=int(r.allocated or 0),
            unhealthy=int(r.unhealthy or 0),
            unschedulable=int(r.unschedulable or 0),
        )
        for r in rows
    ]


_FABRICS = text(
    """
    SELECT fabric, array_agg(node_id ORDER BY node_id) AS node_ids
    FROM fabric_attachments GROUP BY fabric ORDER BY fabric
    """
)


async def fabrics(conn: Connection) -> list[FabricMembers]:
    rows = await conn.execute(_FABRICS)
    return [FabricMembers(r.fabric, tuple(r.node_ids)) for r in rows]
