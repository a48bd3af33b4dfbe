"""Are the backups working? The archiver's statistics and the backup schedule's report, as read by the service.

Two sources, both read on the primary with the service's own role:

- PostgreSQL's pg_stat_archiver: WAL segments archived and failed (the
  archive_command, pgBackRest's archive-push, deploy/backup/pgbackrest.conf),
  the last of each, and how far the archive is behind the WAL being written.
- backups.status, one row the backup schedule (deploy/backup/llmgw_backup.py)
  writes on the primary each round: the newest backup, the oldest moment a
  restore can reach, and whether the repository could be read and the last
  backup attempt succeeded (deploy/backup/status.sql; the backup machinery's
  report, not the inventory's schema, so it may be absent: no backups are
  configured).

Backup trouble never makes the process unready: the database still serves, and
taking every replica out of rotation because a repository is full would turn
a backup problem into an outage. It is said instead: in /readyz's details, as
metrics (docs/operations/backup.md names the alerts), and as one log line per
process when the archive starts failing and when it recovers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import text

from service.database.connections import Connection

log = logging.getLogger(__name__)

WAL_SEGMENT_BYTES = 16 * 1024 * 1024

_ARCHIVER = text(
    """
    SELECT a.archived_count, a.failed_count, a.last_archived_wal, a.last_archived_time,
           a.last_failed_wal, a.last_failed_time,
           current_setting('archive_mode') AS archive_mode,
           pg_is_in_recovery() AS in_recovery,
           CASE WHEN NOT pg_is_in_recovery() THEN pg_current_wal_lsn()::text END AS current_lsn,
           now() AS now,
           to_regclass('backups.status') IS NOT NULL AS reported
    FROM pg_stat_archiver a
    """
)

_STATUS = text(
    """
    SELECT checked_at, repository_readable, last_backup_at, last_backup_type, last_full_at,
           oldest_restorable_at, backups, repository_bytes, last_attempt_at, last_attempt_ok,
           last_error
    FROM backups.status
    """
)


@dataclass(frozen=True)
class Archive:
    mode: str  # off, on, always
    archived: int
    failed: int
    last_archived_wal: str | None
    last_archived_at: datetime | None
    last_failed_wal: str | None
    last_failed_at: datetime | None
    lag_bytes: int | None
    lag_seconds: float | None

    @property
    def failing(self) -> bool:
        """The latest attempt to archive failed (a success since clears it)."""
        if self.last_failed_at is None:
            return False
        return self.last_archived_at is None or self.last_failed_at > self.last_archived_at


@dataclass(frozen=True)
class Report:
    """backups.status: what the backup schedule last saw of the repository."""

    checked_at: datetime
    repository_readable: bool
    last_backup_at: datetime | None
    last_backup_type: str | None
    last_full_at: datetime | None
    oldest_restorable_at: datetime | None
    backups: int
    repository_bytes: int | None
    last_attempt_at: datetime | None
    last_attempt_ok: bool | None
    last_error: str | None


@dataclass(frozen=True)
class BackupStatus:
    now: datetime
    archive: Archive
    report: Report | None  # None: no backup schedule has reported (no backups configured)
    problems: tuple[str, ...] = field(default_factory=tuple)

    def details(self) -> dict[str, Any]:
        """/readyz's `backup` object."""
        a, r = self.archive, self.report

        def iso(moment: datetime | None) -> str | None:
            return None if moment is None else moment.isoformat()

        return {
            "ok": not self.problems,
            "problems": list(self.problems),
            "lastBackupAt": iso(r.last_backup_at) if r else None,
            "lastBackupType": r.last_backup_type if r else None,
            "lastFullBackupAt": iso(r.last_full_at) if r else None,
            "oldestRestorableAt": iso(r.oldest_restorable_at) if r else None,
            "statusCheckedAt": iso(r.checked_at) if r else None,
            "lastAttemptOk": r.last_attempt_ok if r else None,
            "lastError": r.last_error if r else None,
            "archive": {
                "mode": a.mode,
                "failing": a.failing,
                "failures": a.failed,
                "lastArchivedAt": iso(a.last_archived_at),
                "lastFailedAt": iso(a.last_failed_at),
                "lastFailedWal": a.last_failed_wal,
                "lagSeconds": a.lag_seconds,
                "lagBytes": a.lag_bytes,
            },
        }


