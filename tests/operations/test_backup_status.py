"""Backups visible: /readyz's backup details and the backup metrics, from the archiver and the schedule's report.

What docs/operations/backup.md promises an operator: a failing archive_command
is a metric (`inventory_backup_archive_failing` 1) and one log line, a backup
that failed or a repository that cannot be read is named in /readyz's details,
and none of it makes the process unready (the database still serves). Against
real servers: the session's (archiving off), and one of this test's own with
archive_mode on and an archive_command that fails, then works.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest

from service import backup_status
from service.config import Settings
from service.database.db import create_engine, dispose
from service.database.embedded import EmbeddedPostgres
from service.database.migrations import upgrade
from service.metrics import Exposition, _backups
from service.web.app import create_app
from tests.support import REPO
from tests.support.databases import create_database, drop_database
from tests.support.metrics import SAMPLE

STATUS_SQL = (REPO / "deploy" / "backup" / "status.sql").read_text()


@pytest.fixture
def status_url(server_url: str) -> Iterator[str]:
    """A migrated database of its own, with the backup schedule's table (deploy/backup/status.sql)."""
    url = create_database(server_url, prefix="llmgw_backups")
    upgrade(url)

    async def create() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(STATUS_SQL)
        finally:
            await conn.close()

    asyncio.run(create())
    yield url
    drop_database(server_url, url)


@pytest.fixture
async def status_client(status_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    settings = Settings(db_timeout=5)
    engine = create_engine(status_url, settings)
    app = create_app(settings, engine=engine)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://inventory"
    ) as client:
        yield client, status_url
    await dispose(engine)


async def report(url: str, **columns: object) -> None:
    """A row as the schedule writes it (deploy/backup/llmgw_backup.py's WRITE_STATUS)."""
    row = {"checked_at": datetime.now(UTC), "repository_readable": True, "backups": 0, **columns}
    names = ", ".join(row)
    marks = ", ".join(f"${i + 1}" for i in range(len(row)))
    updates = ", ".join(f"{n} = excluded.{n}" for n in row)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            f"INSERT INTO backups.status (one, {names}) VALUES (true, {marks}) "
            f"ON CONFLICT (one) DO UPDATE SET {updates}",
            *row.values(),
        )
    finally:
        await conn.close()


