"""Allocation: `place` and `allocate` per second, 32 schedulers through two service processes.

Every scheduler asks for the same class at once (the case where a fixed
first-fit order collapses). `place` is also measured with each call in a
transaction of its own (service/scheduling/place_batches.py off), on as many service
processes of its own, in the same rounds. `place` takes one H100 per claim; `allocate` names
one A100 per claim, from free GPUs split between the schedulers beforehand, so
a rejection there is a bug, not contention. After each round, every GPU is
checked for double booking (two shards naming one GPU, or a pool count that
disagrees with the held GPUs), then the round's shards are released by SQL.

The baselines are raw asyncpg transactions doing the same claim: lock a
candidate node with FOR NO KEY UPDATE SKIP LOCKED from a random starting
point, pick its free GPUs, insert the shard and the held GPUs, adjust the pool.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.bench import Bench, close_all, services_cpu
from benchmarks.client import Connection, request_body
from benchmarks.cluster import RECOUNT_POOLS
from benchmarks.measure import Exhausted, Figure, throughput
from benchmarks.results import Row, fmt
from benchmarks.services import HEADERS, Service

SCHEMA = Path(__file__).resolve().parent.parent / "schema.graphql"
SCHEDULERS = 32
PLACE_CLASS = "H100-80GB"
ALLOCATE_CLASS = "A100-40GB"

PLACE = """
mutation Place($input: PlaceInput!) {
  place(input: $input) {
    __typename
    ... on Allocated { allocations { nodeId gpuIndices } }
    ... on Unplaceable { message }
    ... on AllocationRejected { code message }
  }
}
"""

ALLOCATE = """
mutation Allocate($input: AllocateInput!) {
  allocate(input: $input) {
    __typename
    ... on Allocated { allocations { nodeId gpuIndices } }
    ... on AllocationRejected { code message }
  }
}
"""

# Two shards naming one GPU, or a node whose pool disagrees with what is held.
DOUBLE_BOOKED = """
SELECT count(*) FROM (
    SELECT s.node_id, i FROM shards s, unnest(s.gpu_indices) AS i
    GROUP BY s.node_id, i HAVING count(*) > 1
) twice
"""
POOLS_WRONG = """
SELECT count(*) FROM gpu_pools p
WHERE p.allocated <> (SELECT count(*) FROM allocated_gpus a JOIN gpus g
                      ON g.node_id = a.node_id AND g.idx = a.gpu_index
                      WHERE a.node_id = p.node_id AND g.gpu_class = p.gpu_class)
"""
RELEASE = "DELETE FROM shards WHERE replica_id LIKE 'bench-%'"
RECOUNT = RECOUNT_POOLS

FREE_SLOTS = """
SELECT g.node_id, g.idx FROM gpus g JOIN nodes n ON n.id = g.node_id
WHERE n.state = 'ready' AND g.gpu_class = $1 AND g.healthy AND NOT (g.withheld OR g.last_resort)
  AND NOT EXISTS (SELECT 1 FROM allocated_gpus a WHERE a.node_id = g.node_id AND a.gpu_index = g.idx)
ORDER BY g.node_id, g.idx
"""

# `p.free > 0` repeats ix_gpu_pools_free's predicate so the planner may use it
# (a parameter alone does not imply it); without it the claim slowed tenfold
# at 100k nodes. `n.id >= $3` likewise: without it the planner merge-joined
# nodes from its first row up to the random start (half the table on
# average), which made this baseline collapse at 100k nodes.
RAW_CANDIDATE = """
SELECT n.id FROM gpu_pools p JOIN nodes n ON n.id = p.node_id
WHERE p.gpu_class = $1 AND p.schedulable AND p.free > 0 AND p.free >= $2 AND p.node_id >= $3
  AND n.id >= $3
