"""Replicas of one role spread over a node's NUMA nodes: the order their shards take its GPUs.

Used by place()'s claim for placement groups (claims._try) and by the claim of
a whole group in one round (member_claims.claim_members).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import text

from service.database.connections import Connection


def numa_columns(node: str) -> str:
    """SQL: columns gpu_indices and numa_nodes, node `node`'s GPUs by index and each one's NUMA node."""
    return f"""ARRAY(SELECT g.idx FROM gpus g WHERE g.node_id = {node} ORDER BY g.idx) AS gpu_indices,
           ARRAY(SELECT g.numa_node FROM gpus g WHERE g.node_id = {node} ORDER BY g.idx)
               AS numa_nodes"""


_NUMA = text(
    f"SELECT i.node_id, {numa_columns('i.node_id')} FROM unnest(CAST(:ids AS text[])) AS i(node_id)"
)

# Each GPU's NUMA node, by (node id, index).
NumaNodes = Mapping[tuple[str, int], int | None]


def numa_of(node_id: str, row: Any) -> dict[tuple[str, int], int | None]:
    """NumaNodes of the node `node_id` from a row with numa_columns."""
    return {(node_id, i): numa for i, numa in zip(row.gpu_indices, row.numa_nodes, strict=True)}


async def numa_nodes(conn: Connection, node_ids: Sequence[str]) -> NumaNodes:
    numa: dict[tuple[str, int], int | None] = {}
    for row in await conn.execute(_NUMA, {"ids": sorted(node_ids)}):
        numa |= numa_of(row.node_id, row)
    return numa


def spread_order(
    node_id: str, free: Sequence[int], held: Sequence[int], numa: NumaNodes
) -> list[int]:
    """The node's free GPUs, those on the NUMA node `held` has fewest GPUs on first (numa_spread)."""
    load: dict[int | None, int] = {}
    for i in held:
        load[numa.get((node_id, i))] = load.get(numa.get((node_id, i)), 0) + 1

    def key(i: int) -> tuple[int, int, int]:
        where = numa.get((node_id, i))
        return (load.get(where, 0), -1 if where is None else where, i)

    return sorted(free, key=key)


async def numa_spread(
    conn: Connection, free: dict[str, list[int]], held: Mapping[str, Sequence[int]]
) -> dict[str, list[int]]:
    """Each node's free GPUs, those on the NUMA node `held` has fewest GPUs on first.

    Replicas of one role on one PCIe root or NUMA node share its bandwidth
    (Dynamo #10171: both prefill workers on one PCIe root halved throughput,
    and raised latency about 30x). GPUs of one NUMA node stay together, in
    index order, so a shard of several GPUs takes them from one; a GPU whose
    NUMA node is unknown counts as one NUMA node of its own kind.
    """
    nodes = sorted(n for n in free if held.get(n))
    if not nodes:
        return free
    numa = await numa_nodes(conn, nodes)
    spread = dict(free)
    for node_id in nodes:
        spread[node_id] = spread_order(node_id, free[node_id], held[node_id], numa)
    return spread
