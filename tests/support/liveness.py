"""Liveness stories' pieces: a replica's shards recorded, the sweep run, a node silenced."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.connections import Connection
from service.database.transactions import in_transaction
from service.fleet.liveness import SweepResult, sweep
from service.scheduling.gpu_pools import refresh_pools

UNREACHABLE_AFTER = 30.0


LOST_AFTER = 300.0


IB_A = [{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}]


async def place(engine: AsyncEngine, replica_id: str, shards: dict[str, list[int]]) -> None:
    """Record a replica's shards as the allocation code would: shards, held GPUs, pools."""
    async with engine.begin() as conn:
        for node_id, indices in shards.items():
            shard_id = f"{replica_id}/{node_id}"
            await conn.execute(
                text(
                    "INSERT INTO shards (shard_id, replica_id, node_id, gpu_indices, fabric)"
                    " VALUES (:s, :r, :n, :i, 'ib-a')"
                ),
                {"s": shard_id, "r": replica_id, "n": node_id, "i": indices},
            )
            await conn.execute(
                text(
                    "INSERT INTO allocated_gpus (node_id, gpu_index, shard_id, gpu_class)"
                    " SELECT :n, g.idx, :s, g.gpu_class FROM gpus g"
                    " WHERE g.node_id = :n AND g.idx = ANY(CAST(:i AS int[]))"
                ),
                {"s": shard_id, "n": node_id, "i": indices},
            )
        await refresh_pools(conn, list(shards))


async def silence(engine: AsyncEngine, node_id: str, seconds: float) -> None:
    """The node's last heartbeat was `seconds` ago, by the database's clock."""
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE nodes SET last_seen = now() - make_interval(secs => :s) WHERE id = :id"),
            {"s": seconds, "id": node_id},
        )


async def run_sweep(engine: AsyncEngine) -> SweepResult:
    async def work(conn: Connection) -> SweepResult:
        return await sweep(conn, UNREACHABLE_AFTER, LOST_AFTER)

    return await in_transaction(engine, work)
