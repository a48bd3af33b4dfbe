"""A migration never makes the hot path wait longer than its lock_timeout, and retries until it gets its lock.

alembic/env.py runs every migration under INVENTORY_MIGRATION_LOCK_TIMEOUT and
retries it INVENTORY_MIGRATION_ATTEMPTS times (docs/deployment/upgrades.md).
Here migration 0020 (an index on taints: a SHARE lock) meets a transaction
that writes taints and stays open (ROW EXCLUSIVE, as any insert holds). While
the migration waits, another writer (the hot path) queues behind it: it must
get through within the bound. Once the long transaction ends, the migration
gets its lock on a later attempt; with attempts exhausted it fails, saying
why, and nothing is half-applied. A migration chosen as a deadlock victim is
retried the same way (0024 against a reader crossing its tables).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import asyncpg
import pytest

from service.database.migrations import upgrade
from tests.support.databases import create_database, drop_database

LOCK_TIMEOUT = 0.5


@pytest.fixture
def at_0019(server_url: str) -> Iterator[str]:
    url = create_database(server_url, prefix="llmgw_locks")
    upgrade(url, "0019")
    yield url
    drop_database(server_url, url)


class Holder(threading.Thread):
    """A transaction holding taints' ROW EXCLUSIVE lock until released (or for `seconds`)."""

    def __init__(self, url: str, seconds: float) -> None:
        super().__init__(daemon=True)
        self.url, self.seconds = url, seconds
        self.holding = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        async def hold() -> None:
            conn = await asyncpg.connect(self.url)
            try:
                async with conn.transaction():
                    await conn.execute("LOCK TABLE taints IN ROW EXCLUSIVE MODE")
                    self.holding.set()
                    await asyncio.get_running_loop().run_in_executor(
                        None, self.release.wait, self.seconds
                    )
            finally:
                await conn.close()

        asyncio.run(hold())


async def revision(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        return str(await conn.fetchval("SELECT version_num FROM alembic_version"))
    finally:
        await conn.close()


async def hot_path_waits(url: str, during: float) -> list[float]:
    """A writer of taints, again and again for `during` seconds: how long each took its lock."""
    waits = []
    conn = await asyncpg.connect(url)
    try:
        deadline = time.monotonic() + during
        while time.monotonic() < deadline:
            started = time.monotonic()
            async with conn.transaction():
                await conn.execute("LOCK TABLE taints IN ROW EXCLUSIVE MODE")
            waits.append(time.monotonic() - started)
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    return waits


def test_the_migration_retries_until_it_gets_its_lock_and_the_hot_path_waits_at_most_the_bound(
    at_0019: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INVENTORY_MIGRATION_LOCK_TIMEOUT", str(LOCK_TIMEOUT))
    monkeypatch.setenv("INVENTORY_MIGRATION_ATTEMPTS", "10")
    holder = Holder(at_0019, seconds=4.0)
    holder.start()
    assert holder.holding.wait(10)
    migrating = threading.Thread(target=upgrade, args=(at_0019, "0020"), daemon=True)
    started = time.monotonic()
    migrating.start()
    waits = asyncio.run(hot_path_waits(at_0019, during=6.0))
    migrating.join(60)
    assert not migrating.is_alive()
    took = time.monotonic() - started
    holder.join(10)
    assert asyncio.run(revision(at_0019)) == "0020"
    # It could not finish before the long transaction ended (4 s), and it did after.
    assert took >= 3.0, took
    # Each hot-path write waited at most the bound (plus scheduling slack on a busy machine).
    assert max(waits) <= LOCK_TIMEOUT + 0.4, sorted(waits)[-5:]
    assert len(waits) > 20


def test_a_migration_that_never_gets_its_lock_fails_saying_why_and_applies_nothing(
    at_0019: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INVENTORY_MIGRATION_LOCK_TIMEOUT", str(LOCK_TIMEOUT))
    monkeypatch.setenv("INVENTORY_MIGRATION_ATTEMPTS", "2")
    holder = Holder(at_0019, seconds=30.0)
    holder.start()
    assert holder.holding.wait(10)
    try:
        with pytest.raises(SystemExit) as failed:
            upgrade(at_0019, "0020")
    finally:
        holder.release.set()
        holder.join(10)
    message = str(failed.value)
    assert "2 attempts of lock_timeout 0.5 s" in message, message
    assert "INVENTORY_MIGRATION_LOCK_TIMEOUT" in message
    assert asyncio.run(revision(at_0019)) == "0019"


@pytest.fixture
def at_0025(server_url: str) -> Iterator[str]:
    url = create_database(server_url, prefix="llmgw_deadlock")
    upgrade(url, "0025")
    yield url
    drop_database(server_url, url)


class CrossingReader(threading.Thread):
    """A transaction that reads shards, then gpus once `cross` is set: the hot path's order.

    Migration 0024 alters gpus, then gpu_pools, then shards in one transaction:
    with this reader holding shards and asking for gpus, the two wait for each
    other and PostgreSQL breaks the cycle by failing one of them.
    """

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.holding = threading.Event()
        self.cross = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        async def read() -> None:
            conn = await asyncpg.connect(self.url)
            try:
                async with conn.transaction():
                    await conn.fetchval("SELECT count(*) FROM shards")
                    self.holding.set()
                    await asyncio.get_running_loop().run_in_executor(None, self.cross.wait, 30)
                    await conn.fetchval("SELECT count(*) FROM gpus")
            finally:
                await conn.close()

        try:
            asyncio.run(read())
        except BaseException as error:  # the thread's outcome, read by the test
            self.error = error


async def migration_waits_for_shards(url: str, within: float) -> bool:
    """Whether a session came to wait for an ACCESS EXCLUSIVE lock on shards within `within` s."""
    conn = await asyncpg.connect(url)
    try:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE relation = 'shards'::regclass"
                " AND mode = 'AccessExclusiveLock' AND NOT granted"
            )
            if waiting:
                return True
            await asyncio.sleep(0.02)
        return False
    finally:
        await conn.close()


def test_a_migration_chosen_as_a_deadlock_victim_is_retried_and_applies(
    at_0025: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lock_timeout longer than PostgreSQL's deadlock_timeout (1 s): the
    # migration, waiting first, runs the deadlock check first and is the victim.
    monkeypatch.setenv("INVENTORY_MIGRATION_LOCK_TIMEOUT", "5")
    monkeypatch.setenv("INVENTORY_MIGRATION_ATTEMPTS", "3")
    reader = CrossingReader(at_0025)
    reader.start()
    assert reader.holding.wait(10)
    failed: list[BaseException] = []

    def migrate() -> None:
        try:
            upgrade(at_0025, "0024")
        except BaseException as error:  # SystemExit included: the test reads it
            failed.append(error)

    migrating = threading.Thread(target=migrate, daemon=True)
    migrating.start()
    assert asyncio.run(migration_waits_for_shards(at_0025, within=20))
    reader.cross.set()  # the reader now asks for gpus, which the migration holds
    migrating.join(60)
    reader.join(20)
    assert not migrating.is_alive()
    assert not failed, failed
    assert reader.error is None, reader.error
    assert asyncio.run(revision(at_0025)) == "0024"
