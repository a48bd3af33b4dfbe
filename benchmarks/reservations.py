"""place and fit with 1,000 reservations in force, against the same cluster with none (issue 47).

Issue 47's targets, at 10,000 nodes: with 1,000 reservations set aside, a
place costs at most 1.1x a place on the cluster with none, and fit(at:) at
most 2x fit. Asked through the service's GraphQL app in this process
(httpx's ASGI transport, no sockets), one request at a time, on the
synthetic cluster of benchmarks/cluster.py (4,000 H100 nodes among the
10,000, some held, cordoned or sick). First, with no reservation: each
round times one place of 1x H100-80GB (released untimed) and one fit of a
TP-8 shape. Then 1,000 reservations are made through `reserve` (one 8-GPU
replica each, a window an hour from now, so 8,000 GPUs set aside), and
the same rounds run again, each also timing fit(at:) at an instant inside
the windows; then the reservations are released and the rounds with none
run once more (the "none" figures are both runs, so neither side is favoured
by a cache warmed or a table grown in between). The figures are medians
and their ratios, in one run.

    python -m benchmarks.reservations [--nodes 10000] [--rounds 40] [--reservations 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta
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

PLACE = """
mutation Place($input: PlaceInput!) {
  place(input: $input) { __typename ... on Allocated { allocations { nodeId } } }
}
"""
RELEASE = "mutation R($id: ID!) { releaseReplica(replicaId: $id) }"
RESERVE = "mutation R($input: ReservationInput!) { reserve(input: $input) { __typename } }"
RELEASE_RESERVATION = "mutation R($id: ID!) { releaseReservation(id: $id) { state } }"
FIT = """
query F($shape: PlaceInput!, $at: DateTime) { fit(shape: $shape, at: $at) { replicas } }
"""
TP8 = {"replicaId": "fit", "gpuClass": "H100-80GB", "gpusPerShard": 8}
# The names the suite's results page judges the targets by.
PLACE_ROW = "place 1x H100-80GB with 1,000 reservations set aside p50, 1 caller in-process"
FIT_AT_ROW = "fit(at:) TP-8 inside 1,000 reservations' windows p50, 1 caller in-process"


async def _post(client: httpx.AsyncClient, query: str, variables: dict[str, Any]) -> Any:
    response = await client.post("/graphql", json={"query": query, "variables": variables})
    body = response.json()
    assert not body.get("errors"), body
    return body["data"]


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


async def _rounds(
    client: httpx.AsyncClient, engine: Any, rounds: int, label: str, at: str | None
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"place": [], "fit": [], "fit_at": []}
    for i in range(rounds + 3):
        replica = f"bench-res-{label}-{i}"
        shape = {"replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": 1}
        started = time.perf_counter()
        placed = await _post(client, PLACE, {"input": shape})
        took = time.perf_counter() - started
        assert placed["place"]["__typename"] == "Allocated", placed
        await _post(client, RELEASE, {"id": replica})
        await drain_announcements(engine)
        started = time.perf_counter()
        await _post(client, FIT, {"shape": TP8, "at": None})
        fit_took = time.perf_counter() - started
        fit_at_took = 0.0
        if at is not None:
            started = time.perf_counter()
            await _post(client, FIT, {"shape": TP8, "at": at})
            fit_at_took = time.perf_counter() - started
        if i >= 3:  # warm-up rounds left out
            times["place"].append(took * 1000)
            times["fit"].append(fit_took * 1000)
            times["fit_at"].append(fit_at_took * 1000)
    return times


async def measure(url: str, rounds: int, reservations: int = 1000) -> dict[str, list[float]]:
    settings = Settings(database_url=url)
    engine = create_engine(url, settings)
    app = create_app(settings, engine=engine)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            # Warm-up, untimed; then the rounds with none before and after
            # the rounds with reservations (so neither is favoured by a cache
            # warmed or a table grown in between).
            await _rounds(client, engine, 3, "warm", None)
            before = await _rounds(client, engine, rounds, "none", None)
            start = datetime.now(UTC) + timedelta(hours=1)
            made = time.perf_counter()
            for k in range(reservations):
                spec = {
                    "id": f"bench-res-{k}",
                    "tenant": None,
                    "shape": TP8,
                    "count": 1,
                    "start": _iso(start + timedelta(seconds=k)),
                    "end": _iso(start + timedelta(hours=2)),
                }
                answer = await _post(client, RESERVE, {"input": spec})
                assert answer["reserve"]["__typename"] == "Reservation", answer
            made = time.perf_counter() - made
            inside = _iso(start + timedelta(hours=1))
            with_them = await _rounds(client, engine, rounds, "with", inside)
            for k in range(reservations):
                await _post(client, RELEASE_RESERVATION, {"id": f"bench-res-{k}"})
            after = await _rounds(client, engine, rounds, "none-again", None)
            none = {key: before[key] + after[key] for key in before}
    finally:
        await dispose(engine)
    return {
        "place_none": none["place"],
        "fit_none": none["fit"],
        "place": with_them["place"],
        "fit": with_them["fit"],
        "fit_at": with_them["fit_at"],
        "reserve_each": [made * 1000 / max(reservations, 1)],
    }


async def measure_reservations(bench: Bench) -> None:
    """The suite's `reservations` section: the figures above on the size's own cluster, as Rows."""
    rounds = 5 if bench.quick else bench.rounds * 8
    count = 100 if bench.quick else 1000
    times = await measure(bench.url, rounds, count)
    note = f"median of {rounds} rounds, {count} reservations"
    bench.results.add(
        Row(bench.size, PLACE_ROW, "ms", Figure(times["place"]),
            "the same with no reservation (before and after them)",
            Figure(times["place_none"]), note=note, better="lower")
    )  # fmt: skip
    bench.results.add(
        Row(bench.size, FIT_AT_ROW, "ms", Figure(times["fit_at"]),
            "fit of the same shape now, same rounds", Figure(times["fit"]), note=note,
            better="lower")
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--reservations", type=int, default=1000)
    parser.add_argument(
        "--quick", action="store_true", help="1,000 nodes, 100 reservations, 10 rounds"
    )
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.reservations, args.rounds = 1000, 100, 10

    async def measured(url: str, rounds: int) -> dict[str, list[float]]:
        return await measure(url, rounds, args.reservations)

    times = asyncio.run(run(args.nodes, args.rounds, measured))
    m = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{args.nodes} nodes, {args.reservations} reservations, median of {args.rounds}: "
        f"place {m['place_none']:.2f} ms with none, {m['place']:.2f} ms with them "
        f"({m['place'] / m['place_none']:.2f}x, target <= 1.1x); "
        f"fit {m['fit']:.2f} ms, fit(at:) {m['fit_at']:.2f} ms "
        f"({m['fit_at'] / m['fit']:.2f}x, target <= 2x); fit with none {m['fit_none']:.2f} ms; "
        f"reserve {m['reserve_each']:.1f} ms each"
    )


if __name__ == "__main__":
    main()
