"""place and freeGpus with 1% of the GPUs tainted, against the same cluster untainted.

Issue 38's target: at 10,000 nodes, with 1% of the GPUs tainted, `place` and
`freeGpus` stay within 1.1x of their figures on the untainted cluster. Both
are asked through the service's GraphQL app in this process (httpx's ASGI
transport, no sockets), one request at a time, on the synthetic cluster of
benchmarks/cluster.py. Rounds on the cluster as loaded come first (the
baseline); then 1% of the GPUs, drawn with a fixed seed from every class,
are tainted through the API (taintGpus, two in three NO_SCHEDULE, the rest
PREFER_NO_SCHEDULE: withheld GPUs and last-resort ones), the same rounds run
again, and the taints are lifted so later sections find the cluster as
loaded, and the untainted rounds run once more: the baseline is both sides
of the tainted rounds, so a machine that got busier meanwhile does not read
as the taints' cost. Each round times one `place` of 1x H100-80GB (released untimed) and
one first page of freeGpus(H100-80GB, minFree 4, first 50).

    python -m benchmarks.taints [--nodes 10000] [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections import defaultdict
from typing import Any

import httpx

from benchmarks.bench import Bench
from benchmarks.fit import run
from benchmarks.measure import Figure
from benchmarks.results import Row
from service.config import Settings
from service.database.db import create_engine, dispose
from service.web.app import create_app

SHARE = 0.01
SEED = 38
PLACE = """
mutation Place($input: PlaceInput!) {
  place(input: $input) { __typename ... on Allocated { allocations { nodeId } } }
}
"""
RELEASE = "mutation R($id: ID!) { releaseReplica(replicaId: $id) }"
FREE = """
query Free { freeGpus(gpuClass: "H100-80GB", minFree: 4, first: 50) { node { id } gpuIndices } }
"""
TAINT = """
mutation T($node: ID!, $indices: [Int!]!, $taint: TaintInput!) {
  taintGpus(nodeId: $node, indices: $indices, taint: $taint) { index }
}
"""
UNTAINT = """
mutation U($node: ID!, $indices: [Int!]!, $key: String!) {
  untaintGpus(nodeId: $node, indices: $indices, key: $key) { index }
}
"""


async def _post(client: httpx.AsyncClient, query: str, variables: dict[str, Any]) -> Any:
    response = await client.post("/graphql", json={"query": query, "variables": variables})
    body = response.json()
    assert not body.get("errors"), body
    return body["data"]


async def _rounds(client: httpx.AsyncClient, rounds: int, tag: str) -> dict[str, list[float]]:
    """Milliseconds per round of one place (then released) and one freeGpus page."""
    place: list[float] = []
    free: list[float] = []
    for i in range(rounds + 3):
        replica = f"bench-taints-{tag}-{i}"
        variables = {"input": {"replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": 1}}
        started = time.perf_counter()
        placed = await _post(client, PLACE, variables)
        took = time.perf_counter() - started
        # An Unplaceable answer is quick and would flatter the tainted figure.
        assert placed["place"]["__typename"] == "Allocated", placed
        await _post(client, RELEASE, {"id": replica})
        started = time.perf_counter()
        answer = await _post(client, FREE, {})
        listed = time.perf_counter() - started
        assert answer["freeGpus"], "freeGpus answered no node"
        if i >= 3:  # warm-up rounds left out
            place.append(took * 1000)
            free.append(listed * 1000)
    return {"place": place, "freeGpus": free}


async def _chosen(client: httpx.AsyncClient, url: str) -> dict[str, list[int]]:
    """1% of every GPU, by node, drawn with a fixed seed (ids read once, as a script would)."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT node_id, idx FROM gpus ORDER BY node_id, idx")
    finally:
        await conn.close()
    picked = random.Random(SEED).sample(list(rows), max(1, round(SHARE * len(rows))))
    by_node: dict[str, list[int]] = defaultdict(list)
    for r in picked:
        by_node[r["node_id"]].append(r["idx"])
    return by_node


async def measure(url: str, rounds: int) -> dict[str, list[float]]:
    settings = Settings(database_url=url)
    engine = create_engine(url, settings)
    app = create_app(settings, engine=engine)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            before = await _rounds(client, rounds, "before")
            chosen = await _chosen(client, url)
            keys = {}
            for n, (node, indices) in enumerate(sorted(chosen.items())):
                effect = "PREFER_NO_SCHEDULE" if n % 3 == 2 else "NO_SCHEDULE"
                keys[node] = f"bench-{effect.lower()}"
                taint = {"key": keys[node], "effect": effect, "reason": "benchmark: 1% tainted"}
                await _post(client, TAINT, {"node": node, "indices": indices, "taint": taint})
            tainted = sum(len(i) for i in chosen.values())
            print(f"tainted {tainted} GPUs on {len(chosen)} nodes")
            after = await _rounds(client, rounds, "after")
            for node, indices in chosen.items():
                await _post(client, UNTAINT, {"node": node, "indices": indices, "key": keys[node]})
            # Untainted again: the baseline is both sides of the tainted rounds,
            # so a machine that got busier meanwhile does not read as a cost.
            again = await _rounds(client, rounds, "again")
    finally:
        await dispose(engine)
    return {
        "place": before["place"] + again["place"],
        "freeGpus": before["freeGpus"] + again["freeGpus"],
        "place_tainted": after["place"],
        "freeGpus_tainted": after["freeGpus"],
        "tainted": [float(tainted)],
    }


async def measure_taints(bench: Bench) -> None:
    """The suite's `taints` section: the figures above on the size's own cluster, as Rows."""
    rounds = 5 if bench.quick else bench.rounds * 4
    times = await measure(bench.url, rounds)
    note = f"median of {rounds} rounds; {int(times['tainted'][0]):,} GPUs tainted"
    for name, key in (
        ("place 1x H100-80GB", "place"),
        ("freeGpus(H100-80GB, minFree 4, first 50)", "freeGpus"),
    ):
        bench.results.add(
            Row(
                bench.size,
                f"{name} with 1% of GPUs tainted p50, 1 caller in-process",
                "ms",
                Figure(times[f"{key}_tainted"]),
                "the same, untainted, same run",
                Figure(times[key]),
                note=note,
                better="lower",
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    times = asyncio.run(run(args.nodes, args.rounds, measure))
    for key in ("place", "freeGpus"):
        base, tainted = (statistics.median(times[k]) for k in (key, f"{key}_tainted"))
        print(
            f"{args.nodes} nodes, median of {args.rounds}: {key} {base:.2f} ms untainted, "
            f"{tainted:.2f} ms with 1% tainted ({tainted / base:.2f}x, target <= 1.1x)"
        )


if __name__ == "__main__":
    main()
