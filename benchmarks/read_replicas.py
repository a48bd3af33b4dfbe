"""freeGpus first 50 from 32 clients: the primary alone, against the primary and two read replicas (issue 37).

A cluster of its own on loopback, from the embedded server's binaries (the one
the failover tests run on, tests/support/pg_cluster.py): a primary and two
asynchronous streaming replicas, the synthetic cluster of benchmarks/cluster.py
loaded on the primary and replayed by both. Two service processes answer 32
client connections asking `freeGpus(gpuClass: "H100-80GB", minFree: 4, first: 50)`,
first with DATABASE_URL alone (every read on the primary), then with
INVENTORY_READ_DATABASE_URL naming the two replicas (each process reads
either while it is within INVENTORY_READ_MAX_LAG). The figures: requests per
second, and the primary's PostgreSQL CPU per request, which is what replicas
take off it. On this machine all three servers share the same two cores with
the services and the clients, so the rate shows what routing costs more than
what it could gain on machines of their own.

Wrong results (the run's exit status): an answer that does not say it was read
from a replica when replicas are configured, or answers that differ between
the two configurations.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import asyncpg

from benchmarks.bench import Bench, close_all
from benchmarks.client import Connection, request_body
from benchmarks.cluster import load
from benchmarks.database import migrate, postgres_cpu, postmaster_pid
from benchmarks.measure import Figure, throughput
from benchmarks.results import Row
from benchmarks.services import HEADERS, Service, free_port
from tests.support.pg_cluster import StandbyPair

QUERY = """
query Free($cls: String!) {
  freeGpus(gpuClass: $cls, minFree: 4, first: 50) { gpuIndices node { id } }
}
"""
CLIENTS = 32
REPLICAS = 2


async def _caught_up(primary: str, replicas: list[str], within: float = 120) -> None:
    """Every replica has replayed what the primary has written so far."""
    conn = await asyncpg.connect(primary)
    try:
        target = await conn.fetchval("SELECT pg_current_wal_lsn()")
    finally:
        await conn.close()
    deadline = time.monotonic() + within
    for url in replicas:
        replica = await asyncpg.connect(url)
        try:
            while await replica.fetchval("SELECT pg_last_wal_replay_lsn() < $1", target):
                if time.monotonic() > deadline:
                    raise RuntimeError("a read replica did not catch up")
                await asyncio.sleep(0.1)
        finally:
            await replica.close()


def _cpu(pids: list[int]) -> float:
    """CPU seconds these PostgreSQL servers (their postmasters' pids) have used so far."""
    return sum(postgres_cpu(pid) for pid in pids)


async def _rounds(
    bench: Bench, services: list[Service], primary_pid: int, replica_pids: list[int]
) -> tuple[Figure, Figure, Figure, Any, dict[str, int]]:
    """(req/s, the primary's and the replicas' PostgreSQL ms per request, one answer, where
    answers were read)."""
    body = request_body(QUERY, {"cls": "H100-80GB"})
    clients = [Connection(services[i % len(services)].url, HEADERS) for i in range(CLIENTS)]
    rate, primary_ms, replicas_ms = Figure(), Figure(), Figure()
    sources: dict[str, int] = {}
    try:
        first = await clients[0].graphql(body)
        for _ in range(bench.rounds):

            def worker(client: Connection) -> Any:
                async def call() -> int:
                    answer = await client.graphql(body)
                    source = ((answer.get("extensions") or {}).get("readFrom") or {}).get(
                        "source", "primary (not routed)"
                    )
                    sources[source] = sources.get(source, 0) + 1
                    return 1

                return call

            before, replicas_before = _cpu([primary_pid]), _cpu(replica_pids)
            started = time.perf_counter()
            per_second, _ = await throughput([worker(c) for c in clients], bench.seconds)
            ops = per_second * (time.perf_counter() - started)
            rate.add(per_second)
            if ops:
                primary_ms.add((_cpu([primary_pid]) - before) / ops * 1000)
                replicas_ms.add((_cpu(replica_pids) - replicas_before) / ops * 1000)
    finally:
        await close_all(clients)
    return rate, primary_ms, replicas_ms, first["data"], sources


async def measure_read_replicas(bench: Bench, services_count: int) -> int:
    """Both configurations on one loopback cluster; returns the number of wrong results."""
    size, results = bench.size, bench.results
    cluster = StandbyPair(free_port(), free_port())
    wrong = 0
    try:
        await asyncio.to_thread(cluster.start, with_standby=False)
        replicas = [cluster.add_replica(free_port()) for _ in range(REPLICAS)]
        primary_url = cluster.url_of(cluster.primary)
        await asyncio.to_thread(migrate, primary_url)
        conn = await asyncpg.connect(primary_url)
        try:
            await load(conn, size)
        finally:
            await conn.close()
        replica_urls = [cluster.url_of(r) for r in replicas]
        await _caught_up(primary_url, replica_urls)
        pids = [await postmaster_pid(url) for url in (primary_url, *replica_urls)]
        if None in pids:
            raise RuntimeError("the loopback servers' postmasters were not found")
        primary_pid, *replica_pids = (pid for pid in pids if pid is not None)
        configurations = {
            "primary alone": {},
            f"primary + {REPLICAS} read replicas": {
                "INVENTORY_READ_DATABASE_URL": cluster.url_of(*replicas)
            },
        }
        figures: dict[str, tuple[Figure, Figure, Figure]] = {}
        answers: dict[str, Any] = {}
        for name, env in configurations.items():
            started = [Service(primary_url, env) for _ in range(services_count)]
            try:
                for service in started:
                    service.start()
                rate, primary_ms, replicas_ms, answers[name], sources = await _rounds(
                    bench, started, primary_pid, replica_pids
                )
            finally:
                for service in started:
                    service.stop()
            figures[name] = (rate, primary_ms, replicas_ms)
            results.note(
                f"{size:,} nodes, {name}: answers read from "
                + ", ".join(f"{k} {v:,}" for k, v in sorted(sources.items()))
            )
            if env and set(sources) != {"replica"}:
                wrong += 1
                results.note(f"{size:,} nodes, {name}: not every read went to a replica")
        alone, routed = (figures[name] for name in configurations)
        if len({json.dumps(a, sort_keys=True) for a in answers.values()}) != 1:
            wrong += 1
            results.note(f"{size:,} nodes: the two configurations answered differently")
        label = f"freeGpus(H100-80GB, minFree 4, first 50), {CLIENTS} clients"
        results.add(Row(size, f"{label}, primary alone", "req/s", alone[0]))
        results.add(
            Row(
                size,
                f"{label}, primary + {REPLICAS} read replicas",
                "req/s",
                routed[0],
                "primary alone",
                alone[0],
            )
        )
        results.add(
            Row(
                size,
                f"{label}: the primary's PostgreSQL CPU, primary + {REPLICAS} read replicas",
                "ms/req",
                routed[1],
                "primary alone",
                alone[1],
                better="lower",
            )
        )
        results.add(
            Row(
                size,
                f"{label}: the read replicas' PostgreSQL CPU, primary + {REPLICAS} read replicas",
                "ms/req",
                routed[2],
                better="lower",
            )
        )
    finally:
        await asyncio.to_thread(cluster.stop)
    return wrong
