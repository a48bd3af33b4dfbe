"""What every scenario shares: the database, the service processes, the round settings."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.client import Connection
from benchmarks.database import postgres_cpu, postmaster_pid
from benchmarks.measure import Figure, throughput
from benchmarks.results import Results
from benchmarks.services import HEADERS, Service

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Bench:
    size: int
    url: str
    services: list[Service]
    results: Results
    quick: bool
    rounds: int
    seconds: float
    calls: int
    # The report version each node last sent (see cluster.node_input).
    versions: dict[int, int] = field(default_factory=dict)
    # The PostgreSQL server's postmaster, when it runs on this machine.
    postmaster: int | None = None

    @classmethod
    async def on(
        cls, url: str, size: int, services: list[Service], results: Results, args: Any
    ) -> Bench:
        """A bench for `size` nodes on database `url`, paced as the command line says."""
        return cls(
            postmaster=await postmaster_pid(url),
            size=size,
            url=url,
            services=services,
            results=results,
            quick=args.quick,
            rounds=args.rounds,
            seconds=args.seconds,
            calls=args.calls,
        )

    def postgres_cpu(self) -> float:
        """CPU seconds the PostgreSQL server has used so far; nan when it is not on this machine."""
        if self.postmaster is None:
            return float("nan")
        try:
            return postgres_cpu(self.postmaster)
        except (OSError, ValueError):
            return float("nan")

    def service_cpu(self) -> float:
        """CPU seconds the service processes have used so far (user + system).

        Counted per request it is the service's own cost, which a busy machine
        inflates far less than it does wall-clock rates.
        """
        return services_cpu(self.services)

    async def throughput(
        self,
        workers: list[Callable[[], Awaitable[int]]],
        cpu: Figure | None,
        postgres: Figure | None = None,
    ) -> tuple[float, int]:
        """measure.throughput over this bench's round length, adding CPU ms per op.

        `cpu`: the service processes'; `postgres`: the PostgreSQL server's
        (nothing added when it is not on this machine).
        """
        before, db_before = self.service_cpu(), self.postgres_cpu()
        start = time.perf_counter()
        rate, failed = await throughput(workers, self.seconds)
        ops = rate * (time.perf_counter() - start)
        if ops:
            if cpu is not None:
                cpu.add((self.service_cpu() - before) / ops * 1000)
            db = self.postgres_cpu() - db_before
            if postgres is not None and db == db:  # not nan
                postgres.add(db / ops * 1000)
        return rate, failed

    def connections(
        self, count: int, headers: list[dict[str, str]] | None = None
    ) -> list[Connection]:
        """`count` client connections spread evenly over the service processes.

        Each with the bootstrap token, or with headers[i] (an agent's own token).
        """
        return [
            Connection(
                self.services[i % len(self.services)].url, headers[i] if headers else HEADERS
            )
            for i in range(count)
        ]

    @contextlib.asynccontextmanager
    async def pool(self, size: int) -> AsyncIterator[asyncpg.Pool]:
        pool = await asyncpg.create_pool(self.url, min_size=size, max_size=size)
        try:
            yield pool
        finally:
            await pool.close()

    async def sql(self, query: str, *args: object) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.url)
        try:
            rows: list[asyncpg.Record] = await conn.fetch(query, *args)
            return rows
        finally:
            await conn.close()


def services_cpu(services: list[Service]) -> float:
    """CPU seconds these service processes have used so far (user + system)."""
    total = 0.0
    for service in services:
        try:
            fields = Path(f"/proc/{service.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


async def close_all(connections: list[Connection]) -> None:
    for c in connections:
        await c.close()
