"""A place that must preempt, against a place on free GPUs, in the same rounds (issue 46).

Issue 46's target: at 10,000 nodes, with every H100 held and half the fleet's
H100 nodes held by replicas of a lower priority, a place of 8 H100 with
`preemption: LOWER_PRIORITY` (it finds no free node, searches the victims,
tries the least set, locks, frees one replica and claims on its GPUs, all in
its transaction) costs at most 3x a place of 8 H100 on free GPUs. Both are
asked through the service's GraphQL app in this process (httpx's ASGI
transport, no sockets), one request at a time, on the synthetic cluster of
benchmarks/cluster.py with its H100s held as above (written in bulk by SQL:
setup, not the figure). Each round, in alternating order: one replica of
priority 100 is released (untimed) and a place of 8 times the place on those
free GPUs; and a place of 8 at priority 50 with LOWER_PRIORITY times the
preemption. Each is then put back untimed (the placed replica released, the
held one allocated again on its GPUs), so every round finds the fleet as the
first did. The figures are the medians and their ratio, measured in the same
run.

    python -m benchmarks.preemption [--nodes 10000] [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import asyncpg
import httpx
from sqlalchemy import text

from benchmarks.bench import Bench
from benchmarks.fit import run
from benchmarks.measure import Figure
from benchmarks.results import Row
from service.config import Settings
from service.database import connections
from service.database.db import create_engine, dispose
from service.event_log.event_announcements import drain_announcements
from service.scheduling.gpu_pools import refresh_pools
from service.scheduling.placement.statements import offered_indices_sql
from service.web.app import create_app

# The name the suite's results page judges the target by.
ROW = "place 8x H100-80GB that must preempt (half the fleet lower priority) p50"
PLACE = """
mutation Place($input: PlaceInput!) {
  place(input: $input) {
    __typename
    ... on Allocated { allocations { nodeId gpuIndices } preempted { replicaId priority } }
    ... on Unplaceable { message }
  }
}
"""
ALLOCATE = """
mutation A($input: AllocateInput!) {
  allocate(input: $input) { __typename ... on AllocationRejected { code message } }
}
"""
RELEASE = "mutation R($id: ID!) { releaseReplica(replicaId: $id) }"
# Every H100 node's offered GPUs held by one replica of its own: priority 0 on
# every other node, 100 on the rest.
_FILL = text(
    f"""
    WITH offered AS (
        SELECT p.node_id, {offered_indices_sql(False, "p.node_id")} AS indices,
               row_number() OVER (ORDER BY p.node_id) AS k
        FROM gpu_pools p WHERE p.gpu_class = :cls
    ), s AS (
        INSERT INTO shards (shard_id, replica_id, node_id, gpu_indices, tenant, priority,
                            borrowed)
        SELECT 'bench-fill-' || o.node_id || '-s0', 'bench-fill-' || o.node_id, o.node_id,
               o.indices, 'default', CASE WHEN o.k % 2 = 0 THEN 0 ELSE 100 END, true
        FROM offered o WHERE cardinality(o.indices) > 0
        RETURNING shard_id, node_id, gpu_indices
    ), g AS (
        INSERT INTO allocated_gpus (node_id, gpu_index, shard_id, tenant, gpu_class)
        SELECT s.node_id, i, s.shard_id, 'default', :cls FROM s CROSS JOIN unnest(s.gpu_indices) i
    )
    SELECT s.node_id FROM s
    """
)
_UNFILL = text(
    "DELETE FROM shards WHERE replica_id LIKE 'bench-fill-%' OR replica_id LIKE 'bench-preempt-%'"
    " RETURNING node_id"
)
# One held replica of priority 100, and one of priority 0: their ids, nodes and GPUs.
_HELD = text(
    """
    SELECT s.replica_id, s.node_id, s.gpu_indices, s.priority FROM shards s
    WHERE s.replica_id LIKE 'bench-fill-%' AND s.priority = :priority
      AND cardinality(s.gpu_indices) = 8
    ORDER BY s.replica_id LIMIT 1
    """
)
CLS = "H100-80GB"


async def _post(client: httpx.AsyncClient, query: str, variables: dict[str, Any]) -> Any:
    response = await client.post("/graphql", json={"query": query, "variables": variables})
    body = response.json()
    assert not body.get("errors"), body
    return body["data"]


async def _hold(
    client: httpx.AsyncClient, replica: str, node: str, gpus: list[int], priority: int
) -> None:
    shard = {"shardId": f"{replica}-s0", "nodeId": node, "gpuIndices": gpus}
    got = await _post(
        client, ALLOCATE, {"input": {"replicaId": replica, "priority": priority, "shards": [shard]}}
    )
    assert got["allocate"]["__typename"] == "Allocated", got


async def measure(url: str, rounds: int) -> dict[str, list[float]]:
    settings = Settings(database_url=url)
    engine = create_engine(url, settings)
    app = create_app(settings, engine=engine)
    # Per kind, the timed places' times (ms), and their round trips to the
    # database as connections.statement_observers sees them (statements,
    # savepoints and BEGIN; not COMMIT; the event announcement, sent after
    # commit whenever its flush runs, left out).
    times: dict[str, list[float]] = {"free": [], "preempt": [], "free_sql": [], "preempt_sql": []}
    sent: list[str] = []

    def observe(statement: str, args: Any) -> None:
        if "pg_notify" not in statement:
            sent.append(statement)

    try:
        async with engine.begin() as conn:
            filled = [r.node_id for r in await conn.execute(_FILL, {"cls": CLS})]
            await refresh_pools(conn, filled)
        # As benchmarks/cluster.py leaves its bulk load (and autovacuum a
        # fleet's tables): statistics, and pages marked visible for the
        # index-only walks of both kinds of place.
        raw = await asyncpg.connect(url)
        try:
            await raw.execute("VACUUM ANALYZE")
        finally:
            await raw.close()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            for i in range(rounds + 3):
                kinds = ("free", "preempt") if i % 2 == 0 else ("preempt", "free")
                for kind in kinds:
                    replica = f"bench-preempt-{kind}-{i}"
                    shape: dict[str, Any] = {
                        "replicaId": replica,
                        "gpuClass": CLS,
                        "gpusPerShard": 8,
                    }
                    async with engine.connect() as conn:
                        high = (await conn.execute(_HELD, {"priority": 100})).one()
                    if kind == "free":
                        await _post(client, RELEASE, {"id": high.replica_id})
                        await drain_announcements(engine)
                    else:
                        shape |= {"priority": 50, "preemption": "LOWER_PRIORITY"}
                    sent.clear()
                    connections.statement_observers.append(observe)
                    try:
                        started = time.perf_counter()
                        placed = await _post(client, PLACE, {"input": shape})
                        took = time.perf_counter() - started
                    finally:
                        connections.statement_observers.remove(observe)
                    answer = placed["place"]
                    # An Unplaceable answer is quick and would flatter a figure.
                    assert answer["__typename"] == "Allocated", answer
                    (where,) = answer["allocations"]
                    if kind == "free":
                        assert answer["preempted"] == [], answer
                        back, priority = high.replica_id, 100
                    else:
                        (victim,) = answer["preempted"]
                        assert victim["priority"] == 0, victim
                        back, priority = victim["replicaId"], 0
                    await _post(client, RELEASE, {"id": replica})
                    await _hold(client, back, where["nodeId"], where["gpuIndices"], priority)
                    await drain_announcements(engine)
                    if i >= 3:  # warm-up rounds left out
                        times[kind].append(took * 1000)
                        times[f"{kind}_sql"].append(len(sent))
        # Later sections find the cluster as loaded.
        async with engine.begin() as conn:
            emptied = [r.node_id for r in await conn.execute(_UNFILL)]
            await refresh_pools(conn, emptied)
    finally:
        await dispose(engine)
    return times


async def measure_preemption(bench: Bench) -> None:
    """The suite's `preemption` section: the figures above on the size's own cluster, as a Row."""
    rounds = 5 if bench.quick else bench.rounds * 8
    times = await measure(bench.url, rounds)
    bench.results.add(
        Row(
            bench.size,
            ROW,
            "ms",
            Figure(times["preempt"]),
            "place 8x H100-80GB on free GPUs, same fleet, same rounds",
            Figure(times["free"]),
            note=f"median of {rounds} rounds, the two kinds alternating",
            better="lower",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    times = asyncio.run(run(args.nodes, args.rounds, measure))
    free, preempt, free_sql, preempt_sql = (
        statistics.median(times[k]) for k in ("free", "preempt", "free_sql", "preempt_sql")
    )
    print(
        f"{args.nodes} nodes, median of {args.rounds}: place 8x H100-80GB {free:.2f} ms on free "
        f"GPUs, {preempt:.2f} ms preempting ({preempt / free:.2f}x, target <= 3x); "
        f"round trips {free_sql:.0f} and {preempt_sql:.0f}"
    )


if __name__ == "__main__":
    main()
