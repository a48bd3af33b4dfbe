"""Races between transactions: a shard held uncommitted, a claimer seen blocked on it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncTransaction

from service.database.connections import Connection
from service.scheduling import allocations
from service.scheduling.allocations import AllocationRequest, ShardRequest


async def until_blocked(engine: AsyncEngine, holder: int, task: asyncio.Future[Any]) -> None:
    """Return once some backend waits for a lock that the backend `holder` holds.

    Asked by blocker rather than by database: a freshly opened connection
    can show in pg_stat_activity without its database name yet.
    """
    async with engine.connect() as conn:
        for _ in range(3000):
            if task.done():
                raise AssertionError(f"finished without waiting for the lock: {task.result()}")
            waiting = await conn.execute(
                text("SELECT count(*) FROM pg_locks WHERE :holder = ANY(pg_blocking_pids(pid))"),
                {"holder": holder},
            )
            if waiting.scalar_one() > 0:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("the concurrent request never waited for the lock")


@contextlib.asynccontextmanager
async def shard_uncommitted(
    engine: AsyncEngine, shard_id: str, node_id: str, gpu: int, *, holding: bool
) -> AsyncIterator[tuple[int, AsyncTransaction]]:
    """A shard another transaction has written and not committed: (its backend's pid, it).

    Written as a writer that skips the node's lock would (`holding`: with its
    GPU held too). The transaction is rolled back on leaving unless the test
    ended it.
    """
    replica_id = shard_id.rsplit("-s", 1)[0]
    async with engine.connect() as conn:
        tx = await conn.begin()
        pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        await conn.execute(
            text(
                "INSERT INTO shards (shard_id, replica_id, node_id, gpu_indices)"
                " VALUES (:shard_id, :replica_id, :node_id, ARRAY[CAST(:gpu AS int)])"
            ),
            {"shard_id": shard_id, "replica_id": replica_id, "node_id": node_id, "gpu": gpu},
        )
        if holding:
            await conn.execute(
                text(
                    "INSERT INTO allocated_gpus (node_id, gpu_index, shard_id, gpu_class)"
                    " VALUES (:node_id, :gpu, :shard_id, 'H100-80GB')"
                ),
                {"shard_id": shard_id, "node_id": node_id, "gpu": gpu},
            )
        yield pid, tx


def holding(count: int) -> Any:
    async def grant(conn: Connection) -> Any:
        request = AllocationRequest(
            "held", (ShardRequest("held-s0", "gpu-07", tuple(range(count))),)
        )
        return await allocations.allocate(conn, request)

    return grant
