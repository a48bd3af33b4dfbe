"""Start-up against a PostgreSQL that is not there yet: wait with backoff, or say why waiting is pointless.

A replica that starts while PostgreSQL restarts, fails over or is still
initialising must not exit (a crash loop is noise, and an orchestrator's
restart backoff grows to minutes): it waits, without listening, so load
balancers and health checks see it as not ready, and logs why. What waiting
cannot fix, a wrong password, an unknown role or database, stops it at once
with a message naming the hosts tried and never the password.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from service.database import database_url
from service.database.db import APPLICATION_NAME
from service.database.db_faults import is_database_unavailable

log = logging.getLogger(__name__)

FIRST_DELAY = 0.5
MAX_DELAY = 10.0
# A still-failing database is logged again this often, not on every attempt.
REPEAT_LOG_EVERY = 30.0

# Errors a retry cannot fix: the operator must change DATABASE_URL or the server.
_FATAL: tuple[type[BaseException], ...] = (
    asyncpg.InvalidPasswordError,
    asyncpg.InvalidAuthorizationSpecificationError,  # no such role, or pg_hba refuses it
    asyncpg.InvalidCatalogNameError,  # no such database
)


class DatabaseStartupError(RuntimeError):
    """The database cannot be used as configured; the message is safe to print."""


def describe(database: database_url.Database, error: BaseException) -> str:
    first_line = (str(error) or type(error).__name__).splitlines()[0]
    what = database.redact(f"{type(error).__name__}: {first_line}")
    return f"PostgreSQL at {database.hosts_text} (DATABASE_URL={database.shown!r}): {what}"


async def _connect_once(database: database_url.Database, seconds: float) -> None:
    conn = await database_url.connect(
        database.dsn, timeout=seconds, server_settings={"application_name": APPLICATION_NAME}
    )
    await conn.close(timeout=seconds)


async def wait_until_reachable(
    url: str,
    *,
    connect_timeout: float = 5.0,
    within: float | None = None,
    connect: Callable[[database_url.Database, float], Awaitable[Any]] = _connect_once,
) -> float:
    """Return once a connection to DATABASE_URL succeeds; the seconds it took.

    Retries unreachable hosts (and a standby that is not yet read-write) with
    jittered exponential backoff up to MAX_DELAY, forever or for `within`
    seconds; raises DatabaseStartupError on what no retry fixes, or when
    `within` ran out.
    """
    database = database_url.parse(url)
    started = time.monotonic()
    delay = FIRST_DELAY
    last_logged = float("-inf")
    attempt = 0
    while True:
        attempt += 1
        try:
            await connect(database, connect_timeout)
        except _FATAL as error:
            raise DatabaseStartupError(describe(database, error)) from None
        except Exception as error:
            # Unreachable hosts, and (target_session_attrs) no primary among
            # them yet while a standby is being promoted.
            if not is_database_unavailable(error):
                raise DatabaseStartupError(describe(database, error)) from None
            waited = time.monotonic() - started
            if within is not None and waited + delay > within:
                raise DatabaseStartupError(
                    f"gave up after {waited:.0f} s ({attempt} attempts): "
                    + describe(database, error)
                ) from None
            now = time.monotonic()
            if now - last_logged >= REPEAT_LOG_EVERY:
                last_logged = now
                log.warning(
                    "not ready: waiting for %s; attempt %d, retrying with backoff up to %g s",
                    describe(database, error),
                    attempt,
                    MAX_DELAY,
                )
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, MAX_DELAY)
            continue
        waited = time.monotonic() - started
        if attempt > 1:
            log.info("PostgreSQL at %s reachable after %.1f s", database.hosts_text, waited)
        return waited
