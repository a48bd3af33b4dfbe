"""place with a tenant's quota in force, against place without one, in the same rounds (issue 46).

Issue 46's target: at 10,000 nodes, a place charged to a tenant with a quota
for the class (its limit checked in the claiming statement: the tenant's
advisory lock, the quota row locked and compared, the counter kept by the
held GPUs' triggers) costs at most 1.1x a place charged to a tenant
without one (the default tenant: no row to lock, no counter). Both are asked
through the service's GraphQL app in this process (httpx's ASGI transport,
no sockets), one request at a time, on the synthetic cluster of
benchmarks/cluster.py. Each round times one place of 1x H100-80GB of each
kind, in alternating order (so neither is always the one after a release),
each released untimed with its announcement sent before the next timed
call; the figures are the medians and their ratio, measured in the same run.

    python -m benchmarks.tenancy [--nodes 10000] [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import httpx

from benchmarks.bench import Bench
from benchmarks.fit import run
from benchmarks.measure import Figure
from benchmarks.results import Row
from service.config import Settings
from service.database.db import create_engine, dispose
from service.event_log.event_announcements import drain_announcements
from service.web.app import create_app

# The name the suite's results page judges the target by.
ROW = "place 1x H100-80GB charged to a tenant with a quota p50, 1 caller in-process"
TENANT = "bench-quota"
PLACE = """
mutation Place($input: PlaceInput!) {
  place(input: $input) { __typename ... on Allocated { allocations { nodeId } } }
}
"""
RELEASE = "mutation R($id: ID!) { releaseReplica(replicaId: $id) }"
SET_TENANT = "mutation S($input: TenantInput!) { setTenant(input: $input) { id } }"
REMOVE_TENANT = "mutation R($id: ID!) { removeTenant(id: $id) }"


async def _post(client: httpx.AsyncClient, query: str, variables: dict[str, Any]) -> Any:
    response = await client.post("/graphql", json={"query": query, "variables": variables})
    body = response.json()
    assert not body.get("errors"), body
    return body["data"]


async def measure(url: str, rounds: int) -> dict[str, list[float]]:
    settings = Settings(database_url=url)
    engine = create_engine(url, settings)
    app = create_app(settings, engine=engine)
    times: dict[str, list[float]] = {"without": [], "quota": []}
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            # A limit far above what the rounds hold: every place is within it.
            quotas = [{"gpuClass": "H100-80GB", "guaranteed": 8, "limit": 100_000}]
            await _post(client, SET_TENANT, {"input": {"id": TENANT, "quotas": quotas}})
            for i in range(rounds + 3):
                kinds = ("without", "quota") if i % 2 == 0 else ("quota", "without")
                for kind in kinds:
                    replica = f"bench-tenancy-{kind}-{i}"
                    shape = {"replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": 1}
                    if kind == "quota":
                        shape["tenant"] = TENANT
                    started = time.perf_counter()
                    placed = await _post(client, PLACE, {"input": shape})
                    took = time.perf_counter() - started
                    # An Unplaceable answer is quick and would flatter a figure.
                    assert placed["place"]["__typename"] == "Allocated", placed
                    await _post(client, RELEASE, {"id": replica})
                    await drain_announcements(engine)
                    if i >= 3:  # warm-up rounds left out
                        times[kind].append(took * 1000)
            # Later sections find the cluster as loaded: no tenant left behind.
            await _post(client, REMOVE_TENANT, {"id": TENANT})
    finally:
        await dispose(engine)
    return times


async def measure_tenancy(bench: Bench) -> None:
    """The suite's `tenancy` section: the figures above on the size's own cluster, as a Row."""
    rounds = 5 if bench.quick else bench.rounds * 8
    times = await measure(bench.url, rounds)
    bench.results.add(
        Row(
            bench.size,
            ROW,
            "ms",
            Figure(times["quota"]),
            "the same, charged to a tenant without a quota (default), same rounds",
            Figure(times["without"]),
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
    without, quota = (statistics.median(times[k]) for k in ("without", "quota"))
    print(
        f"{args.nodes} nodes, median of {args.rounds}: place 1x H100-80GB {without:.2f} ms "
        f"without a quota, {quota:.2f} ms with one in force ({quota / without:.2f}x, "
        "target <= 1.1x)"
    )


if __name__ == "__main__":
    main()
