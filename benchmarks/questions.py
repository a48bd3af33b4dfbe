"""The scheduler's questions: p50/p99 with one client, req/s with sixteen, against raw SQL.

The baselines are what a careful engineer would write on a plain schema (no
gpu_pools, no disk sums kept on the node row), run through raw asyncpg with
prepared statements: the cost of asking PostgreSQL directly, without HTTP or
GraphQL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from benchmarks.bench import Bench, close_all
from benchmarks.client import request_body
from benchmarks.measure import Figure, latencies, percentile, throughput
from benchmarks.results import Row, fmt

FREE_GPUS = """
query Free($cls: String!) {
  freeGpus(gpuClass: $cls, minFree: 4, first: 50) { gpuIndices node { id } }
}
"""

# The same question on the plain tables, as a careful engineer writes it:
# PostgreSQL walks pk_gpus in node order and stops at the 50th answer, so on
# this cluster (two nodes in five are H100 nodes) it reads a few hundred GPUs.
FREE_GPUS_SQL = """
SELECT g.node_id, array_agg(g.idx ORDER BY g.idx) AS indices
FROM gpus g JOIN nodes n ON n.id = g.node_id
WHERE n.state = 'ready' AND g.gpu_class = $1 AND g.healthy
  AND NOT EXISTS (SELECT 1 FROM allocated_gpus a WHERE a.node_id = g.node_id AND a.gpu_index = g.idx)
GROUP BY g.node_id HAVING count(*) >= 4
ORDER BY g.node_id LIMIT 50
"""

# Issue 7's baseline: free GPUs counted per node over every GPU anti-joined
# with allocations, then filtered and paged. Its cost grows with the cluster;
# it is also what the early-stop query above degrades to when few nodes
# qualify (a rare or busy class).
FREE_GPUS_AGGREGATE_SQL = """
WITH free AS MATERIALIZED (
    SELECT g.node_id, array_agg(g.idx ORDER BY g.idx) AS indices
    FROM gpus g JOIN nodes n ON n.id = g.node_id
    WHERE n.state = 'ready' AND g.gpu_class = $1 AND g.healthy
      AND NOT EXISTS (SELECT 1 FROM allocated_gpus a
                      WHERE a.node_id = g.node_id AND a.gpu_index = g.idx)
    GROUP BY g.node_id
)
SELECT node_id, indices FROM free WHERE cardinality(indices) >= 4 ORDER BY node_id LIMIT 50
"""

# The whole answer to the schedulers' question (issue 22): every node with
# room, not the first page. The service's answer is read page by page with
# `first`/`after`, as a client must; the baseline is the same SQL without the
# LIMIT, every entry in one statement.
FREE_GPUS_PAGED = """
query FreeAll($cls: String!, $first: Int!, $after: ID) {
  freeGpus(gpuClass: $cls, minFree: 4, first: $first, after: $after) { gpuIndices node { id } }
}
"""
FREE_GPUS_ALL_SQL = FREE_GPUS_SQL.replace("LIMIT 50", "")


def free_gpus_json(rows: list[Any]) -> bytes:
    """FREE_GPUS_ALL_SQL's rows as the JSON body the service answers (the raw side's own cost).

    Issue 18's baseline is the naive SQL *plus its JSON*: a server answering
    with that statement still encodes every entry. The service's side pays
    more than this: HTTP, and the client's parse of each page.
    """
    entries = [{"gpuIndices": list(r["indices"]), "node": {"id": r["node_id"]}} for r in rows]
    return json.dumps({"data": {"freeGpus": entries}}).encode()


DISK = 2 * 10**12
FILTERED = """
query Filtered($disk: Bytes!) {
  nodes(filter: {fabric: "ib-a", minLocalDiskFree: $disk}, first: 100) {
    id hostname state localDisk { freeBytes totalBytes }
  }
}
"""

FILTERED_SQL = """
SELECT n.id, n.hostname, n.state, d.free, d.total
FROM nodes n
JOIN LATERAL (SELECT sum(free_bytes) AS free, sum(total_bytes) AS total FROM filesystems f
              WHERE f.node_id = n.id AND NOT f.shared) d ON true
WHERE EXISTS (SELECT 1 FROM fabric_attachments fa WHERE fa.node_id = n.id AND fa.fabric = 'ib-a')
  AND d.free >= $1
