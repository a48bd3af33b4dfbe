"""fit against place: the what-if of a TP-8 shape at 10,000 nodes, against one `place` of it.

Issue 31's target: `fit` for a TP-8 shape (1 shard of 8 H100-80GB) at 10,000
nodes costs at most 2x one `place` of that shape. Both are asked through the
service's GraphQL app in this process (httpx's ASGI transport, no sockets),
one request at a time, on the synthetic cluster of benchmarks/cluster.py
(4,000 H100 nodes among the 10,000, some held, cordoned or sick). Each round
times one `place`, releases it (untimed, so every round sees the same
cluster), then times one `fit` with nvlinkShards and one without; the figure
is the median of each and their ratio, measured in the same run.

    python -m benchmarks.fit [--nodes 10000] [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import httpx

from benchmarks.bench import Bench
from benchmarks.cluster import load
from benchmarks.database import create_database, drop_database, migrate, postgres_server
from benchmarks.measure import Figure
from benchmarks.results import Row
from service.config import Settings
from service.database.db import create_engine, dispose
from service.web.app import create_app

SHAPE = {"gpuClass": "H100-80GB", "gpusPerShard": 8}

PLACE = """
mutation Place($input: PlaceInput!) {
  place(input: $input) { __typename ... on Allocated { allocations { nodeId } } }
}
"""
RELEASE = "mutation R($id: ID!) { releaseReplica(replicaId: $id) }"
FIT = """
query Fit($shape: PlaceInput!) {
  fit(shape: $shape, first: 10) { replicas nodesOmitted limitedBy { code nodes } }
}
"""


async def _post(client: httpx.AsyncClient, query: str, variables: dict[str, Any]) -> Any:
    response = await client.post("/graphql", json={"query": query, "variables": variables})
    body = response.json()
    assert not body.get("errors"), body
    return body["data"]


async def _timed(client: httpx.AsyncClient, query: str, variables: dict[str, Any]) -> float:
    started = time.perf_counter()
    await _post(client, query, variables)
    return time.perf_counter() - started


async def measure(url: str, rounds: int) -> dict[str, list[float]]:
    settings = Settings(database_url=url)
    engine = create_engine(url, settings)
    app = create_app(settings, engine=engine)
    place_times: list[float] = []
    fit_times: list[float] = []
    nvlink_fit_times: list[float] = []
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            counted = await _post(client, FIT, {"shape": {"replicaId": "x", **SHAPE}})
            print(f"fit before the rounds: {counted['fit']}")
            for i in range(rounds + 3):
                replica = f"bench-{i}"
                started = time.perf_counter()
                placed = await _post(client, PLACE, {"input": {"replicaId": replica, **SHAPE}})
                took = time.perf_counter() - started
                # An Unplaceable answer is quick and would flatter fit's ratio.
                assert placed["place"]["__typename"] == "Allocated", placed
                await _post(client, RELEASE, {"id": replica})
                fitted = await _timed(client, FIT, {"shape": {"replicaId": "x", **SHAPE}})
                nvlink = await _timed(
                    client, FIT, {"shape": {"replicaId": "x", **SHAPE, "nvlinkShards": True}}
                )
                if i >= 3:  # warm-up rounds left out
                    place_times.append(took)
                    fit_times.append(fitted)
                    nvlink_fit_times.append(nvlink)
    finally:
        await dispose(engine)
    # Milliseconds, one per round.
    return {
        "place": [t * 1000 for t in place_times],
        "fit": [t * 1000 for t in fit_times],
        "fit_nvlink": [t * 1000 for t in nvlink_fit_times],
    }


async def measure_fit(bench: Bench) -> None:
    """The suite's `fit` section: the figures above on the size's own cluster, as Rows."""
    rounds = 5 if bench.quick else bench.rounds * 4
    times = await measure(bench.url, rounds)
    place = Figure(times["place"])
    for name, key in (("", "fit"), (" with nvlinkShards", "fit_nvlink")):
        bench.results.add(
            Row(
                bench.size,
                f"fit TP-8 (1 shard of 8 H100-80GB){name} p50, 1 caller in-process",
                "ms",
                Figure(times[key]),
                "one place of that shape, same rounds",
                place,
                note=f"median of {rounds} rounds",
                better="lower",
            )
        )


async def run(
    nodes: int,
    rounds: int,
    measure: Callable[[str, int], Awaitable[dict[str, list[float]]]] = measure,
) -> dict[str, list[float]]:
    """`measure` (this module's, or another section's) on a fresh synthetic cluster of `nodes`."""
    with postgres_server() as (server, where):
        print(f"PostgreSQL: {where}")
        url = await create_database(server)
        try:
            # Alembic runs its own event loop: in a thread, off this one.
            await asyncio.to_thread(migrate, url)
            conn = await asyncpg.connect(url)
            try:
                await load(conn, nodes)
            finally:
                await conn.close()
            figures = await measure(url, rounds)
        finally:
            await drop_database(server, url)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    times = asyncio.run(run(args.nodes, args.rounds))
    place, fit, nvlink = (statistics.median(times[k]) for k in ("place", "fit", "fit_nvlink"))
    print(
        f"{args.nodes} nodes, median of {args.rounds}: place {place:.2f} ms, "
        f"fit {fit:.2f} ms ({fit / place:.2f}x, target <= 2x), "
        f"fit nvlinkShards {nvlink:.2f} ms ({nvlink / place:.2f}x)"
    )


if __name__ == "__main__":
    main()
