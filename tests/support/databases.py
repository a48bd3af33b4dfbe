"""Throwaway databases on the test server: one migrated template, cloned per test worker.

Migrating a database runs every Alembic revision (seconds); `CREATE DATABASE x
TEMPLATE t` copies the migrated files (a fraction of a second). So a test run
migrates once, into a template, and each test worker (pytest-xdist's, or the
one process without it) clones its own database from it. Under xdist the
controlling process starts the server and migrates the template before the
workers start, and hands both to them in the environment (SERVER_ENV,
TEMPLATE_ENV), so the workers share one server and one migration.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.database.db import libpq_url
from service.database.migrations import upgrade

# Set by the process that started the server and migrated the template, read
# by the test workers it starts (tests/conftest.py).
SERVER_ENV = "LLMGW_TEST_SERVER_URL"
TEMPLATE_ENV = "LLMGW_TEST_TEMPLATE"

# The embedded server is the tests' own, thrown away after the run: nothing in
# it must survive a crash of the machine, so it does not wait for the disk.
# (Tests of durability start servers of their own: own_postgres, pg_cluster.py.)
# max_connections: the workers' pools, and tests that start service processes
# with pools of their own, share one server; at the default 100 two such tests
# running at once on two workers were refused "too many clients already".
THROWAWAY_SETTINGS = {"fsync": "off", "full_page_writes": "off", "max_connections": "300"}


def with_database(url: str, name: str) -> str:
    parts = urlsplit(libpq_url(url))
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


async def _on_server(server: str, *statements: str) -> None:
    conn = await asyncpg.connect(server)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def create_database(server: str, prefix: str = "llmgw_test", template: str | None = None) -> str:
    """A new database on `server` (empty, or a copy of `template`); its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    asyncio.run(_on_server(server, f'CREATE DATABASE "{name}"{copy}'))
    return with_database(server, name)


def drop_database(server: str, url: str) -> None:
    name = database_name(url)
    asyncio.run(
        _on_server(
            server,
            # A template refuses DROP until it is a plain database again (and a
            # database that was never made, e.g. a copy a failed test did not
            # take, is no error: DROP ... IF EXISTS says the same).
            f"DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_database WHERE datname = '{name}') THEN"
            f" EXECUTE 'ALTER DATABASE \"{name}\" WITH IS_TEMPLATE false'; END IF; END $$",
            f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
        )
    )


def seal_template(server: str, url: str) -> str:
    """Make the database at `url` a template nobody connects to; its name.

    CREATE DATABASE ... TEMPLATE refuses while anyone is connected to the
    template ("source database is being accessed by other users"): a fixture
    that left one connection open would fail every later clone, so none may open.
    """
    name = database_name(url)
    asyncio.run(
        _on_server(server, f'ALTER DATABASE "{name}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false')
    )
    return name


def migrated_template(server: str) -> str:
    """A database at the latest migration, sealed as a template; its name."""
    url = create_database(server, prefix="llmgw_template")
    upgrade(url)
    return seal_template(server, url)


def drop_template(server: str, name: str) -> None:
    drop_database(server, with_database(server, name))


# CPU seconds (user + system) each embedded server of this process used, its
# backends included, read as it stops: `dev.py test` prints them beside the
# test processes' own, since on a shared machine wall time alone does not say
# whether a change to the suite made it cheaper.
SERVER_CPU: list[float] = []


def postmaster_cpu_seconds(data_dir: Path) -> float | None:
    """User + system CPU of the postmaster on `data_dir` and the backends it reaped."""
    from service.database.embedded import postmaster_pid

    pid = postmaster_pid(data_dir)
    if pid is None:
        return None
    try:
        # /proc/<pid>/stat: the fields after the command's closing parenthesis,
        # from field 3; utime, stime, cutime, cstime are fields 14-17.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = sum(int(f) for f in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def embedded_server() -> Iterator[str]:
    """An embedded PostgreSQL of this run's own (THROWAWAY_SETTINGS); its libpq URL."""
    from service.database.embedded import EmbeddedPostgres

    # Under /tmp: the server runs as an unprivileged user that must be able
    # to traverse every parent of its data directory.
    root = Path(tempfile.mkdtemp(prefix="llmgw-test-pg-", dir="/tmp"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "data")
    try:
        asyncio.run(
            _on_server(
                libpq_url(server.url),
                *(f"ALTER SYSTEM SET {k} = '{v}'" for k, v in THROWAWAY_SETTINGS.items()),
            )
        )
        # max_connections takes a restart (the others would take a reload).
        server.stop()
        server = EmbeddedPostgres(root / "data")
        yield libpq_url(server.url)
    finally:
        used = postmaster_cpu_seconds(root / "data")
        if used is not None:
            SERVER_CPU.append(used)
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


# Every table of the schema but Alembic's own: a table a migration adds is
# emptied between tests without anyone listing it here.
SCHEMA_TABLES = (
    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')"
    " AND c.relname <> 'alembic_version' ORDER BY 1"
)
USED_SEQUENCES = (
    "SELECT quote_ident(sequencename) FROM pg_sequences"
    " WHERE schemaname = current_schema() AND last_value IS NOT NULL"
)


# Per database: the statement naming the tables that hold rows (dirty_tables).
_dirty: dict[str, str] = {}


async def dirty_tables(conn: AsyncConnection) -> list[str]:
    """The tables that hold rows: most tests write to a few of the schema's tables, and
    emptying (VACUUM above all) costs per table."""
    database = str(conn.engine.url)
    if database not in _dirty:
        tables = [r[0] for r in await conn.exec_driver_sql(SCHEMA_TABLES)]
        checks = ", ".join(
            f'CASE WHEN EXISTS (SELECT 1 FROM "{t}") THEN \'"{t}"\' END' for t in tables
        )
        _dirty[database] = f"SELECT array_remove(ARRAY[{checks}]::text[], NULL)"
    found: list[str] = (await conn.exec_driver_sql(_dirty[database])).scalar_one()
    return found


async def empty(engine: AsyncEngine) -> None:
    """Every table of the database empty, its sequences restarted: a test's clean inventory.

    DELETE, then VACUUM, not TRUNCATE: TRUNCATE gives each table and index a new
    file and invalidates every pooled connection's cache of them, 40-70 ms of the
    server's CPU per test that wrote anything (against 3-7 ms), and most tests
    write. VACUUM then removes the deleted rows and cuts the tables' files back
    to nothing, so a test's scans and plans meet no earlier test's rows, live or
    dead. Deleted with session_replication_role = replica (a superuser's setting:
    the tests' own server, and a TEST_DATABASE_URL, which must CREATE DATABASE):
    every table holding rows is emptied at once, so no foreign key is left
    dangling, and the triggers (tenancy's counters) have nothing to count.
    """
    async with engine.begin() as conn:
        tables = await dirty_tables(conn)
        if tables:
            await conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
            for table in tables:
                await conn.exec_driver_sql(f"DELETE FROM {table}")
        # A sequence advanced by rows deleted since (or by a rolled-back insert).
        for (sequence,) in await conn.exec_driver_sql(USED_SEQUENCES):
            await conn.exec_driver_sql(f"ALTER SEQUENCE {sequence} RESTART")
    if tables:
        async with engine.connect() as conn:
            autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await autocommit.exec_driver_sql(f"VACUUM {', '.join(tables)}")
