"""What every scenario shares: the database, the service processes, the round settings."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg

from benchmarks.client import Connection
from benchmarks.results import Results
from benchmarks.services import HEADERS, Service


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

    def connections(self, count: int) -> list[Connection]:
        """`count` client connections spread evenly over the service processes."""
        return [
            Connection(self.services[i % len(self.services)].url, HEADERS) for i in range(count)
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


async def close_all(connections: list[Connection]) -> None:
    for c in connections:
        await c.close()