ORDER BY p.node_id LIMIT 1
FOR NO KEY UPDATE OF n SKIP LOCKED
"""
RAW_CLAIM = """
WITH free AS (
    SELECT g.idx FROM gpus g
    WHERE g.node_id = $1 AND g.gpu_class = $2 AND g.healthy AND NOT (g.withheld OR g.last_resort)
      AND NOT EXISTS (SELECT 1 FROM allocated_gpus a
                      WHERE a.node_id = g.node_id AND a.gpu_index = g.idx)
    ORDER BY g.idx LIMIT $3
), shard AS (
    INSERT INTO shards (shard_id, replica_id, node_id, gpu_indices)
    SELECT $4, $4, $1, array_agg(idx) FROM free HAVING count(*) = $3
    RETURNING shard_id, gpu_indices
), held AS (
    INSERT INTO allocated_gpus (node_id, gpu_index, shard_id, gpu_class)
    SELECT $1, unnest(gpu_indices), shard_id, $2 FROM shard
)
UPDATE gpu_pools SET allocated = allocated + $3, free = free - $3,
    free_indices = ARRAY(SELECT i FROM unnest(free_indices) i
                         WHERE i NOT IN (SELECT unnest(gpu_indices) FROM shard) ORDER BY i),
    free_groups = ARRAY(SELECT u.grp FROM unnest(free_indices, free_groups) u(i, grp)
                        WHERE u.i NOT IN (SELECT unnest(gpu_indices) FROM shard) ORDER BY u.i)
WHERE node_id = $1 AND gpu_class = $2 AND EXISTS (SELECT 1 FROM shard)
RETURNING node_id
"""
RAW_LOCK = "SELECT id FROM nodes WHERE id = $1 FOR NO KEY UPDATE"
RAW_ALLOCATE = """
WITH shard AS (
    INSERT INTO shards (shard_id, replica_id, node_id, gpu_indices)
    VALUES ($1, $1, $2, ARRAY[$3::int]) RETURNING shard_id
), held AS (
    INSERT INTO allocated_gpus (node_id, gpu_index, shard_id, gpu_class)
    SELECT $2, $3, shard_id, g.gpu_class FROM shard, gpus g WHERE g.node_id = $2 AND g.idx = $3
)
UPDATE gpu_pools SET allocated = allocated + 1, free = free - 1,
    free_indices = array_remove(free_indices, $3::int),
    free_groups = ARRAY(SELECT u.grp FROM unnest(free_indices, free_groups) u(i, grp)
                        WHERE u.i <> $3::int ORDER BY u.i)
WHERE node_id = $2 AND gpu_class = $4
"""


async def raw_claim(pool: asyncpg.Pool, node_ids: list[str], shard: str) -> int:
    """One baseline claim of one H100 from a random starting node; 1 when it got one."""
    start = random.choice(node_ids)
    async with pool.acquire() as conn, conn.transaction():
        node = await conn.fetchval(RAW_CANDIDATE, PLACE_CLASS, 1, start)
        if node is None:
            node = await conn.fetchval(RAW_CANDIDATE, PLACE_CLASS, 1, "")
        if node is None:
            return 0
        done = await conn.fetchval(RAW_CLAIM, node, PLACE_CLASS, 1, shard)
    return 1 if done else 0


async def check_and_release(bench: Bench) -> int:
    """Double-booked GPUs plus wrong pools found; then the benchmark's shards are released."""
    conn = await asyncpg.connect(bench.url)
    try:
        wrong = int(await conn.fetchval(DOUBLE_BOOKED)) + int(await conn.fetchval(POOLS_WRONG))
        await conn.execute(RELEASE)
        await conn.execute(RECOUNT)
        return wrong
    finally:
        await conn.close()


async def measure_allocation(bench: Bench, statements: dict[str, str] | None = None) -> int:
    """Returns the number of double-booked GPUs and wrong pools seen (must be 0)."""
    if "place(" not in SCHEMA.read_text():
        bench.results.note("allocation skipped: `place` is not in schema.graphql yet")
        return 0
    return await _rounds(bench, statements or {})


# Each `place` in its own transaction, as before service/scheduling/place_batches.py,
# on service processes of their own, started for their part of each round
# and stopped after it (their idle connections and the raw baselines' pool
# would pass PostgreSQL's max_connections).
ALONE = {
    "INVENTORY_PLACE_BATCH": "1",
    "INVENTORY_PLACE_TRANSACTIONS": str(SCHEDULERS),
    "INVENTORY_SHUTDOWN_DRAIN": "0",
}


