"""Migrations take an empty database to the schema tables.py describes, and back."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from service.database.migrations import downgrade, head_revision, upgrade
from service.tables import metadata
from tests.conftest import REPO, create_database, drop_database


@pytest.fixture
def empty_database(server_url: str) -> Iterator[str]:
    url = create_database(server_url, prefix="llmgw_migrations")
    try:
        yield url
    finally:
        drop_database(server_url, url)


def sync_engine_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+asyncpg://", 1)


def inspect_tables(url: str) -> set[str]:
    async def run() -> set[str]:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(sync_engine_url(url))
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        await engine.dispose()
        return names

    return asyncio.run(run())


def schema_drift(url: str) -> list[object]:
    async def run() -> list[object]:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(sync_engine_url(url))
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda c: compare_metadata(MigrationContext.configure(c), metadata)
            )
        await engine.dispose()
        return list(diff)

    return asyncio.run(run())


def test_upgrade_from_empty_to_head_then_back_to_base(empty_database: str) -> None:
    upgrade(empty_database)
    assert {t.name for t in metadata.sorted_tables} <= inspect_tables(empty_database)
    assert schema_drift(empty_database) == []

    downgrade(empty_database, "base")
    assert inspect_tables(empty_database) <= {"alembic_version"}

    upgrade(empty_database)
    assert head_revision() is not None


def test_replicas_migrating_at_once_do_not_collide(empty_database: str) -> None:
    # Separate processes, as replicas starting together are: alembic's
    # context is process-global, so threads would not be the real thing.
    env = {**os.environ, "DATABASE_URL": empty_database}
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "service.cli", "migrate"],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(3)
    ]
    outcomes = [(run.wait(timeout=120), run.stderr.read() if run.stderr else b"") for run in runs]
    assert [code for code, _ in outcomes] == [0, 0, 0], outcomes
    assert schema_drift(empty_database) == []
