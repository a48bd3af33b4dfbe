"""Where a write's time goes: registerNode's and place's domain calls made in-process.

The HTTP figures say how fast the service is; they do not say whether the
rest is HTTP and GraphQL, the domain's Python or PostgreSQL. Here the same
work runs again in this process, through the same functions the resolvers
call (service.fleet.re_registration.register; service.scheduling.placement.place in
service.database.transactions.in_transaction), with as many concurrent tasks as the
HTTP figure has clients, and the CPU is split per operation: this process's
(the domain's Python, asyncpg included) and PostgreSQL's (its own processes
when the server runs here, else the rest of the machine's; the service
processes are idle). The same reports also run always in one transaction
(service.fleet.node_writes.register_node, the path before the one statement), in the
same rounds. The raw baselines are split the same way, so "PostgreSQL per
report" can be compared with what the plain statement costs it.

Linux only (/proc/stat); elsewhere the section says it was skipped.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.allocation import PLACE_CLASS, SCHEDULERS, check_and_release, raw_claim
from benchmarks.bench import Bench
from benchmarks.cluster import node_input, to_report
from benchmarks.measure import Exhausted, Figure, throughput
from benchmarks.results import Row, fmt
from benchmarks.writes import RAW_REGISTER, ReportSource, agent_nodes, changed_reporter
from service.config import Settings
from service.database.db import create_engine, dispose
from service.database.transactions import in_transaction
from service.fleet import re_registration
from service.fleet.node_writes import register_node
from service.fleet.reports import NodeReport
from service.scheduling.allocations import Allocated
from service.scheduling.place_batches import place_batched
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import place

STAT = Path("/proc/stat")
HAS_STAT = STAT.exists()
AGENTS = 16


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent so far (user, nice, system)."""
    fields = STAT.read_text().split("\n", 1)[0].split()
    return sum(int(x) for x in fields[1:4]) / 100


class Split:
    """Per-operation CPU over rounds: this process's and PostgreSQL's, in ms.

    PostgreSQL's is its own processes' when the server runs here
    (Bench.postgres_cpu): on a machine shared with other work, the rest of
    the machine's CPU is theirs too. Otherwise the rest of the machine's.
    """

    def __init__(self, bench: Bench) -> None:
        self.rate, self.here, self.rest = Figure(), Figure(), Figure()
        self.bench = bench

    async def measure(self, workers: list[Callable[[], Awaitable[int]]], seconds: float) -> None:
        machine, here, db = machine_cpu(), time.process_time(), self.bench.postgres_cpu()
        start = time.perf_counter()
        rate, _ = await throughput(workers, seconds)
        ops = rate * (time.perf_counter() - start)
        self.rate.add(rate)
        if ops:
            mine = time.process_time() - here
            self.here.add(mine / ops * 1000)
            postgres = self.bench.postgres_cpu() - db
            if postgres != postgres:  # nan: the server is elsewhere
                postgres = machine_cpu() - machine - mine
            self.rest.add(postgres / ops * 1000)

    def words(self, here: str) -> str:
        return f"{here} {fmt(self.here.median)} ms, PostgreSQL {fmt(self.rest.median)} ms"


SEQUENTIAL_PLACES = 200


