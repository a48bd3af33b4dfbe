"""GPUs recorded as held the way allocate does, to set the scene for a read."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.scheduling.gpu_pools import refresh_pools


async def hold(engine: AsyncEngine, node_id: str, indices: list[int], shard: str = "s1") -> None:
    """Record GPUs as held the way allocate does, to set the scene for a read."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO shards (shard_id, replica_id, node_id, gpu_indices)"
                " VALUES (:s, 'r1', :n, :i)"
            ),
            {"s": shard, "n": node_id, "i": indices},
        )
        for i in indices:
            await conn.execute(
                text(
                    "INSERT INTO allocated_gpus (node_id, gpu_index, shard_id, gpu_class)"
                    " SELECT :n, :i, :s, g.gpu_class FROM gpus g WHERE g.node_id = :n AND g.idx = :i"
                ),
                {"n": node_id, "i": i, "s": shard},
            )
        await refresh_pools(conn, [node_id])
