"""The benchmarks' raw floors write the inventory's own tables: they must keep its rules.

benchmarks/allocation.py measures the service's claims against plain SQL on
the same schema. When issue 30 added gpu_pools.free_indices (its length is
`free`, a CHECK), the floors kept updating `free` alone, and the benchmark
stopped on the CHECK in CI. Here each floor statement runs against the
migrated schema on nodes registered through the API, and the pools it leaves
must be what the service itself would count.
"""

from __future__ import annotations

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks.allocation import ALLOCATE_CLASS, RAW_ALLOCATE, RAW_LOCK, raw_claim
from tests.support.api import Api
from tests.support.reports import A100, H100, REGISTER, gpus, node_input

FREE_GPUS = """
query($c: String!) { freeGpus(gpuClass: $c) { node { id } gpuIndices } }
"""


async def pools(engine: AsyncEngine) -> list[tuple[str, str, int, list[int]]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT node_id, gpu_class, free, free_indices FROM gpu_pools "
                "ORDER BY node_id, gpu_class"
            )
        )
        return [(r.node_id, r.gpu_class, r.free, list(r.free_indices)) for r in rows]


async def test_the_raw_floors_leave_the_pools_as_the_service_counts_them(
    api: Api, engine: AsyncEngine, database_url: str
) -> None:
    await api(REGISTER, {"input": node_input("h-1", gpus=gpus(H100, 4))})
    await api(REGISTER, {"input": node_input("a-1", gpus=gpus(A100, 4))})
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    try:
        assert await raw_claim(pool, ["h-1"], "bench-r1") == 1
        async with pool.acquire() as conn, conn.transaction():
            await conn.fetchval(RAW_LOCK, "a-1")
            await conn.execute(RAW_ALLOCATE, "bench-ra1", "a-1", 2, ALLOCATE_CLASS)
    finally:
        await pool.close()

    assert await pools(engine) == [
        ("a-1", "A100-40GB", 3, [0, 1, 3]),
        ("h-1", "H100-80GB", 3, [1, 2, 3]),
    ]
    # And the service's own answer reads the same pools.
    for gpu_class, node, free in (("A100-40GB", "a-1", [0, 1, 3]), ("H100-80GB", "h-1", [1, 2, 3])):
        answer = await api(FREE_GPUS, {"c": gpu_class})
        assert answer["freeGpus"] == [{"node": {"id": node}, "gpuIndices": free}]
