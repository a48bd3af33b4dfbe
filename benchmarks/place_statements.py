"""What a place's statements read with 1,000 reservations and 100 maintenance windows, and what judging windows at :at costs (issue 47, by hand).

Two questions BENCHMARKS.md's "By hand" section answers with this, at
10,000 nodes (benchmarks/cluster.py's synthetic cluster):

1. Does a place (1x H100-80GB, through the GraphQL app in this process)
   run a statement that reads more with 1,000 reservations set aside? Each
   statement one place sends is caught (connections.statement_observers,
   the service's own hook) and run again under EXPLAIN (ANALYZE, BUFFERS) in a transaction rolled
   back, its replica and shard ids renamed so it does the same work; the
   same before and after the reservations are made (through `reserve`, as
   benchmarks/reservations.py makes them): execution time and shared
   buffers per statement.
2. The maintenance rule judged at `coalesce(CAST(:at AS timestamptz),
   now())` (maintenance_rule.AT, commit b1f6569) against `now()` (its
   parent c1e5d5d): place's first statement (placement/statements.pick_sql)
   rendered both ways and run alternately A/B/A/B on the same database,
   each in a transaction rolled back, with the 100 windows in force.

    python -m benchmarks.place_statements [--nodes 10000] [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks.fit import run
from benchmarks.maintenance import book_windows
from service.config import Settings
from service.database import connections
from service.database.db import create_engine, dispose
from service.event_log.event_announcements import drain_announcements
from service.scheduling.maintenance_rule import AT
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement.claims import WINDOW
from service.scheduling.placement.statements import pick_sql, request_params, scan_size
from service.web.app import create_app

PLACE = """
mutation Place($input: PlaceInput!) {
  place(input: $input) { __typename ... on Allocated { allocations { nodeId } } }
}
"""
RELEASE = "mutation R($id: ID!) { releaseReplica(replicaId: $id) }"
RESERVE = "mutation R($input: ReservationInput!) { reserve(input: $input) { __typename } }"
TP8 = {"replicaId": "fit", "gpuClass": "H100-80GB", "gpusPerShard": 8}
WINDOWS = 100
# Each statement is explained this many times; its median execution time is shown.
EXPLAINS = 7
# --plans DIR: each statement's plan as text there too.
PLANS: str | None = None


async def _post(client: httpx.AsyncClient, query: str, variables: dict[str, Any]) -> Any:
    response = await client.post("/graphql", json={"query": query, "variables": variables})
    body = response.json()
    assert not body.get("errors"), body
    return body["data"]


def _renamed(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, (list, tuple)):
        return type(value)(_renamed(v, old, new) for v in value)
    return value


async def _place_statements(
    client: httpx.AsyncClient, engine: AsyncEngine, replica: str
) -> list[tuple[str, Any]]:
    """The statements (and parameters) one place of 1x H100 sends; the replica released after."""
    caught: list[tuple[str, Any]] = []

    def catch(sql: str, args: Any) -> None:
        caught.append((sql, list(args)))

    connections.statement_observers.append(catch)
    try:
        shape = {"replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": 1}
        placed = await _post(client, PLACE, {"input": shape})
    finally:
        connections.statement_observers.remove(catch)
    assert placed["place"]["__typename"] == "Allocated", placed
    await _post(client, RELEASE, {"id": replica})
    await drain_announcements(engine)
    return caught


async def _explained(
    url: str, statements: list[tuple[str, Any]], old: str, new: str
) -> list[tuple[str, float, int]]:
    """Each statement under EXPLAIN (ANALYZE, BUFFERS), rolled back: (its head, ms, shared buffers)."""
    out = []
    conn = await asyncpg.connect(url)
    try:
        for statement, args in statements:
            head = " ".join(statement.split())[:100]
            if not head.upper().startswith(("SELECT", "WITH", "INSERT", "UPDATE", "DELETE")):
                continue
            took, buffers = [], 0
            for _ in range(EXPLAINS):
                trans = conn.transaction()
                await trans.start()
                try:
                    sql = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement
                    plan = await conn.fetchval(sql, *_renamed(args, old, new))
                    plan = json.loads(plan) if isinstance(plan, str) else plan
                    top = plan[0]
                    buffers = top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get(
                        "Shared Read Blocks", 0
                    )
                    took.append(float(top["Execution Time"]))
                except Exception as error:  # a statement that cannot run again alone
                    head = f"{head} ({type(error).__name__}: {error})"[:200]
                    break
                finally:
                    await trans.rollback()
            out.append((head, statistics.median(took) if took else -1.0, int(buffers)))
            if PLANS is not None and took:
                trans = conn.transaction()
                await trans.start()
                try:
                    sql = "EXPLAIN (ANALYZE, BUFFERS) " + statement
                    lines = await conn.fetch(sql, *_renamed(args, old, new))
                finally:
                    await trans.rollback()
                where = Path(PLANS) / f"{new}-{len(out)}.txt"
                where.write_text("\n".join(r[0] for r in lines) + "\n")
    finally:
        await conn.close()
    return out


async def _ab_at(engine: AsyncEngine, rounds: int) -> dict[str, list[float]]:
    """pick_sql judged at now() (c1e5d5d) and at coalesce(:at, now()) (b1f6569), alternately."""
    request = PlaceRequest("bench-ab", "H100-80GB", 1)
    judged_at = pick_sql(request, False)
    assert AT in judged_at
    variants = {"now": text(judged_at.replace(AT, "now()")), "at": text(judged_at)}
    params = {
        **request_params(request),
        "replica_id": request.replica_id,
        "need": request.gpus,
        "limit": WINDOW,
        "scan": scan_size(request, WINDOW, False),
        "skip": [],
    }
    times: dict[str, list[float]] = {"now": [], "at": []}
    async with engine.connect() as conn:
        for i in range(rounds + 5):
            order = ("now", "at") if i % 2 == 0 else ("at", "now")
            for kind in order:
                trans = await conn.begin()
                started = time.perf_counter()
                rows = list(await conn.execute(variants[kind], params))
                took = time.perf_counter() - started
                await trans.rollback()
                assert rows and rows[0].picked_node_id is not None
                if i >= 5:
                    times[kind].append(took * 1000)
        if PLANS is not None:
            for kind, statement in variants.items():
                trans = await conn.begin()
                sql = text("EXPLAIN (ANALYZE, BUFFERS) " + statement.text)
                lines = [r[0] for r in await conn.execute(sql, params)]
                await trans.rollback()
                (Path(PLANS) / f"pick-{kind}.txt").write_text("\n".join(lines) + "\n")
    return times


async def measure(url: str, rounds: int, reservations: int = 1000) -> dict[str, Any]:
    settings = Settings(database_url=url)
    engine = create_engine(url, settings)
    app = create_app(settings, engine=engine)
    found: dict[str, Any] = {}
    try:
        async with engine.connect() as conn:
            nodes = [r.id for r in await conn.execute(text("SELECT id FROM nodes ORDER BY id"))]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            _, start = await book_windows(client, nodes)
            for k in range(3):  # warm-up
                await _place_statements(client, engine, f"bench-warm-{k}")
            caught = await _place_statements(client, engine, "bench-none")
            found["none"] = await _explained(url, caught, "bench-none", "bench-none-x")
            for k in range(reservations):
                spec = {"id": f"bench-res-{k}", "tenant": None, "shape": TP8, "count": 1,
                        "start": (start + timedelta(seconds=k)).isoformat(),
                        "end": (start + timedelta(hours=2)).isoformat()}  # fmt: skip
                answer = await _post(client, RESERVE, {"input": spec})
                assert answer["reserve"]["__typename"] == "Reservation", answer
            caught = await _place_statements(client, engine, "bench-with")
            found["with"] = await _explained(url, caught, "bench-with", "bench-with-x")
            # The same once VACUUM has made the pools the reserves rewrote
            # all-visible again (what autovacuum does in time).
            conn = await asyncpg.connect(url)
            try:
                await conn.execute("VACUUM gpu_pools")
            finally:
                await conn.close()
            caught = await _place_statements(client, engine, "bench-vacuumed")
            found["vacuumed"] = await _explained(url, caught, "bench-vacuumed", "bench-vac-x")
            found["ab"] = await _ab_at(engine, rounds)
    finally:
        await dispose(engine)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--reservations", type=int, default=1000)
    parser.add_argument("--plans", help="a folder for each statement's plan as text")
    args = parser.parse_args()
    global PLANS
    PLANS = args.plans

    async def measured(url: str, rounds: int) -> Any:
        return await measure(url, rounds, args.reservations)

    found: Any = asyncio.run(run(args.nodes, args.rounds, measured))
    print(f"{args.nodes} nodes, {WINDOWS} windows in force; a place's statements, EXPLAIN ANALYZE:")
    for kind in ("none", "with", "vacuumed"):
        print(f"  {kind} reservations:")
        for head, ms, buffers in found[kind]:
            if not head.startswith("SELECT pg_notify"):
                print(f"    {ms:8.3f} ms {buffers:6d} buffers | {head}")
    now, at = (statistics.median(found["ab"][k]) for k in ("now", "at"))
    print(
        f"pick_sql, median of {args.rounds} alternating: now() {now:.3f} ms, "
        f"coalesce(:at, now()) {at:.3f} ms ({at / now:.3f}x)"
    )


if __name__ == "__main__":
    main()
