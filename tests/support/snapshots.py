"""A cluster a fixture builds through the API once per worker, copied back for each test after.

Some fixtures build the same cluster for dozens of read-only cases (test_paging's:
about 120 requests; test_fit's), and building it was most of those cases' time.
`Snapshots.once(key, engine, build)` runs `build` the first time, in the test
that asks first, and keeps every row it left (binary COPY of each table that
holds rows) and each used sequence's value; every later test that asks gets the
same rows copied back into its emptied tables, sequences set, and the value
`build` returned (a token's secret: the rows hold only its hash).

Copied back with `session_replication_role = replica`: the rows are already
what the triggers made of them (tenancy's counters, migration 0022), so the
triggers must not run again, and foreign keys are not checked on rows that held
them when they were copied. That setting needs a superuser, which the tests'
own server gives (and a TEST_DATABASE_URL must, to CREATE DATABASE).

Only the database is kept: a fixture that uses this must build nothing
else a test relies on (apps, clients, in-process state) inside `build`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tests.support.databases import dirty_tables

T = TypeVar("T")

USED_SEQUENCE_VALUES = (
    "SELECT quote_ident(sequencename), last_value FROM pg_sequences"
    " WHERE schemaname = current_schema() AND last_value IS NOT NULL"
)


@dataclass(frozen=True)
class Snapshot:
    """Every row of every table that held rows, in COPY's binary format; used sequences' values."""

    tables: tuple[tuple[str, bytes], ...]
    sequences: tuple[tuple[str, int], ...]


async def _driver(conn: AsyncConnection) -> Any:
    raw = await conn.get_raw_connection()
    return raw.driver_connection


async def take(conn: AsyncConnection) -> Snapshot:
    driver = await _driver(conn)
    tables = []
    for quoted in await dirty_tables(conn):
        chunks: list[bytes] = []

        async def sink(data: bytes, _chunks: list[bytes] = chunks) -> None:
            _chunks.append(bytes(data))

        await driver.copy_from_table(quoted.strip('"'), output=sink, format="binary")
        tables.append((quoted, b"".join(chunks)))
    sequences = [(str(r[0]), int(r[1])) for r in await conn.exec_driver_sql(USED_SEQUENCE_VALUES)]
    return Snapshot(tuple(tables), tuple(sequences))


async def restore(conn: AsyncConnection, snapshot: Snapshot) -> None:
    """The snapshot's rows and sequences into a database whose tables are empty (tests/conftest.py's
    empty_tables ran first)."""
    driver = await _driver(conn)
    await conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
    for quoted, data in snapshot.tables:

        async def source(_data: bytes = data) -> AsyncIterator[bytes]:
            yield _data

        await driver.copy_to_table(quoted.strip('"'), source=source(), format="binary")
    for sequence, value in snapshot.sequences:
        await conn.exec_driver_sql(f"SELECT setval('{sequence}', {value})")


class Snapshots:
    """The clusters this worker built once, by key (the `snapshots` fixture, one per session)."""

    def __init__(self) -> None:
        self._taken: dict[str, tuple[Any, Snapshot]] = {}

    async def once(self, key: str, engine: AsyncEngine, build: Callable[[], Awaitable[T]]) -> T:
        if key in self._taken:
            value, snapshot = self._taken[key]
            async with engine.begin() as conn:
                await restore(conn, snapshot)
            built: T = value
            return built
        value = await build()
        async with engine.begin() as conn:
            self._taken[key] = (value, await take(conn))
        return value