def segment_end(wal: str | None) -> int | None:
    """The LSN (as an integer) just past a WAL segment file's end; None for another name.

    Names are timeline, log and segment in hex (24 characters); a .partial
    file (the old timeline's last segment after a promotion) ends nothing
    that was archived whole, and a .history file is not WAL.
    """
    if wal is None or len(wal) != 24:
        return None
    try:
        log_id, segment = int(wal[8:16], 16), int(wal[16:24], 16)
    except ValueError:
        return None
    return log_id * (1 << 32) + (segment + 1) * WAL_SEGMENT_BYTES


def lsn_value(lsn: str | None) -> int | None:
    if lsn is None:
        return None
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


def archive_lag(
    current_lsn: str | None,
    last_archived_wal: str | None,
    last_archived_at: datetime | None,
    now: datetime,
) -> tuple[int | None, float | None]:
    """(bytes, seconds) of WAL written but not yet in the archive; None where unknown.

    Bytes: from the end of the last segment archived to the position being
    written. Seconds: 0 while only the segment being written is pending (it is
    switched and archived within archive_timeout); else since the last
    segment was archived, which is how long completed segments have waited.
    """
    end, position = segment_end(last_archived_wal), lsn_value(current_lsn)
    if end is None or position is None:
        return None, None
    pending = max(0, position - end)
    if pending < WAL_SEGMENT_BYTES or last_archived_at is None:
        return pending, 0.0
    return pending, max(0.0, (now - last_archived_at).total_seconds())


# Older than this, the schedule's report is stale: it looks every 30 s by default
# (LLMGW_BACKUP_CHECK_EVERY), and a backup of a large inventory may take minutes
# between two looks.
STALE_REPORT_SECONDS = 15 * 60


def problems_of(archive: Archive, report: Report | None, now: datetime) -> tuple[str, ...]:
    """What an operator must look at, each in words; empty when backups work."""
    found = []
    if archive.mode == "off":
        found.append("WAL archiving is off (archive_mode): no restore to a time is possible")
    if archive.failing:
        found.append(
            f"archiving WAL fails: {archive.last_failed_wal} failed at "
            f"{archive.last_failed_at.isoformat() if archive.last_failed_at else '?'} "
            f"({archive.failed} failures since the statistics were reset)"
        )
    if report is None:
        found.append("no backup schedule has reported (backups.status is absent)")
        return tuple(found)
    age = (now - report.checked_at).total_seconds()
    if age > STALE_REPORT_SECONDS:
        found.append(
            f"the backup schedule last reported {age:.0f} s ago: is it running on the primary?"
        )
    if not report.repository_readable:
        found.append(f"the backup repository cannot be read: {report.last_error}")
    elif report.last_attempt_ok is False:
        found.append(f"the last backup failed: {report.last_error}")
    if report.last_backup_at is None:
        found.append("the repository holds no backup yet")
    return tuple(found)


async def read(conn: Connection) -> BackupStatus | None:
    """The status, or None on a standby (archiving is judged on the primary)."""
    row = (await conn.execute(_ARCHIVER)).one()
    if row.in_recovery:
        return None
    lag_bytes, lag_seconds = archive_lag(
        row.current_lsn, row.last_archived_wal, row.last_archived_time, row.now
    )
    archive = Archive(
        mode=row.archive_mode,
        archived=int(row.archived_count),
        failed=int(row.failed_count),
        last_archived_wal=row.last_archived_wal,
        last_archived_at=row.last_archived_time,
        last_failed_wal=row.last_failed_wal,
        last_failed_at=row.last_failed_time,
        lag_bytes=lag_bytes,
        lag_seconds=lag_seconds,
    )
    report = None
    if row.reported:
        found = (await conn.execute(_STATUS)).first()
        if found is not None:
            report = Report(
                checked_at=found.checked_at,
                repository_readable=bool(found.repository_readable),
                last_backup_at=found.last_backup_at,
                last_backup_type=found.last_backup_type,
                last_full_at=found.last_full_at,
                oldest_restorable_at=found.oldest_restorable_at,
                backups=int(found.backups),
                repository_bytes=found.repository_bytes,
                last_attempt_at=found.last_attempt_at,
                last_attempt_ok=found.last_attempt_ok,
                last_error=found.last_error,
            )
    status = BackupStatus(row.now, archive, report, problems_of(archive, report, row.now))
    ARCHIVE_WATCH.saw(archive)
    return status