async def samples(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    found = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and match.group(1).startswith("inventory_backup_"):
            found[match.group(1)] = float(match.group(3))
    return found


async def test_backups_that_work_are_reported_and_the_process_is_ready(
    status_client: tuple[httpx.AsyncClient, str],
) -> None:
    client, url = status_client
    backed_up = datetime.now(UTC) - timedelta(minutes=5)
    await report(
        url,
        last_backup_at=backed_up,
        last_backup_type="incr",
        last_full_at=backed_up - timedelta(hours=1),
        oldest_restorable_at=backed_up - timedelta(days=1),
        backups=3,
        last_attempt_ok=True,
    )
    response = await client.get("/readyz")
    assert response.status_code == 200, response.text
    backup = response.json()["backup"]
    assert backup["lastBackupAt"] == backed_up.isoformat()
    assert backup["lastBackupType"] == "incr"
    assert backup["oldestRestorableAt"] == (backed_up - timedelta(days=1)).isoformat()
    # The session's server does not archive: said, not hidden.
    assert backup["archive"]["mode"] == "off"
    assert backup["problems"] == [
        "WAL archiving is off (archive_mode): no restore to a time is possible"
    ]
    found = await samples(client)
    assert found["inventory_backup_last_success_timestamp_seconds"] == backed_up.timestamp()
    assert found["inventory_backup_last_attempt_failed"] == 0
    assert found["inventory_backup_repository_readable"] == 1
    assert found["inventory_backup_archive_failing"] == 0
    assert found["inventory_backup_problems"] == 1
    assert found["inventory_backup_report_age_seconds"] < 60


async def test_a_failed_backup_and_an_unreadable_repository_are_named_and_the_process_stays_ready(
    status_client: tuple[httpx.AsyncClient, str],
) -> None:
    client, url = status_client
    await report(url, last_attempt_ok=False, last_error="full backup failed: disk full",
                 last_attempt_at=datetime.now(UTC))  # fmt: skip
    response = await client.get("/readyz")
    assert response.status_code == 200
    problems = response.json()["backup"]["problems"]
    assert "the last backup failed: full backup failed: disk full" in problems
    assert "the repository holds no backup yet" in problems
    assert (await samples(client))["inventory_backup_last_attempt_failed"] == 1

    await report(url, repository_readable=False, last_error="unable to open repository")
    response = await client.get("/readyz")
    assert response.status_code == 200
    assert (
        "the backup repository cannot be read: unable to open repository"
        in response.json()["backup"]["problems"]
    )
    assert (await samples(client))["inventory_backup_repository_readable"] == 0

    # A schedule that stopped reporting (no primary runs it) is said too.
    await report(url, checked_at=datetime.now(UTC) - timedelta(hours=1), last_attempt_ok=True)
    problems = (await client.get("/readyz")).json()["backup"]["problems"]
    assert any(p.startswith("the backup schedule last reported 36") for p in problems), problems


async def test_without_a_schedule_the_details_say_so(client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200
    assert (
        "no backup schedule has reported (backups.status is absent)"
        in (response.json()["backup"]["problems"])
    )


def test_archive_lag_counts_from_the_end_of_the_last_segment_archived() -> None:
    now = datetime.now(UTC)
    ten_ago = now - timedelta(seconds=10)
    segment = backup_status.WAL_SEGMENT_BYTES
    # Segment 0/5 archived: it ends at 0/6000000. Writing inside 0/6: only the open segment.
    assert backup_status.archive_lag("0/6000100", "000000010000000000000005", ten_ago, now) == (
        0x100,
        0.0,
    )
    # Two whole segments written since: they have waited since the last success.
    lag_bytes, lag_seconds = backup_status.archive_lag(
        "0/8000000", "000000010000000000000005", ten_ago, now
    )
    assert lag_bytes == 2 * segment and lag_seconds == pytest.approx(10, abs=0.01)
    # Across a log id, and on a later timeline (segments number on).
    assert backup_status.archive_lag("1/1000", "0000000200000000000000FF", now, now) == (
        0x1000,
        0.0,
    )
    # Names that are not whole segments say nothing.
    assert backup_status.archive_lag("0/6000000", "00000002.history", now, now) == (None, None)
    assert backup_status.archive_lag("0/6000000", "000000010000000000000005.partial", now, now) == (
        None,
        None,
    )


@pytest.fixture
def archiving_server(own_postgres: Path) -> Iterator[str]:
    """A server of this test's own, archive_mode on, its archive_command failing at first."""
    server = EmbeddedPostgres(own_postgres)

    async def configure(url: str) -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("ALTER SYSTEM SET archive_mode = 'on'")
            await conn.execute("ALTER SYSTEM SET archive_command = '/bin/false'")
        finally:
            await conn.close()

    asyncio.run(configure(server.url))
    server.stop()
    server = EmbeddedPostgres(own_postgres)  # archive_mode needs a restart
    try:
        yield server.url
    finally:
        server.stop()


async def switch_until(url: str, check: str, within: float = 60) -> None:
    conn = await asyncpg.connect(url)
    try:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS churn (n int); INSERT INTO churn VALUES (1)"
            )
            await conn.execute("SELECT pg_switch_wal()")
            if await conn.fetchval(f"SELECT {check} FROM pg_stat_archiver"):
                return
            await asyncio.sleep(0.5)
    finally:
        await conn.close()
    raise AssertionError(f"pg_stat_archiver never showed {check}")


async def read_and_render(url: str) -> tuple[backup_status.BackupStatus, dict[str, float]]:
    engine = create_engine(url, Settings(db_timeout=5))
    try:
        async with engine.connect() as conn:
            status = await backup_status.read(conn)
            out = Exposition()
            await _backups(conn, out)
    finally:
        await dispose(engine)
    assert status is not None
    rendered = {}
    for line in out.text().splitlines():
        match = SAMPLE.match(line)
        if match:
            rendered[match.group(1)] = float(match.group(3))
    return status, rendered


async def test_a_failing_archive_command_is_a_metric_and_one_log_line_until_it_works_again(
    archiving_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = archiving_server
    backup_status.ARCHIVE_WATCH.__init__()  # type: ignore[misc]  # this process saw nothing yet
    await switch_until(url, "failed_count > 0")
    with caplog.at_level(logging.INFO, logger="service.backup_status"):
        status, rendered = await read_and_render(url)
        again, _ = await read_and_render(url)
    assert status.archive.failing and again.archive.failing
    assert rendered["inventory_backup_archive_failing"] == 1
    assert rendered["inventory_backup_archive_failures_total"] >= 1
    assert any(p.startswith("archiving WAL fails: ") for p in status.problems), status.problems
    # Said once, not at every scrape.
    warnings = [r for r in caplog.records if "WAL archiving fails" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    # The database still serves meanwhile.
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("INSERT INTO churn VALUES (2) RETURNING n") == 2
        await conn.execute("ALTER SYSTEM SET archive_command = '/bin/true'")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()
    await switch_until(url, "last_archived_time > last_failed_time")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="service.backup_status"):
        status, rendered = await read_and_render(url)
    assert not status.archive.failing
    assert rendered["inventory_backup_archive_failing"] == 0
    assert any("WAL archiving works again" in r.getMessage() for r in caplog.records)
