"""SQL statements per request, counted on the engine: they must not grow with the cluster."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
from sqlalchemy import event

from benchmarks.allocation import ALLOCATE, ALLOCATE_CLASS, FREE_SLOTS, PLACE, PLACE_CLASS
from benchmarks.cluster import node_id, node_input
from benchmarks.questions import Question
from benchmarks.services import HEADERS, TOKEN
from benchmarks.writes import HEARTBEAT, REGISTER
from service.config import Settings
from service.database import connections
from service.database.db import create_engine, dispose
from service.web.app import create_app


class Counter:
    def __init__(self) -> None:
        self.count = 0
        self.seen: list[tuple[str, Any]] = []

    def __call__(self, conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        self.count += 1
        self.seen.append((statement, parameters))


async def explain(url: str, statement: str, parameters: Any) -> str:
    """The plan's shape and time for one statement as the service sent it."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + statement, *(parameters or ()))
    finally:
        await conn.close()
    lines = [r[0] for r in rows]
    scans = sorted({ln.strip().split("  (")[0].lstrip("-> ") for ln in lines if " on " in ln})
    total = next((ln for ln in lines if ln.startswith("Execution Time")), "")
    return f"{'; '.join(scans)}; {total}"


RELEASE = "mutation($id: ID!) { releaseReplica(replicaId: $id) }"


async def _free_slot(url: str) -> tuple[str, int] | None:
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(FREE_SLOTS, ALLOCATE_CLASS)
    finally:
        await conn.close()
    return None if row is None else (row[0], row[1])


async def count_statements(
    url: str, questions: list[Question], versions: dict[int, int], notes: list[str]
) -> dict[str, str]:
    """Statements each kind of request runs, by name (in an in-process app on the same database)."""
    settings = Settings(max_page_size=1000, bootstrap_token=TOKEN)
    engine = create_engine(url, settings)
    counter = Counter()

    def native(statement: str, args: Any) -> None:
        if statement != "BEGIN":
            counter(None, None, statement, args)

    # Reads and writes run on asyncpg's own pool; a few one-off paths still
    # go through SQLAlchemy: count both.
    event.listen(engine.sync_engine, "before_cursor_execute", counter)
    connections.statement_observers.append(native)
    out: dict[str, str] = {}
    try:
        app = create_app(settings, engine=engine)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://bench", headers=HEADERS
        ) as client:

            async def count(
                name: str, query: str, variables: dict[str, Any], *, announcements: bool = True
            ) -> None:
                counter.count = 0
                counter.seen.clear()
                reply = (await client.post("/graphql", json={"query": query,
                                                             "variables": variables})).json()  # fmt: skip
                seen = [st for st, _ in counter.seen if announcements or "pg_notify" not in st]
                if reply.get("errors"):
                    out[name] = f"error: {reply['errors'][0].get('message')}"
                else:
                    out[name] = str(len(seen))

            for q in questions:
                await count(q.name, q.query, q.variables)
                if q.name.startswith("freeGpus"):
                    statement, parameters = next(
                        (st, pa) for st, pa in counter.seen if "gpu_pools" in st
                    )
                    notes.append(f"freeGpus plan: {await explain(url, statement, parameters)}")
            # Node 1 (not in any agent's working set of the other figures at this point).
            i = 1
            v = versions.get(i, 0)
            await count("unchanged", REGISTER, {"input": node_input(i, v)})
            versions[i] = (v + 1) % 3
            await count("changed", REGISTER, {"input": node_input(i, versions[i])})
            await count("heartbeat", HEARTBEAT, {"id": node_id(i)})
            # One claim of each kind, as the allocation figure sends them, then
            # released again. The event announcement (pg_notify) is left out:
            # it is sent after commit, whenever its flush runs, so it lands in
            # whichever request happens to be counted then.
            place = {"replicaId": "bench-stmt-p", "gpuClass": PLACE_CLASS, "shards": 1,
                     "gpusPerShard": 1}  # fmt: skip
            await count("place", PLACE, {"input": place}, announcements=False)
            slot = await _free_slot(url)
            if slot is not None:
                shard = {"shardId": "bench-stmt-a", "nodeId": slot[0], "gpuIndices": [slot[1]]}
                allocate = {"replicaId": "bench-stmt-a", "shards": [shard]}
                await count("allocate", ALLOCATE, {"input": allocate}, announcements=False)
            for replica in ("bench-stmt-p", "bench-stmt-a"):
                await client.post("/graphql", json={"query": RELEASE, "variables": {"id": replica}})
    finally:
        connections.statement_observers.remove(native)
        await dispose(engine)
    return out