async def _rounds(bench: Bench, statements: dict[str, str]) -> int:
    ids = itertools.count()
    place, raw_place, allocate, raw_allocate = Figure(), Figure(), Figure(), Figure()
    place_cpu, allocate_cpu = Figure(), Figure()
    # PostgreSQL's CPU per claim (its own processes), when the server runs here.
    place_db = Figure()
    # place with nvlinkShards (issue 20), against `place` in the same rounds.
    nvlink_place, nvlink_cpu = Figure(), Figure()
    place_alone, place_alone_cpu = Figure(), Figure()
    outcomes: dict[str, int] = {}
    wrong = 0

    def note(kind: str) -> None:
        outcomes[kind] = outcomes.get(kind, 0) + 1

    for _ in range(bench.rounds):
        # place through the service
        clients = bench.connections(SCHEDULERS)

        def placer(
            c: Connection, warm: bool = False, **options: bool
        ) -> Callable[[], Awaitable[int]]:
            label = "place nvlinkShards" if options else "place"
            if warm:
                label = "warm-up place"

            async def call() -> int:
                body = request_body(
                    PLACE,
                    {"input": {"replicaId": f"bench-p{next(ids)}", "gpuClass": PLACE_CLASS,
                               "shards": 1, "gpusPerShard": 1, **options}},
                )  # fmt: skip
                reply = await c.graphql(body)
                kind = reply["data"]["place"]["__typename"]
                note(f"{label} {kind}")
                if kind == "Unplaceable":
                    raise Exhausted
                return 1 if kind == "Allocated" else 0

            return call

        # Warmed up as the processes below are (statements prepared on each
        # pooled connection, the plans PostgreSQL picks after five runs).
        await throughput([placer(c, warm=True) for c in clients], 0.3)
        wrong += await check_and_release(bench)
        value, failed = await bench.throughput([placer(c) for c in clients], place_cpu, place_db)
        place.add(value)
        outcomes["place failed requests"] = outcomes.get("place failed requests", 0) + failed
        await close_all(clients)
        wrong += await check_and_release(bench)

        # the same, each call in a transaction of its own
        alone = [Service(bench.url, ALONE) for _ in bench.services]
        try:
            for service in alone:
                service.start()
            clients = [Connection(alone[i % len(alone)].url, HEADERS) for i in range(SCHEDULERS)]
            # Warmed up first, as `place` above is: new processes also open connections.
            await throughput([placer(c, warm=True) for c in clients], 0.3)
            wrong += await check_and_release(bench)
            before = services_cpu(alone)
            start = time.perf_counter()
            value, failed = await throughput([placer(c) for c in clients], bench.seconds)
            done = value * (time.perf_counter() - start)
            if done:
                place_alone_cpu.add((services_cpu(alone) - before) / done * 1000)
            place_alone.add(value)
            outcomes["place alone failed requests"] = (
                outcomes.get("place alone failed requests", 0) + failed
            )
            await close_all(clients)
        finally:
            for service in alone:
                service.stop()
        wrong += await check_and_release(bench)

        # the same with nvlinkShards: every candidate's NVLink groups checked in SQL
        clients = bench.connections(SCHEDULERS)
        await throughput([placer(c, warm=True, nvlinkShards=True) for c in clients], 0.3)
        wrong += await check_and_release(bench)
        value, failed = await bench.throughput(
            [placer(c, nvlinkShards=True) for c in clients], nvlink_cpu
        )
        nvlink_place.add(value)
        outcomes["place nvlinkShards failed requests"] = (
            outcomes.get("place nvlinkShards failed requests", 0) + failed
        )
        await close_all(clients)
        wrong += await check_and_release(bench)

        # allocate through the service, each scheduler with its own free GPUs
        slots = [tuple(r) for r in await bench.sql(FREE_SLOTS, ALLOCATE_CLASS)]
        random.Random(7).shuffle(slots)
        clients = bench.connections(SCHEDULERS)

        def allocator(c: Connection, mine: list[tuple[Any, ...]]) -> Callable[[], Awaitable[int]]:
            todo = iter(mine)

            async def call() -> int:
                slot = next(todo, None)
                if slot is None:
                    note("allocate rounds ended by a scheduler out of free GPUs")
                    raise Exhausted
                shard = f"bench-a{next(ids)}"
                body = request_body(
                    ALLOCATE,
                    {"input": {"replicaId": shard, "shards": [
                        {"shardId": shard, "nodeId": slot[0], "gpuIndices": [slot[1]]}]}},
                )  # fmt: skip
                reply = await c.graphql(body)
                result = reply["data"]["allocate"]
                kind = result["__typename"]
                note(f"allocate {kind} {result.get('code', '')}".strip())
                return 1 if kind == "Allocated" else 0

            return call

        value, failed = await bench.throughput(
            [allocator(c, slots[k::SCHEDULERS]) for k, c in enumerate(clients)], allocate_cpu
        )
        allocate.add(value)
        outcomes["allocate failed requests"] = outcomes.get("allocate failed requests", 0) + failed
        await close_all(clients)
        wrong += await check_and_release(bench)

        # the raw asyncpg baselines
        node_ids = [r["id"] for r in await bench.sql("SELECT id FROM nodes ORDER BY id")]
        async with bench.pool(SCHEDULERS) as pool:

            async def claim(node_ids: list[str] = node_ids) -> int:
                if not await raw_claim(pool, node_ids, f"bench-r{next(ids)}"):
                    raise Exhausted
                return 1

            value, _ = await throughput([claim] * SCHEDULERS, bench.seconds)
            raw_place.add(value)
            wrong += await check_and_release(bench)

            slots = [tuple(r) for r in await bench.sql(FREE_SLOTS, ALLOCATE_CLASS)]
            random.Random(8).shuffle(slots)

            def raw_allocator(mine: list[tuple[Any, ...]]) -> Callable[[], Awaitable[int]]:
                todo = iter(mine)

                async def call() -> int:
                    slot = next(todo, None)
                    if slot is None:
                        raise Exhausted
                    shard = f"bench-ra{next(ids)}"
                    async with pool.acquire() as conn, conn.transaction():
                        await conn.fetchval(RAW_LOCK, slot[0])
                        await conn.execute(RAW_ALLOCATE, shard, slot[0], slot[1], ALLOCATE_CLASS)
                    return 1

                return call

            value, _ = await throughput(
                [raw_allocator(slots[k::SCHEDULERS]) for k in range(SCHEDULERS)], bench.seconds
            )
            raw_allocate.add(value)
            wrong += await check_and_release(bench)

    seen = ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items()))
    add = bench.results.add
    add(Row(bench.size, f"place 1x {PLACE_CLASS}, 32 schedulers, same class", "claims/s", place,
            "raw asyncpg, SKIP LOCKED claim", raw_place, statements.get("place", ""),
            note=f"service CPU {fmt(place_cpu.median)} ms/request; double-booked GPUs or "
                 f"wrong pools: {wrong}; {seen}"))  # fmt: skip
    add(Row(bench.size, f"place 1x {PLACE_CLASS}, 32 schedulers, calls sharing transactions",
            "claims/s", place, "each call in its own transaction (same rounds)", place_alone, "",
            note=f"service CPU {fmt(place_cpu.median)} ms/request, alone "
                 f"{fmt(place_alone_cpu.median)} ms; PostgreSQL {fmt(place_db.median)} ms/claim"))  # fmt: skip
    add(Row(bench.size, f"place 1x {PLACE_CLASS} with nvlinkShards, 32 schedulers", "claims/s",
            nvlink_place, "place without nvlinkShards (same rounds)", place, "",
            note=f"service CPU {fmt(nvlink_cpu.median)} ms/request"))  # fmt: skip
    add(Row(bench.size, f"allocate 1x {ALLOCATE_CLASS}, 32 schedulers", "claims/s", allocate,
            "raw asyncpg, lock + 1 statement", raw_allocate, statements.get("allocate", ""),
            note=f"service CPU {fmt(allocate_cpu.median)} ms/request"))  # fmt: skip
    if wrong:
        bench.results.note(f"{bench.size} nodes: {wrong} double-booked GPUs or wrong pool counts")
    return wrong
