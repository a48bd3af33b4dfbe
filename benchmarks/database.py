"""The benchmark's own PostgreSQL: an embedded server in a temp dir, or BENCH_DATABASE_URL.

Never the service's or the tests' database: the suite creates a database per
cluster size, fills it, and drops it afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from service.database.db import libpq_url
from service.database.migrations import upgrade


def with_database(url: str, name: str) -> str:
    parts = urlsplit(libpq_url(url))
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@contextlib.contextmanager
def postgres_server() -> Iterator[tuple[str, str]]:
    """A server URL to create databases on, and a sentence saying which server it is."""
    external = os.environ.get("BENCH_DATABASE_URL")
    if external:
        yield libpq_url(external), "BENCH_DATABASE_URL"
        return
    from service.database.embedded import EmbeddedPostgres

    # Under /tmp: the embedded server runs as an unprivileged user that must
    # traverse every parent folder of its data directory.
    root = Path(tempfile.mkdtemp(prefix="llmgw-bench-pg-", dir="/tmp"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "data")
    try:
        yield libpq_url(server.url), f"embedded PostgreSQL in {root}"
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def create_database(server_url: str) -> str:
    name = f"llmgw_bench_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return with_database(server_url, name)


async def drop_database(server_url: str, url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def migrate(url: str) -> None:
    upgrade(url)


async def server_version(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        version: str = await conn.fetchval("SHOW server_version")
        return version
    finally:
        await conn.close()


async def postmaster_pid(url: str) -> int | None:
    """The pid of the server's postmaster when it runs on this machine (the embedded one), else None.

    Its processes' CPU is PostgreSQL's share of a figure (postgres_cpu); on a
    machine shared with other work, the machine's CPU less the client's is not.
    """
    conn = await asyncpg.connect(url)
    try:
        # Read while the backend lives: once closed, its /proc entry is gone.
        return _postgres_parent(await conn.fetchval("SELECT pg_backend_pid()"))
    finally:
        await conn.close()


def _postgres_parent(backend: int) -> int | None:
    try:
        parent = int(_stat(backend)[1])
        if "postgres" not in Path(f"/proc/{parent}/comm").read_text():
            return None
    except (OSError, ValueError, IndexError):
        return None
    return parent


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command: state, ppid, ... (utime is [11])."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def postgres_cpu(postmaster: int) -> float:
    """CPU seconds the server's processes have used: the postmaster, its exited children, its live ones.

    A backend that exits between two readings moves from the live sum to the
    postmaster's children's time (cutime, cstime), so differences stay right.
    """
    fields = _stat(postmaster)
    total = sum(int(x) for x in fields[11:15])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            child = _stat(int(entry.name))
        except (OSError, ValueError):
            continue
        if child[1] == str(postmaster):
            total += int(child[11]) + int(child[12])
    return total / TICKS
