"""freeGpus on a cluster as it comes up: loaded through the API, asked before and after ANALYZE.

Issue 30: the rest of the suite loads its cluster with COPY and runs ANALYZE
first, so it never sees the planner without statistics. Here each layout
gets a database of its own, its nodes register through registerNode and its
shards through allocate (as agents and schedulers do), and the schedulers'
question is asked at once, then again after ANALYZE:

- the whole answer of freeGpus(H100-80GB, minFree 4), paged by `first`,
  against the naive SQL issue 30 named (issue 39 made the suite use it):
  plain tables (nodes, gpus, allocations: their ids, the node's state, the
  GPU's class and whether it is usable, nothing else) holding the same data,
  one aggregate with NOT EXISTS, every entry in one statement, fetched
  in-process. The service's own tables (wider rows) plus JSON, the earlier
  baseline, cost about 78 ms at 10k nodes where the plain tables cost 41-53
  and hid a whole answer 1.0-2.2x slower than them;
- freeGpus(first: 50) against the naive aggregate's top 50.

Autovacuum is off for the tables until the ANALYZE, so "before ANALYZE" is
what its name says (on a live server it would analyze within a minute or so,
at a moment no benchmark controls).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from benchmarks.bench import Bench
from benchmarks.client import Connection, request_body
from benchmarks.cluster import node_id, node_input
from benchmarks.database import create_database, drop_database, migrate
from benchmarks.measure import Figure, latencies, percentile
from benchmarks.questions import (
    FREE_GPUS,
    FREE_GPUS_AGGREGATE_SQL,
    FREE_GPUS_ALL_SQL,
    FREE_GPUS_PAGED,
    every_entry,
    free_gpus_json,
)
from benchmarks.results import Results, Row
from benchmarks.services import services
from service.scheduling.availability import gpu_usable

BATCH = 50  # mutations per request, as aliases
SENDERS = 8  # requests in flight while loading
TABLES = ("nodes", "gpus", "allocated_gpus", "shards", "gpu_pools", "fabric_attachments")


def _sick(i: int) -> bool:
    """cluster.node_input's nodes with an unhealthy GPU 7: nothing is allocated on them."""
    return i % 50 == 7


def _every_fifth_half(size: int) -> Callable[[int], list[int]]:
    return lambda i: [4, 5, 6, 7] if i % 5 == 0 and not _sick(i) else []


def _first_third_all(size: int) -> Callable[[int], list[int]]:
    return lambda i: list(range(8)) if i < size // 3 and not _sick(i) else []


def _none(size: int) -> Callable[[int], list[int]]:
    return lambda i: []


LAYOUTS: dict[str, Callable[[int], Callable[[int], list[int]]]] = {
    "every fifth node half allocated": _every_fifth_half,
    "no allocations": _none,
    "the first third all allocated": _first_third_all,
}


async def _send_all(bench: Bench, bodies: list[bytes]) -> None:
    queue = list(reversed(bodies))
    connections = bench.connections(SENDERS)

    async def sender(c: Connection) -> None:
        while queue:
            reply = await c.graphql(queue.pop())
            if reply.get("errors"):
                raise RuntimeError(f"loading through the API failed: {reply['errors'][:1]}")

    try:
        await asyncio.gather(*(sender(c) for c in connections))
    finally:
        for c in connections:
            await c.close()


def _registrations(size: int) -> list[bytes]:
    bodies = []
    for start in range(0, size, BATCH):
        ids = range(start, min(size, start + BATCH))
        signature = ", ".join(f"$i{k}: NodeInput!" for k in range(len(ids)))
        fields = " ".join(f"r{k}: registerNode(input: $i{k}) {{ id }}" for k in range(len(ids)))
        variables = {f"i{k}": node_input(i) for k, i in enumerate(ids)}
        bodies.append(request_body(f"mutation({signature}) {{ {fields} }}", variables))
    return bodies


def _allocations(size: int, held: Callable[[int], list[int]]) -> list[bytes]:
    holds = [(i, held(i)) for i in range(size)]
    holds = [(i, h) for i, h in holds if h]
    bodies = []
    for start in range(0, len(holds), BATCH):
        batch = holds[start : start + BATCH]
        variables: dict[str, Any] = {}
        fields = []
        for k, (i, indices) in enumerate(batch):
            shard = {"shardId": f"real-{i}", "nodeId": node_id(i), "gpuIndices": indices}
            variables[f"a{k}"] = {"replicaId": f"real-{i}", "shards": [shard]}
            fields.append(f"a{k}: allocate(input: $a{k}) {{ __typename }}")
        signature = ", ".join(f"$a{k}: AllocateInput!" for k in range(len(batch)))
        bodies.append(request_body(f"mutation({signature}) {{ {' '.join(fields)} }}", variables))
    return bodies