ORDER BY n.id LIMIT 100
"""

PAGE_SIZE = 1000
PAGE = """
query Page($first: Int!) {
  nodes(first: $first) {
    id hostname state
    gpus { index gpuClass healthy allocation { shardId } }
    storage { id mountPoint freeBytes totalBytes }
    allocations { shardId replicaId gpuIndices }
  }
}
"""

# One statement that builds the whole answer as JSON inside PostgreSQL, the
# way a careful engineer (or PostGraphile) would serve a big page.
PAGE_SQL = """
SELECT coalesce(json_agg(json_build_object(
  'id', n.id, 'hostname', n.hostname, 'state', n.state,
  'gpus', (SELECT coalesce(json_agg(json_build_object(
              'index', g.idx, 'gpuClass', g.gpu_class, 'healthy', g.healthy,
              'allocation', CASE WHEN a.shard_id IS NULL THEN NULL
                                 ELSE json_build_object('shardId', a.shard_id) END)
            ORDER BY g.idx), '[]')
           FROM gpus g LEFT JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx
           WHERE g.node_id = n.id),
  'storage', (SELECT coalesce(json_agg(json_build_object(
                 'id', f.fs_id, 'mountPoint', f.mount_point, 'freeBytes', f.free_bytes,
                 'totalBytes', f.total_bytes) ORDER BY f.mount_point, f.fs_id), '[]')
              FROM filesystems f WHERE f.node_id = n.id),
  'allocations', (SELECT coalesce(json_agg(json_build_object(
                     'shardId', s.shard_id, 'replicaId', s.replica_id,
                     'gpuIndices', s.gpu_indices) ORDER BY s.shard_id), '[]')
                  FROM shards s WHERE s.node_id = n.id)
) ORDER BY n.id), '[]')::text
FROM (SELECT * FROM nodes ORDER BY id LIMIT $1) n
"""


@dataclass(frozen=True)
class Question:
    name: str
    query: str
    variables: dict[str, Any]
    sql: str
    args: tuple[Any, ...]
    # Heavy questions get fewer calls per round.
    weight: int = 1
    # A second baseline for the 1-client p50 (issue 7's naive aggregate).
    aggregate_sql: str | None = None


def questions(size: int, page_size: int = PAGE_SIZE) -> list[Question]:
    first = min(page_size, size)
    return [
        Question(
            "freeGpus(H100-80GB, minFree 4, first 50)",
            FREE_GPUS,
            {"cls": "H100-80GB"},
            FREE_GPUS_SQL,
            ("H100-80GB",),
            aggregate_sql=FREE_GPUS_AGGREGATE_SQL,
        ),
        Question(
            "nodes(filter: fabric ib-a, minLocalDiskFree 2 TB, first 100)",
            FILTERED,
            {"disk": DISK},
            FILTERED_SQL,
            (DISK,),
        ),
        Question(
            f"nodes(first {first}) {{ gpus storage allocations }}",
            PAGE,
            {"first": first},
            PAGE_SQL,
            (first,),
            weight=20,
        ),
    ]


async def measure_question(bench: Bench, q: Question, statements: str = "") -> None:
    body = request_body(q.query, q.variables)
    calls = max(3, bench.calls // q.weight)
    p50, p99, rate = Figure(), Figure(), Figure()
    raw_p50, raw_p99, raw_rate = Figure(), Figure(), Figure()
    cpu, aggregate_p50 = Figure(), Figure()
    failures = 0
    async with bench.pool(16) as pool:
        # A sanity check before timing: both answer, and the same number of nodes.
        (one,) = bench.connections(1)
        reply = await one.graphql(body)
        answer = next(iter(reply["data"].values()))
        raw_answer = await pool.fetch(q.sql, *q.args)
        if "json_agg" not in q.sql and len(answer) != len(raw_answer):
            bench.results.note(
                f"{q.name}: the service answered {len(answer)} entries, raw SQL {len(raw_answer)}"
            )
        for _ in range(bench.rounds):
            samples = await latencies(lambda: one.graphql(body), calls)
            p50.add(percentile(samples, 50) * 1000)
            p99.add(percentile(samples, 99) * 1000)
            async with pool.acquire() as conn:
                stmt = await conn.prepare(q.sql)
                raw = await latencies(lambda s=stmt: s.fetch(*q.args), calls)
            raw_p50.add(percentile(raw, 50) * 1000)
            raw_p99.add(percentile(raw, 99) * 1000)
            if q.aggregate_sql is not None:
                async with pool.acquire() as conn:
                    stmt = await conn.prepare(q.aggregate_sql)
                    raw = await latencies(lambda s=stmt: s.fetch(*q.args), calls)
                aggregate_p50.add(percentile(raw, 50) * 1000)

            clients = bench.connections(16)

            def worker(c: Any) -> Any:
                async def call() -> int:
                    await c.graphql(body)
                    return 1

                return call

            value, failed = await bench.throughput([worker(c) for c in clients], cpu)
            failures += failed
            rate.add(value)
            await close_all(clients)

            async def raw_call() -> int:
                await pool.fetch(q.sql, *q.args)
                return 1

            value, _ = await throughput([raw_call] * 16, bench.seconds)
            raw_rate.add(value)
        await one.close()
    add = bench.results.add
    note = f"service CPU {fmt(cpu.median)} ms/request"
    note += f"; {failures} failed requests" if failures else ""
    add(Row(bench.size, f"{q.name} p50, 1 client", "ms", p50, "raw SQL", raw_p50,
            statements, better="lower"))  # fmt: skip
    if q.aggregate_sql is not None:
        add(Row(bench.size, f"{q.name} p50 vs the naive aggregate, 1 client", "ms", p50,
                "raw SQL, aggregate over all GPUs", aggregate_p50, better="lower"))  # fmt: skip
    add(Row(bench.size, f"{q.name} p99, 1 client", "ms", p99, "raw SQL", raw_p99,
            better="lower"))  # fmt: skip
    add(Row(bench.size, f"{q.name} req/s, 16 clients", "req/s", rate, "raw SQL", raw_rate,
            note=note))  # fmt: skip


async def free_gpus_p50(bench: Bench, calls: int) -> float:
    """One quick p50 in ms (for the churn before/after figure)."""
    body = request_body(FREE_GPUS, {"cls": "H100-80GB"})
    (one,) = bench.connections(1)
    try:
        await one.graphql(body)
        return percentile(await latencies(lambda: one.graphql(body), calls), 50) * 1000
    finally:
        await one.close()


async def raw_free_gpus_p50(bench: Bench, calls: int) -> float:
    async with bench.pool(1) as pool, pool.acquire() as conn:
        stmt = await conn.prepare(FREE_GPUS_SQL)
        await stmt.fetch("H100-80GB")
        return percentile(await latencies(lambda: stmt.fetch("H100-80GB"), calls), 50) * 1000


async def every_entry(
    client: Any, query: str, variables: dict[str, Any], page_size: int, cursor: Any
) -> list[Any]:
    """A list's whole answer: pages of `page_size` after the last entry's cursor until one is short.

    Never one unpaged call: that answers one page (with PAGE_TRUNCATED when
    there is more), and a figure for it would compare a page with the whole.
    """
    entries: list[Any] = []
    after = None
    while True:
        reply = await client.graphql(
            request_body(query, {**variables, "first": page_size, "after": after})
        )
        page = next(iter(reply["data"].values()))
        entries += page
        if len(page) < page_size:
            return entries
        after = cursor(page[-1])


async def measure_full_answer(bench: Bench, page_size: int = PAGE_SIZE) -> int:
    """freeGpus(H100-80GB, minFree 4), all of it, paged through, against one SQL statement.

    Returns 1 when the service's whole answer differs from the SQL's (a wrong result).
    """
    name = f"freeGpus(H100-80GB, minFree 4) full answer, paged by first {page_size}"
    variables = {"cls": "H100-80GB"}

    def node_id(entry: Any) -> str:
        return str(entry["node"]["id"])

    def fetch(c: Any) -> Any:
        return lambda: every_entry(c, FREE_GPUS_PAGED, variables, page_size, node_id)

    calls = max(3, bench.calls // 20)
    service, raw = Figure(), Figure()
    wrong = 0
    async with bench.pool(1) as pool:
        (one,) = bench.connections(1)
        answer = await fetch(one)()
        whole = await pool.fetch(FREE_GPUS_ALL_SQL, "H100-80GB")
        expected = [(r["node_id"], list(r["indices"])) for r in whole]
        got = [(node_id(e), e["gpuIndices"]) for e in answer]
        if got != expected:
            wrong = 1
            bench.results.note(
                f"{name}: the service answered {len(got)} entries, raw SQL {len(expected)}"
            )
        for _ in range(bench.rounds):
            samples = await latencies(fetch(one), calls)
            service.add(percentile(samples, 50) * 1000)
            async with pool.acquire() as conn:
                stmt = await conn.prepare(FREE_GPUS_ALL_SQL)

                async def raw_answer(s: Any = stmt) -> bytes:
                    return free_gpus_json(await s.fetch("H100-80GB"))

                samples = await latencies(raw_answer, calls)
            raw.add(percentile(samples, 50) * 1000)
        await one.close()
    requests = len(answer) // page_size + 1  # the last one comes back short
    bench.results.add(Row(bench.size, f"{name} p50, 1 client", "ms", service,
                          "raw SQL, every entry in one statement, plus its JSON", raw,
                          note=f"{len(answer):,} entries, {requests} request(s) of first {page_size}",
                          better="lower"))  # fmt: skip
    return wrong
