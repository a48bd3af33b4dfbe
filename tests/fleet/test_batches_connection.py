"""Batches of requests (heartbeats, token lookups, node reads) keep one connection while they keep coming.

service/batches.py: taking a pooled connection per batch cost as much as the
heartbeat batch's statement; a busy process now holds one across consecutive
batches, gives it back when nothing waits, and takes a fresh one after a
batch failed. Against the real database, on the engine's own pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.ext.asyncio import AsyncEngine

from service.batches import Batches
from service.database import connections
from service.database.connections import NativeConnection, cached_text

ECHO = cached_text(
    "SELECT k, pg_backend_pid() FROM unnest(CAST(:keys AS text[])) AS k, pg_sleep(:pause)"
)


class Counted:
    """connections.autocommit(engine), counting the connections taken and given back."""

    def __init__(self, engine: AsyncEngine, fail_first: int = 0) -> None:
        self.engine = engine
        self.taken = 0
        self.returned = 0
        self.fail_first = fail_first

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[NativeConnection]:
        if self.fail_first:
            self.fail_first -= 1
            raise asyncpg.TooManyConnectionsError("no connection for this batch")
        async with connections.autocommit(self.engine) as conn:
            self.taken += 1
            try:
                yield conn
            finally:
                self.returned += 1


def echo(pause: float) -> object:
    async def answer(conn: NativeConnection, keys: Sequence[str]) -> dict[str, tuple[str, int]]:
        rows = await conn.execute(ECHO, {"keys": list(keys), "pause": pause})
        return {row[0]: (row[0], row[1]) for row in rows}

    return answer


def missing(key: str) -> LookupError:
    return LookupError(key)


async def test_batches_arriving_back_to_back_share_one_connection(engine: AsyncEngine) -> None:
    pool = Counted(engine)
    batches = Batches(pool.connect, echo(0.02), missing, max_batch=4)  # type: ignore[arg-type]

    # 12 at once, 4 a batch: three batches, one right after another.
    answers = await asyncio.gather(*(batches.ask(f"k{i}") for i in range(12)))

    assert [key for key, _ in answers] == [f"k{i}" for i in range(12)]
    assert len({backend for _, backend in answers}) == 1, "one backend answered all three"
    assert (pool.taken, pool.returned) == (1, 1), "taken once, given back when none waited"


async def test_a_lone_request_later_takes_a_connection_again(engine: AsyncEngine) -> None:
    pool = Counted(engine)
    batches = Batches(pool.connect, echo(0), missing, max_batch=4)  # type: ignore[arg-type]

    await batches.ask("first")
    await batches.ask("second")

    assert (pool.taken, pool.returned) == (2, 2)


async def test_after_a_failed_batch_the_next_takes_a_fresh_connection(
    engine: AsyncEngine,
) -> None:
    pool = Counted(engine)
    calls = 0

    async def answer(conn: NativeConnection, keys: Sequence[str]) -> dict[str, tuple[str, int]]:
        nonlocal calls
        calls += 1
        if calls == 1:
            # What a broken connection raises mid-batch.
            await conn.execute(cached_text("SELECT 1/0"))
        return await echo(0)(conn, keys)  # type: ignore[operator, no-any-return]

    batches = Batches(pool.connect, answer, missing, max_batch=2)

    first = await asyncio.gather(batches.ask("a"), batches.ask("b"), return_exceptions=True)
    second = await asyncio.gather(batches.ask("c"))

    assert all(isinstance(outcome, asyncpg.DivisionByZeroError) for outcome in first)
    assert [key for key, _ in second] == ["c"]
    assert (pool.taken, pool.returned) == (2, 2), "the failed batch's connection went back"


async def test_without_a_connection_the_waiting_requests_fail_and_the_next_one_works(
    engine: AsyncEngine,
) -> None:
    pool = Counted(engine, fail_first=1)
    batches = Batches(pool.connect, echo(0), missing, max_batch=8)  # type: ignore[arg-type]

    refused = await asyncio.gather(*(batches.ask(k) for k in "xyz"), return_exceptions=True)
    assert all(isinstance(outcome, asyncpg.TooManyConnectionsError) for outcome in refused)

    key, _ = await batches.ask("later")
    assert key == "later"
    assert (pool.taken, pool.returned) == (1, 1)


async def test_a_key_the_answer_leaves_out_gets_its_missing_outcome(engine: AsyncEngine) -> None:
    pool = Counted(engine)

    async def only_known(conn: NativeConnection, keys: Sequence[str]) -> dict[str, str]:
        return {key: key for key in keys if key != "unknown"}

    batches = Batches(pool.connect, only_known, missing, max_batch=8)

    known, unknown = await asyncio.gather(
        batches.ask("known"), batches.ask("unknown"), return_exceptions=True
    )
    assert known == "known"
    assert isinstance(unknown, LookupError) and str(unknown) == "unknown"