# The plain tables, copied from the service's after the cluster is loaded,
# with their primary keys and statistics (a careful engineer's schema).
PLAIN_TABLES = (
    "DROP TABLE IF EXISTS plain_allocations, plain_gpus, plain_nodes",
    "CREATE TABLE plain_nodes AS SELECT id, state FROM nodes",
    "ALTER TABLE plain_nodes ADD PRIMARY KEY (id)",
    f"CREATE TABLE plain_gpus AS SELECT node_id, idx, gpu_class, {gpu_usable('g')} AS usable"
    " FROM gpus g",
    "ALTER TABLE plain_gpus ADD PRIMARY KEY (node_id, idx)",
    "CREATE TABLE plain_allocations AS SELECT node_id, gpu_index FROM allocated_gpus",
    "ALTER TABLE plain_allocations ADD PRIMARY KEY (node_id, gpu_index)",
    "ANALYZE plain_nodes, plain_gpus, plain_allocations",
)
PLAIN_FREE_GPUS_SQL = """
SELECT g.node_id, array_agg(g.idx ORDER BY g.idx) AS indices
FROM plain_gpus g JOIN plain_nodes n ON n.id = g.node_id
WHERE n.state = 'ready' AND g.gpu_class = $1 AND g.usable
  AND NOT EXISTS (SELECT 1 FROM plain_allocations a
                  WHERE a.node_id = g.node_id AND a.gpu_index = g.idx)
GROUP BY g.node_id HAVING count(*) >= 4
ORDER BY g.node_id
"""


async def _plain_tables(bench: Bench) -> None:
    for statement in PLAIN_TABLES:
        await bench.sql(statement)


async def _autovacuum(bench: Bench, enabled: bool) -> None:
    for table in TABLES:
        await bench.sql(f"ALTER TABLE {table} SET (autovacuum_enabled = {str(enabled).lower()})")


async def _measure(bench: Bench, label: str, page_size: int) -> int:
    """The whole answer paged, and first 50, against the naive SQL; 1 when the answers differ."""
    variables = {"cls": "H100-80GB"}

    def cursor(entry: Any) -> str:
        return str(entry["node"]["id"])

    calls = max(3, bench.calls // 20)
    paged, naive, first, top = Figure(), Figure(), Figure(), Figure()
    wrong = 0
    async with bench.pool(1) as pool:
        (one,) = bench.connections(1)

        async def whole() -> list[Any]:
            return await every_entry(one, FREE_GPUS_PAGED, variables, page_size, cursor)

        first_body = request_body(FREE_GPUS, variables)

        async def first_page() -> Any:
            return await one.graphql(first_body)

        answer = await whole()
        expected = [
            (r["node_id"], list(r["indices"]))
            for r in await pool.fetch(FREE_GPUS_ALL_SQL, "H100-80GB")
        ]
        plain = [
            (r["node_id"], list(r["indices"]))
            for r in await pool.fetch(PLAIN_FREE_GPUS_SQL, "H100-80GB")
        ]
        if plain != expected:
            wrong = 1
            bench.results.note(
                f"{bench.size:,} nodes, {label}: the plain tables answered {len(plain)} entries,"
                f" the service's tables {len(expected)}"
            )
        if [(cursor(e), e["gpuIndices"]) for e in answer] != expected:
            wrong = 1
            bench.results.note(
                f"{bench.size:,} nodes, {label}: freeGpus answered {len(answer)} entries,"
                f" the naive SQL {len(expected)}"
            )
        for _ in range(bench.rounds):
            paged.add(percentile(await latencies(whole, calls), 50) * 1000)
            first.add(percentile(await latencies(first_page, bench.calls), 50) * 1000)
            async with pool.acquire() as conn:
                every = await conn.prepare(PLAIN_FREE_GPUS_SQL)
                fifty = await conn.prepare(FREE_GPUS_AGGREGATE_SQL)

                async def naive_answer(statement: Any = every) -> Any:
                    return await statement.fetch("H100-80GB")

                async def naive_top(statement: Any = fifty) -> bytes:
                    return free_gpus_json(await statement.fetch("H100-80GB"))

                naive.add(percentile(await latencies(naive_answer, calls), 50) * 1000)
                top.add(percentile(await latencies(naive_top, bench.calls), 50) * 1000)
        await one.close()
    pages = len(answer) // page_size + 1
    bench.results.add(Row(bench.size, f"real cluster, {label}: freeGpus whole answer, paged by "
                          f"first {page_size}, p50", "ms", paged,
                          "naive SQL on plain tables, one aggregate with NOT EXISTS, fetched",
                          naive,
                          note=f"{len(answer):,} entries, {pages} request(s)",
                          better="lower"))  # fmt: skip
    bench.results.add(Row(bench.size, f"real cluster, {label}: freeGpus first 50 p50", "ms",
                          first, "naive aggregate, top 50", top, better="lower"))  # fmt: skip
    return wrong


async def measure_real_cluster(
    server_url: str, size: int, args: Any, results: Results, page_size: int
) -> int:
    """Every layout at `size` nodes on a database of its own; returns the wrong answers."""
    wrong = 0
    count = args.real_cluster_layouts or (1 if args.quick else len(LAYOUTS))
    layouts = list(LAYOUTS)[:count]
    for layout in layouts:
        print(f"[{size}] real cluster: {layout}", flush=True)
        url = await create_database(server_url)
        try:
            await asyncio.to_thread(migrate, url)
            with services(url, args.services) as procs:
                bench = await Bench.on(url, size, procs, results, args)
                await _autovacuum(bench, False)
                start = time.perf_counter()
                await _send_all(bench, _registrations(size))
                await _send_all(bench, _allocations(size, LAYOUTS[layout](size)))
                results.note(
                    f"{size:,} nodes, {layout}: registered and allocated through the API"
                    f" in {time.perf_counter() - start:.1f} s"
                )
                await _plain_tables(bench)
                wrong += await _measure(bench, f"{layout}, before ANALYZE", page_size)
                await bench.sql("ANALYZE")
                await _autovacuum(bench, True)
                wrong += await _measure(bench, f"{layout}, after ANALYZE", page_size)
        finally:
            await drop_database(server_url, url)
    return wrong
