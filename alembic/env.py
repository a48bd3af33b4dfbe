"""Alembic's async environment: runs migrations over asyncpg under an advisory lock."""

import asyncio
import os

from sqlalchemy import pool, text
from sqlalchemy.engine import Connection

from alembic import context
from service import health_tables  # noqa: F401 (fleet health's tables join the metadata)
from service.database.db import asyncpg_url, engine_for
from service.database.migrations import MIGRATION_LOCK_KEY
from service.tables import metadata

config = context.config
target_metadata = metadata


def database_url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("DATABASE_URL is not set: which database should be migrated?")
    return str(url)


def run_migrations_offline() -> None:
    context.configure(
        url=asyncpg_url(database_url()), target_metadata=target_metadata, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        # Taken before alembic reads the current revision, so a second
        # process waits here and then finds nothing left to do.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        context.run_migrations()


async def run_async_migrations() -> None:
    # Through asyncpg's own URL parsing: DATABASE_URL may name several hosts.
    engine = engine_for(database_url(), poolclass=pool.NullPool)
    async with engine.connect() as connection:
        await connection.run_sync(do_run_migrations)
    await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_async_migrations())
