"""/readyz: may a load balancer send this process traffic?

Ready means the database answers AND its schema is the one this code was
written for. A process that starts against a database a newer (or older)
release migrated would answer with the wrong columns; it must stay out of
rotation rather than fail every request.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service import backup_status
from service.database import connections
from service.database.connections import Connection
from service.database.migrations import head_revision, stored_revision, works_with


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    revision: str | None = None
    expected: str | None = None
    # /readyz's backup details (service/backup_status.py); None on a standby,
    # or when the database did not answer.
    backup: dict[str, Any] | None = None


@lru_cache(maxsize=1)
def expected_revision() -> str | None:
    # Read from the migration scripts on disk once: they don't change under
    # a running process.
    return head_revision()


async def check(engine: AsyncEngine, within: float) -> Readiness:
    expected = expected_revision()
    try:
        async with asyncio.timeout(within), connections.autocommit(engine) as conn:
            revision, keeps = await stored_revision(conn)
            backup = await _backup_details(conn)
    except TimeoutError:
        return Readiness(False, f"the database did not answer within {within:g} s", None, expected)
    except Exception as error:
        first_line = (str(error) or type(error).__name__).splitlines()[0]
        return Readiness(False, f"the database is unavailable: {first_line}", None, expected)
    if revision != expected and works_with(expected, revision, keeps):
        # A newer release migrated (expand), keeping this one working: serve on
        # while the processes are replaced one by one (docs/deployment/upgrades.md).
        return Readiness(
            True,
            f"ready: the schema is at {revision}, newer than this release's {expected}, and "
            f"keeps code from {keeps} working",
            revision,
            expected,
            backup,
        )
    if revision != expected:
        return Readiness(
            False,
            f"the schema is at {revision or 'no revision'}, this release needs {expected}",
            revision,
            expected,
            backup,
        )
    return Readiness(True, "ready", revision, expected, backup)


async def _backup_details(conn: Connection) -> dict[str, Any] | None:
    try:
        status = await backup_status.read(conn)
    except Exception as error:  # reported, never a reason to be unready
        first_line = (str(error) or type(error).__name__).splitlines()[0]
        return {"ok": False, "problems": [f"backup status unreadable: {first_line}"]}
    return None if status is None else status.details()
