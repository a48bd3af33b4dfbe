"""Alembic's async environment: runs migrations over asyncpg under an advisory lock.

Every migration runs with a lock_timeout and is retried, so a migration never
makes the service's hot path wait longer than the bound
(docs/deployment/upgrades.md): a DDL statement that must wait for a lock
queues every later statement on that table behind it, so it waits at most
INVENTORY_MIGRATION_LOCK_TIMEOUT seconds (default 2), then gives up, lets the
queue drain, and tries again, up to INVENTORY_MIGRATION_ATTEMPTS times
(default 10), waiting 1, 2, 4... up to 10 s between attempts. Each migration
is its own transaction, so what is done stays done and a retry resumes at the
migration that timed out; one that still cannot get its lock fails the
`migrate` run, saying so (nothing half-applied: its transaction is rolled
back). The advisory lock is held by the session across those transactions,
so a second process waits for the first and then finds nothing to do.
Migrations that must run outside a transaction (CREATE INDEX CONCURRENTLY,
batched backfills) use service/database/online_migrations.py's helpers.
"""

import asyncio
import json
import logging
import os
import time

from sqlalchemy import pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from alembic import context
from service import (
    health_tables,  # noqa: F401 (fleet health's tables join the metadata)
    maintenance_tables,  # noqa: F401 (and maintenance windows')
    reservation_tables,  # noqa: F401 (and reservations')
    tenancy_tables,  # noqa: F401 (and tenancy's)
)
from service.database.db import asyncpg_url, engine_for
from service.database.migrations import MIGRATION_LOCK_KEY, keeps_working
from service.tables import metadata

config = context.config
target_metadata = metadata
log = logging.getLogger("alembic.env")

LOCK_NOT_AVAILABLE = "55P03"
# A deadlock victim's transaction is rolled back whole, so the migration is
# retried as after a lock timeout. Seen in the rolling upgrade test: 0024's
# ALTER TABLEs (gpus, then gpu_pools, then shards) held gpus while an old
# process's place, holding shards, asked for gpus; PostgreSQL chose the
# migration, and `migrate` failed instead of trying again.
DEADLOCK_DETECTED = "40P01"
RETRIED = {LOCK_NOT_AVAILABLE, DEADLOCK_DETECTED}
# Seconds between tries of the migration lock while another process migrates.
MIGRATION_LOCK_POLL = 0.2


def setting(name: str, default: float) -> float:
    value = config.attributes.get(name) or os.environ.get(name)
    return float(value) if value else default


def database_url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("DATABASE_URL is not set: which database should be migrated?")
    return str(url)


def run_migrations_offline() -> None:
    context.configure(
        url=asyncpg_url(database_url()),
        target_metadata=target_metadata,
        literal_binds=True,
        transaction_per_migration=True,
    )
    # As online (do_run_migrations): rendered, so that a reader of the SQL, and
    # squawk (alembic/squawk_lint.py), see the bound every statement runs under.
    context.execute(
        f"SET lock_timeout = '{int(setting('INVENTORY_MIGRATION_LOCK_TIMEOUT', 2.0) * 1000)}ms'"
    )
    with context.begin_transaction():
        context.run_migrations()


def lock_timed_out(error: DBAPIError) -> bool:
    """The migration gave up a lock (its lock_timeout) or lost one (a deadlock victim): retried."""
    orig = error.orig
    codes = {getattr(orig, "sqlstate", None), getattr(orig, "pgcode", None)}
    cause = getattr(orig, "__cause__", None)
    codes.add(getattr(cause, "sqlstate", None))
    return bool(RETRIED & codes)


def do_run_migrations(connection: Connection) -> None:
    lock_timeout = setting("INVENTORY_MIGRATION_LOCK_TIMEOUT", 2.0)
    attempts = int(setting("INVENTORY_MIGRATION_ATTEMPTS", 10))
    context.configure(
        connection=connection, target_metadata=target_metadata, transaction_per_migration=True
    )
    # Taken before alembic reads the current revision, so a second process
    # waits here and then finds nothing left to do; a session lock, held
    # across each migration's own transaction. Waited for by trying, with no
    # transaction open between tries: a CREATE INDEX CONCURRENTLY of the
    # process migrating waits for every transaction older than its build, and
    # a waiter blocked in pg_advisory_lock is one, which closed a cycle (the
    # waiters ended as deadlock victims when 0022 first built an index so).
    while not connection.execute(
        text("SELECT pg_try_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
    ).scalar():
        connection.commit()
        time.sleep(MIGRATION_LOCK_POLL)
    connection.execute(text(f"SET lock_timeout = '{int(lock_timeout * 1000)}ms'"))
    connection.commit()
    try:
        for attempt in range(1, attempts + 1):
            try:
                with context.begin_transaction():
                    context.run_migrations()
                record_keeps_working(connection)
                return
            except DBAPIError as error:
                if not lock_timed_out(error):
                    raise
                connection.rollback()
                if attempt == attempts:
                    raise SystemExit(
                        f"migration gave up: a lock it needs was held by others through "
                        f"{attempts} attempts of lock_timeout {lock_timeout:g} s "
                        f"(INVENTORY_MIGRATION_ATTEMPTS, INVENTORY_MIGRATION_LOCK_TIMEOUT): "
                        f"{str(error.orig).splitlines()[0]}"
                    ) from None
                pause = min(10.0, 2.0 ** (attempt - 1))
                log.warning(
                    "migration gave up a lock (%s; lock_timeout %g s, attempt %d of %d); the "
                    "service's statements queued behind it go on; again in %g s",
                    str(error.orig).splitlines()[0],
                    lock_timeout,
                    attempt,
                    attempts,
                    pause,
                )
                time.sleep(pause)
    finally:
        connection.rollback()
        connection.execute(text("RESET lock_timeout"))
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
        connection.commit()


def record_keeps_working(connection: Connection) -> None:
    """alembic_version's comment: which code the schema keeps working (service/database/migrations.py)."""
    revision = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    if revision is None:
        return
    value = json.dumps({"keepsWorking": keeps_working(revision, context.script)})
    value = value.replace("'", "''")
    connection.execute(text(f"COMMENT ON TABLE alembic_version IS '{value}'"))
    connection.commit()


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
