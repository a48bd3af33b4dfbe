"""Two service processes on one database, many schedulers racing for the same GPUs over HTTP.

Process memory cannot help here: only the database's locks and constraints
stand between two processes and a GPU booked twice.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.reports import (
    ALLOCATE,
    PLACE,
    REGISTER,
    allocation,
    node_input,
    placement,
    shard,
)

IB_A = {"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}
NODES = [f"gpu-{i:02d}" for i in range(4)]
CAPACITY = 8 * len(NODES)


def allocate_requests() -> list[dict[str, Any]]:
    """40 scheduler requests for GPU pairs and quads that overlap one another."""
    requests: list[dict[str, Any]] = []
    for i in range(40):
        node = NODES[i % len(NODES)]
        start = 2 * (i % 4)
        size = 4 if i % 5 == 0 and start <= 4 else 2
        gpus = range(start, start + size)
        requests.append(allocation(f"alloc-{i}", shard(f"alloc-{i}-s0", node, *gpus)))
    return requests


def place_requests() -> list[dict[str, Any]]:
    """24 requests for 2 GPUs each: more than 16 pairs, so together they fill what is left."""
    return [placement(f"place-{i}", gpusPerShard=2) for i in range(24)]


async def post(client: httpx.AsyncClient, url: str, query: str, variables: Any) -> Any:
    response = await client.post(url, json={"query": query, "variables": variables})
    assert response.status_code == 200, (response.status_code, response.text)
    body = response.json()
    assert "errors" not in body, body
    return body["data"]


async def test_two_processes_never_book_a_gpu_twice(
    live_service_factory: Any, engine: AsyncEngine
) -> None:
    first, second = await asyncio.gather(
        asyncio.to_thread(live_service_factory), asyncio.to_thread(live_service_factory)
    )
    async with httpx.AsyncClient(timeout=60) as client:
        for node_id in NODES:
            await post(client, first.url, REGISTER, {"input": node_input(node_id, fabrics=[IB_A])})

        calls = [(ALLOCATE, v, "allocate") for v in allocate_requests()] + [
            (PLACE, v, "place") for v in place_requests()
        ]
        # Interleave the kinds and alternate the processes.
        calls.sort(key=lambda c: hash(str(c[1])) % 1000)
        results = await asyncio.gather(
            *(
                post(client, (first, second)[i % 2].url, query, variables)
                for i, (query, variables, _) in enumerate(calls)
            )
        )

    answers = [data[field] for data, (_, _, field) in zip(results, calls, strict=True)]
    kinds = Counter(a["__typename"] for a in answers)
    granted = [
        (a["nodeId"], g)
        for answer in answers
        if answer["__typename"] == "Allocated"
        for a in answer["allocations"]
        for g in a["gpuIndices"]
    ]
    assert len(granted) == len(set(granted)), "a GPU was granted to two requests"
    assert len(granted) == CAPACITY
    rejections = Counter(a["code"] for a in answers if a["__typename"] == "AllocationRejected")
    assert set(rejections) <= {"GPU_TAKEN"}
    assert kinds["Allocated"] + kinds["AllocationRejected"] + kinds["Unplaceable"] == len(calls)

    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT node_id, gpu_index FROM allocated_gpus"))
        in_db = sorted((r.node_id, r.gpu_index) for r in rows)
        pools = await conn.execute(text("SELECT sum(free), sum(allocated) FROM gpu_pools"))
        free, allocated = pools.one()
    assert in_db == sorted(granted)
    assert (free, allocated) == (0, CAPACITY)
