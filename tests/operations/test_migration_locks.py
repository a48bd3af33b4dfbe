"""A migration never makes the hot path wait longer than its lock_timeout, and retries until it gets its lock.

alembic/env.py runs every migration under INVENTORY_MIGRATION_LOCK_TIMEOUT and
retries it INVENTORY_MIGRATION_ATTEMPTS times (docs/deployment/upgrades.md).
Here migration 0020 (an index on taints: a SHARE lock) meets a transaction
that writes taints and stays open (ROW EXCLUSIVE, as any insert holds). While
the migration waits, another writer (the hot path) queues behind it: it must
get through within the bound. Once the long transaction ends, the migration
gets its lock on a later attempt; with attempts exhausted it fails, saying
why, and nothing is half-applied.
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
