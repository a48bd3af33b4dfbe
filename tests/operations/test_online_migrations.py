"""A future migration's tools: an index built CONCURRENTLY and a backfill in batches, under writes.

A migration written as docs/deployment/upgrades.md asks
(service/database/online_migrations.py) is run through the repository's
alembic/env.py, from a copy of the migrations with one more on top, against
a database at head with nodes in it and a writer updating them: the index
is built while the writer goes on (CONCURRENTLY), a build left INVALID by a
failure is rebuilt, the backfill fills every row a batch at a time (each its
own transaction), and squawk finds nothing to object to in it.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from alembic.config import Config

from alembic import command
from service.database.migrations import ALEMBIC_DIR, head_revision, upgrade
from tests.support.databases import create_database, drop_database

MIGRATION = '''"""A zone column on nodes, filled from their labels, and an index on it."""

from alembic import op
from service.database.online_migrations import backfill_in_batches, create_index_concurrently

revision = "0999"
down_revision = "{head}"
keeps_working = "{head}"


def upgrade() -> None:
    # IF NOT EXISTS: the steps below commit on their own, so a failed run leaves the
    # column behind and the next run must pass over it (squawk: prefer-robust-stmts).
    op.execute("ALTER TABLE nodes ADD COLUMN IF NOT EXISTS zone_test text")
    create_index_concurrently("ix_nodes_zone_test", "nodes", "(zone_test)")
    backfill_in_batches(
        "UPDATE nodes SET zone_test = 'z-' || id WHERE id IN "
        "(SELECT id FROM nodes WHERE zone_test IS NULL ORDER BY id LIMIT :batch)",
        batch=7,
    )


def downgrade() -> None:
    op.drop_column("nodes", "zone_test")
'''

NODES = 50


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    copy = tmp_path / "alembic"
    shutil.copytree(ALEMBIC_DIR, copy)
    (copy / "versions" / "0999_zone_test.py").write_text(MIGRATION.format(head=head_revision()))
    return copy


@pytest.fixture
def url(server_url: str) -> Iterator[str]:
    url = create_database(server_url, prefix="llmgw_online")
    upgrade(url)

    async def nodes() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.executemany(
                "INSERT INTO nodes (id, hostname, mgmt_addr) VALUES ($1, $1, '10.0.0.1')",
                [(f"n{i:03d}",) for i in range(NODES)],
            )
        finally:
            await conn.close()

    asyncio.run(nodes())
    yield url
    drop_database(server_url, url)


def config(scripts: Path, url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(scripts))
    cfg.attributes["database_url"] = url
    return cfg


class Writer(threading.Thread):
    """Updates nodes all along, each its own transaction; counts them."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.writes = 0
        self.slowest = 0.0

    def run(self) -> None:
        async def write() -> None:
            conn = await asyncpg.connect(self.url)
            try:
                while not self.stop.is_set():
                    started = time.monotonic()
                    await conn.execute("UPDATE nodes SET hostname = hostname WHERE id = 'n001'")
                    self.slowest = max(self.slowest, time.monotonic() - started)
                    self.writes += 1
                    await asyncio.sleep(0.01)
            finally:
                await conn.close()

        asyncio.run(write())


async def fetch(url: str, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


def test_an_index_built_concurrently_and_a_batched_backfill_while_writes_go_on(
    scripts: Path, url: str
) -> None:
    writer = Writer(url)
    writer.start()
    try:
        time.sleep(0.3)
        command.upgrade(config(scripts, url), "head")
        time.sleep(0.3)
    finally:
        writer.stop.set()
        writer.join(10)
    filled = asyncio.run(fetch(url, "SELECT count(*) AS n FROM nodes WHERE zone_test = 'z-' || id"))
    assert filled[0]["n"] == NODES
    index = asyncio.run(fetch(url, (
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = 'ix_nodes_zone_test'"
    )))  # fmt: skip
    assert [r["indisvalid"] for r in index] == [True]
    assert writer.writes > 10
    # Writes went on: none waited on the migration for longer than its lock_timeout.
    assert writer.slowest < 2.0, writer.slowest


def test_an_invalid_index_left_by_a_failed_build_is_built_again(scripts: Path, url: str) -> None:
    async def leave_invalid() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("ALTER TABLE nodes ADD COLUMN zone_test text")
            await conn.execute("UPDATE nodes SET zone_test = 'dup' WHERE id IN ('n001', 'n002')")
            # A unique build over duplicates fails, leaving an INVALID index behind.
            with pytest.raises(asyncpg.UniqueViolationError):
                await conn.execute(
                    "CREATE UNIQUE INDEX CONCURRENTLY ix_nodes_zone_test ON nodes (zone_test)"
                )
            await conn.execute("ALTER TABLE nodes DROP COLUMN zone_test")
        finally:
            await conn.close()

    # Re-created with the column, as a failed earlier run of the migration would leave it.
    asyncio.run(leave_invalid())
    command.upgrade(config(scripts, url), "head")
    index = asyncio.run(fetch(url, (
        "SELECT i.indisvalid, i.indisunique FROM pg_index i JOIN pg_class c "
        "ON c.oid = i.indexrelid WHERE c.relname = 'ix_nodes_zone_test'"
    )))  # fmt: skip
    assert [(r["indisvalid"], r["indisunique"]) for r in index] == [(True, False)]


def squawk(scripts: Path) -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("squawk_lint", scripts / "squawk_lint.py")
    assert spec is not None and spec.loader is not None
    lint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lint)
    problems: list[str] = lint.lint()
    return problems


@pytest.mark.process
def test_squawk_accepts_the_migration_and_finds_what_would_lock(scripts: Path) -> None:
    assert squawk(scripts) == []
    # The same index built the plain way: found, naming the migration and the rule.
    path = scripts / "versions" / "0999_zone_test.py"
    path.write_text(
        path.read_text().replace(
            'create_index_concurrently("ix_nodes_zone_test", "nodes", "(zone_test)")',
            'op.create_index("ix_nodes_zone_test", "nodes", ["zone_test"])',
        )
    )
    found = squawk(scripts)
    assert any(p.startswith("0999_zone_test.py: require-concurrent-index-creation") for p in found)
    # An exception beside it, with its reason, lets it pass; one without a reason does not.
    exceptions = scripts / "versions" / "0999_zone_test.squawk.toml"
    exceptions.write_text('[exceptions]\nrequire-concurrent-index-creation = ""\n')
    assert (
        "0999_zone_test.py: the exception for require-concurrent-index-creation gives no reason"
        in squawk(scripts)
    )
    exceptions.write_text(
        '[exceptions]\nrequire-concurrent-index-creation = "a test table nobody writes"\n'
    )
    assert squawk(scripts) == []
    # An exception no longer needed is an error.
    path.write_text(MIGRATION.format(head=head_revision()))
    assert squawk(scripts) == [
        "0999_zone_test.py: the exception for require-concurrent-index-creation is no longer needed"
    ]