async def measure_layers(bench: Bench) -> int:
    """Returns the number of double-booked GPUs and wrong pools seen (must be 0).

    The in-process rounds run first, then the raw ones: the service
    processes keep their pools open, and the engine's and a raw pool's
    connections together would pass PostgreSQL's max_connections.
    """
    if not HAS_STAT:
        bench.results.note("layers skipped: no /proc/stat to read the machine's CPU from")
        return 0
    source = ReportSource()
    reports: dict[tuple[int, int], NodeReport] = {}
    ids = itertools.count()
    node_ids = [r["id"] for r in await bench.sql("SELECT id FROM nodes ORDER BY id")]
    registered, placed, raw_registered, claimed = (Split(bench) for _ in range(4))
    registered_tx = Split(bench)  # the same reports, always in a transaction
    placed_nvlink = Split(bench)  # place with nvlinkShards (issue 20), in the same rounds
    # Each place in a transaction of its own, as before service/scheduling/place_batches.py.
    placed_alone = Split(bench)
    defaults = Settings()
    sequential = {False: Figure(), True: Figure()}
    wrong = 0

    def reporters(
        send: Callable[[int, int], Awaitable[None]],
    ) -> list[Callable[[], Awaitable[int]]]:
        return [
            changed_reporter(bench, agent_nodes(bench.size, AGENTS, a), send) for a in range(AGENTS)
        ]

    engine = create_engine(bench.url, Settings(db_pool_size=SCHEDULERS, db_max_overflow=0))
    try:

        def report_of(i: int, version: int) -> NodeReport:
            if (i, version) not in reports:
                reports[(i, version)] = to_report(node_input(i, version))
            return reports[(i, version)]

        async def register(i: int, version: int) -> None:
            # As the resolver stores it: one statement when it can.
            await re_registration.register(engine, report_of(i, version))

        async def register_in_transaction(i: int, version: int) -> None:
            # Always the transaction (register's path before the one statement).
            report = report_of(i, version)
            await in_transaction(engine, lambda conn: register_node(conn, report))

        async def place_one(nvlink_shards: bool = False, alone: bool = False) -> int:
            """One place as the resolver makes it (sharing transactions), or `alone` in its own."""
            request = PlaceRequest(
                f"bench-l{next(ids)}", PLACE_CLASS, gpus_per_shard=1, nvlink_shards=nvlink_shards
            )

            async def work(conn: Any) -> object:
                return await place(conn, request)

            if alone:
                outcome: object = await in_transaction(engine, work)
            else:
                outcome = await place_batched(
                    engine,
                    request,
                    None,
                    size=defaults.place_batch,
                    transactions=defaults.place_transactions,
                )
            if not isinstance(outcome, Allocated):
                raise Exhausted  # no room left: the cluster's free H100s are taken
            return 1

        # One caller, alternating with and without nvlinkShards: the cost of
        # the topology checks alone, with the machine's noise shared by both.
        for k in range(2 * SEQUENTIAL_PLACES):
            latency = sequential[k % 2 == 1]
            start = time.perf_counter()
            await place_one(nvlink_shards=k % 2 == 1)
            latency.add((time.perf_counter() - start) * 1000)
        wrong += await check_and_release(bench)

        for _ in range(bench.rounds):
            await registered.measure(reporters(register), bench.seconds)
            await registered_tx.measure(reporters(register_in_transaction), bench.seconds)
            await placed.measure([place_one] * SCHEDULERS, bench.seconds)
            wrong += await check_and_release(bench)
            await placed_alone.measure([lambda: place_one(alone=True)] * SCHEDULERS, bench.seconds)
            wrong += await check_and_release(bench)
            await placed_nvlink.measure(
                [lambda: place_one(nvlink_shards=True)] * SCHEDULERS, bench.seconds
            )
            wrong += await check_and_release(bench)
    finally:
        await dispose(engine)

    async with bench.pool(SCHEDULERS) as pool:

        async def raw_register(i: int, version: int) -> None:
            await pool.fetchval(RAW_REGISTER, *source.raw(i, version))

        async def claim() -> int:
            if not await raw_claim(pool, node_ids, f"bench-lr{next(ids)}"):
                raise Exhausted
            return 1

        for _ in range(bench.rounds):
            await raw_registered.measure(reporters(raw_register), bench.seconds)
            await claimed.measure([claim] * SCHEDULERS, bench.seconds)
            wrong += await check_and_release(bench)

    in_process = "domain call in-process (no HTTP, no GraphQL)"
    bench.results.add(
        Row(
            bench.size,
            f"registerNode's {in_process}, changed report, {AGENTS} tasks",
            "req/s",
            registered.rate,
            "raw asyncpg, 1 statement",
            raw_registered.rate,
            note=f"CPU per report: {registered.words('domain Python')}; "
            f"raw: {raw_registered.words('client')}",
        )
    )
    bench.results.add(
        Row(
            bench.size,
            f"registerNode's {in_process}, changed report, always one transaction, {AGENTS} tasks",
            "req/s",
            registered_tx.rate,
            "raw asyncpg, 1 statement",
            raw_registered.rate,
            note=f"CPU per report: {registered_tx.words('domain Python')}",
        )
    )
    bench.results.add(
        Row(
            bench.size,
            f"place's {in_process}, 1x {PLACE_CLASS}, {SCHEDULERS} tasks",
            "claims/s",
            placed.rate,
            "raw asyncpg, SKIP LOCKED claim",
            claimed.rate,
            note=f"CPU per claim: {placed.words('domain Python')}; "
            f"raw: {claimed.words('client')}; double-booked GPUs or wrong pools: {wrong}",
        )
    )
    bench.results.add(
        Row(
            bench.size,
            f"place's {in_process}, 1x {PLACE_CLASS}, {SCHEDULERS} tasks, sharing transactions",
            "claims/s",
            placed.rate,
            "each place in its own transaction (same rounds)",
            placed_alone.rate,
            note=f"CPU per claim: {placed.words('domain Python')}; "
            f"own transactions: {placed_alone.words('domain Python')}",
        )
    )
    bench.results.add(
        Row(
            bench.size,
            f"place's {in_process}, 1x {PLACE_CLASS} with nvlinkShards, {SCHEDULERS} tasks",
            "claims/s",
            placed_nvlink.rate,
            "the same without nvlinkShards",
            placed.rate,
            note=f"CPU per claim: {placed_nvlink.words('domain Python')}",
        )
    )
    bench.results.add(
        Row(
            bench.size,
            f"place's {in_process}, 1 caller, latency with nvlinkShards",
            "ms",
            sequential[True],
            "the same calls without, alternating",
            sequential[False],
            note=f"{SEQUENTIAL_PLACES} calls each; a ratio of 1.25 is 0.8x the claims/s",
        )
    )
    return wrong
