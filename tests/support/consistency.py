"""What must hold of the stored inventory after any sequence of requests, crashes included."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.connections import Connection
from service.scheduling.availability import gpu_free, taint_marks
from service.scheduling.gpu_pools import refresh_pools

_POOLS = text("SELECT * FROM gpu_pools ORDER BY node_id, gpu_class")


async def _pools(conn: Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in (await conn.execute(_POOLS)).mappings()]


async def inconsistencies(engine: AsyncEngine) -> list[str]:
    """Every broken invariant, described; empty when the data is consistent."""
    problems: list[str] = []
    async with engine.connect() as conn:
        await conn.begin()
        # Each pool's free_indices (what freeGpus answers) are exactly its
        # GPUs that availability calls free, in order: checked GPU by GPU,
        # not through the recount's own aggregate.
        drifted = (
            await conn.execute(
                text(
                    f"""
                    SELECT p.node_id || '/' || p.gpu_class FROM gpu_pools p
                    WHERE p.free_indices IS DISTINCT FROM ARRAY(
                        SELECT g.idx FROM gpus g
                        WHERE g.node_id = p.node_id AND g.gpu_class = p.gpu_class
                          AND {gpu_free("g")}
                        ORDER BY g.idx)
                    """
                )
            )
        ).scalars()
        problems.extend(f"pool {d} lists other free GPUs than it has" for d in drifted)
        # Each GPU's taint marks are what the taints table says of it and its node.
        marked = (
            await conn.execute(
                text(
                    f"""
                    SELECT g.node_id || '/' || g.idx FROM gpus g
                    CROSS JOIN LATERAL (SELECT {taint_marks("g.node_id", "g.idx")}) m
                    WHERE (g.withheld, g.last_resort) IS DISTINCT FROM (m.withheld, m.last_resort)
                    """
                )
            )
        ).scalars()
        problems.extend(f"GPU {m} has other taint marks than its taints give" for m in marked)
        # gpu_pools is what recounting every node's GPUs and allocations gives.
        stored = await _pools(conn)
        node_ids = list((await conn.execute(text("SELECT id FROM nodes"))).scalars())
        await refresh_pools(conn, node_ids)
        recounted = await _pools(conn)
        if stored != recounted:
            problems.append(f"gpu_pools drifted: stored {stored} != recounted {recounted}")
        # Each shard holds exactly the GPUs it lists, on its own node.
        mismatched = (
            await conn.execute(
                text(
                    """
                    SELECT s.shard_id FROM shards s
                    LEFT JOIN LATERAL (
                        SELECT array_agg(a.gpu_index ORDER BY a.gpu_index) AS held,
                               bool_and(a.node_id = s.node_id) AS same_node
                        FROM allocated_gpus a WHERE a.shard_id = s.shard_id
                    ) h ON true
                    WHERE h.held IS DISTINCT FROM
                          (SELECT array_agg(i ORDER BY i) FROM unnest(s.gpu_indices) i)
                       OR NOT coalesce(h.same_node, false)
                    """
                )
            )
        ).scalars()
        problems.extend(f"shard {s} does not hold exactly its GPUs" for s in mismatched)
        # Held GPUs exist.
        orphans = (
            await conn.execute(
                text(
                    "SELECT a.node_id || '/' || a.gpu_index FROM allocated_gpus a "
                    "LEFT JOIN gpus g ON g.node_id = a.node_id AND g.idx = a.gpu_index "
                    "WHERE g.idx IS NULL"
                )
            )
        ).scalars()
        problems.extend(f"allocated GPU {o} does not exist" for o in orphans)
        problems.extend(
            f"GPU {h} is held against reservation {r}" for h, r in await held_against(conn)
        )
        await conn.rollback()
    return problems


async def report_signature(conn: Connection, node_id: str) -> tuple[Any, ...]:
    """What a node's stored report says, in a comparable shape."""
    gpus = (
        await conn.execute(
            text("SELECT idx, gpu_class, healthy FROM gpus WHERE node_id = :n ORDER BY idx"),
            {"n": node_id},
        )
    ).all()
    fabrics = (
        await conn.execute(
            text("SELECT fabric FROM fabric_attachments WHERE node_id = :n ORDER BY fabric"),
            {"n": node_id},
        )
    ).scalars()
    filesystems = (
        await conn.execute(
            text("SELECT fs_id FROM filesystems WHERE node_id = :n ORDER BY fs_id"), {"n": node_id}
        )
    ).scalars()
    hostname = await conn.scalar(text("SELECT hostname FROM nodes WHERE id = :n"), {"n": node_id})
    return (hostname, tuple(tuple(g) for g in gpus), tuple(fabrics), tuple(filesystems))


# A GPU set aside by a live reservation and held by a shard that neither was
# placed into it nor promised to be gone by its start (availability.gpu_admitted's
# rule, seen from the rows it leaves): what no claim may ever make (issue 47).
HELD_AGAINST = """
    SELECT g.node_id || '/' || g.idx, r.id FROM gpus g
    JOIN reservations r ON r.id = g.reservation
    JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx
    JOIN shards s ON s.shard_id = a.shard_id
    WHERE r.state <> 'ENDED' AND s.reservation IS DISTINCT FROM r.id
      AND NOT (s.until IS NOT NULL AND s.until <= r.starts_at AND r.started_at IS NULL)
"""


async def held_against(conn: Connection) -> list[tuple[str, str]]:
    return [(row[0], row[1]) for row in await conn.execute(text(HELD_AGAINST))]
