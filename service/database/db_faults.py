"""Telling "PostgreSQL is unreachable" apart from a bug.

While the database restarts, every request fails the same way, and the caller
must be able to tell that from a bug in the service: the first is worth a
retry in a second, the second is not. These are the exceptions a dead or
restarting server produces, wherever they surface (engine checkout, pool
pre-ping, a query on a connection the server closed).
"""

from __future__ import annotations

import asyncio

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from service.errors import InventoryError

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,  # connection refused, socket file gone
    asyncio.TimeoutError,  # asyncpg's connect timeout (TimeoutError on 3.11)
    PoolTimeout,  # every pooled connection busy for db_timeout seconds
    OperationalError,
    InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,  # "the database system is starting up"
    asyncpg.AdminShutdownError,  # "terminating connection due to administrator command"
    asyncpg.CrashShutdownError,
    # "cannot switch to state 15; another operation is in progress": asyncpg's
    # protocol left mid-reply by a connection the server cut, met at COMMIT.
    # Nothing was committed; the next checkout pings and reconnects.
    asyncpg.InternalClientError,
)


# Retry-After (seconds) on a 503 for a condition that passes by itself: the
# database unreachable while a standby is promoted
# (tests/operations/test_failover.py) or PostgreSQL restarts
# (tests/operations/test_compose_stack.py), or a replica leaving the load
# balancer. A client that honours it comes back soon, not in a tight loop.
RETRY_AFTER_SECONDS = 1


class DatabaseUnavailable(InventoryError):
    code = "DATABASE_UNAVAILABLE"

    def __init__(self) -> None:
        super().__init__("database unavailable; retry shortly")


def is_database_unavailable(error: BaseException | None) -> bool:
    """True when `error`, or what it wraps, means the database cannot be reached."""
    seen = 0
    while error is not None and seen < 5:
        if isinstance(error, _UNAVAILABLE):
            return True
        orig = getattr(error, "orig", None)
        error = orig if isinstance(orig, BaseException) else error.__cause__
        seen += 1
    return False