class ArchiveWatch:
    """One log line per process when the archive starts failing, and one when it recovers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing: bool | None = None

    def saw(self, archive: Archive) -> None:
        with self._lock:
            was, self._failing = self._failing, archive.failing
        if archive.failing and was is not True:
            log.warning(
                "WAL archiving fails: %s failed at %s (%d failures); the database keeps "
                "serving, WAL waits in pg_wal (docs/operations/backup.md)",
                archive.last_failed_wal,
                archive.last_failed_at.isoformat() if archive.last_failed_at else "?",
                archive.failed,
            )
        elif was is True and not archive.failing:
            log.info("WAL archiving works again: %s archived", archive.last_archived_wal)


ARCHIVE_WATCH = ArchiveWatch()


Samples = list[tuple[Sequence[tuple[str, str]], float]]


def _at(moment: datetime | None) -> Samples:
    return [] if moment is None else [((), moment.timestamp())]


def families(status: BackupStatus) -> list[tuple[str, str, str, Samples]]:
    """The /metrics families (name, type, help, samples): docs/operations/backup.md's alerts."""
    a, r = status.archive, status.report
    found: list[tuple[str, str, str, Samples]] = [
        ("inventory_backup_archive_failing", "gauge",
         "1 while the latest attempt to archive a WAL segment failed (archive_command): alert "
         "on it; WAL waits in pg_wal meanwhile (docs/operations/backup.md).",
         [((), 1 if a.failing else 0)]),
        ("inventory_backup_archive_failures_total", "counter",
         "Failed attempts to archive a WAL segment since the archiver's statistics were reset "
         "(pg_stat_archiver.failed_count).",
         [((), a.failed)]),
        ("inventory_backup_archived_segments_total", "counter",
         "WAL segments archived since the archiver's statistics were reset.",
         [((), a.archived)]),
        ("inventory_backup_last_archived_timestamp_seconds", "gauge",
         "When the last WAL segment was archived (absent before the first).",
         _at(a.last_archived_at)),
        ("inventory_backup_archive_lag_seconds", "gauge",
         "How long completed WAL segments have waited for the archive (0 while only the segment "
         "being written is pending, which archive_timeout bounds); absent when unknown.",
         [] if a.lag_seconds is None else [((), a.lag_seconds)]),
        ("inventory_backup_archive_lag_bytes", "gauge",
         "Bytes of WAL written since the end of the last segment archived; absent when unknown.",
         [] if a.lag_bytes is None else [((), a.lag_bytes)]),
        ("inventory_backup_problems", "gauge",
         "Problems with backups that /readyz's backup details name (0: backups work).",
         [((), len(status.problems))]),
    ]  # fmt: skip
    if r is None:
        return found
    return [
        *found,
        ("inventory_backup_last_success_timestamp_seconds", "gauge",
         "When the newest backup in the repository finished (absent before the first).",
         _at(r.last_backup_at)),
        ("inventory_backup_last_full_timestamp_seconds", "gauge",
         "When the newest full backup in the repository finished.",
         _at(r.last_full_at)),
        ("inventory_backup_oldest_restorable_timestamp_seconds", "gauge",
         "The oldest moment a restore can reach (the end of the oldest backup kept).",
         _at(r.oldest_restorable_at)),
        ("inventory_backup_last_attempt_failed", "gauge",
         "1 when the backup schedule's last backup failed.",
         [((), 1 if r.last_attempt_ok is False else 0)]),
        ("inventory_backup_repository_readable", "gauge",
         "1 when the backup schedule could read the repository at its last look.",
         [((), 1 if r.repository_readable else 0)]),
        ("inventory_backup_report_age_seconds", "gauge",
         "Seconds since the backup schedule last reported (it looks every 30 s by default).",
         [((), max(0.0, (status.now - r.checked_at).total_seconds()))]),
    ]  # fmt: skip
