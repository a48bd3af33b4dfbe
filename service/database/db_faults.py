"""Telling "PostgreSQL is unreachable" apart from a bug.

While the database restarts, every request fails the same way, and the caller
must be able to tell that from a bug in the service: the first is worth a
retry in a second, the second is not. These are the exceptions a dead or
restarting server produces, wherever they surface (engine checkout, pool
pre-ping, a query on a connection the server closed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from service.database import request_state
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
    # "sorry, too many clients already" (SQLSTATE 53300): a new connection refused at
    # max_connections (or a role's or database's limit). It passes as others return
    # theirs; answered as a crash it was an INTERNAL_ERROR with a traceback.
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,  # "terminating connection due to administrator command"
    asyncpg.CrashShutdownError,
    # "cannot execute INSERT in a read-only transaction": the server is a
    # standby now (a demoted primary, or a connection opened on the wrong host).
    asyncpg.ReadOnlySQLTransactionError,
    asyncpg.IdleSessionTimeoutError,
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
    """The answer of a request the database could not serve; made, the request's answer says Retry-After.

    `outcome_unknown`: the connection failed while the change was being
    committed (service/database/connections.py, CommitOutcomeUnknown) and the
    change is not one that may simply be made again: it may have been applied.
    """

    code = "DATABASE_UNAVAILABLE"

    def __init__(self, *, outcome_unknown: bool = False) -> None:
        if outcome_unknown:
            message = (
                "database unavailable while this change was being committed: it may or may not "
                "have been applied; read it back before retrying"
            )
        else:
            message = "database unavailable; retry shortly"
        super().__init__(message)
        self.outcome_unknown = outcome_unknown
        # The HTTP answer carries Retry-After (service/web/exchange.py).
        request_state.note_unavailable()

    @property
    def extensions(self) -> dict[str, Any]:
        if self.outcome_unknown:
            return {"code": self.code, "outcome": "unknown"}
        return {"code": self.code}


class StatementTimedOut(InventoryError):
    """A statement PostgreSQL cancelled (SQLSTATE 57014, query_canceled): the answer, made.

    Every statement of the service carries a statement_timeout below its
    request's time limit (Settings.statement_timeout), and a loaded server
    reaches it: an expected outcome, answered with the time limit's code and
    Retry-After (a retry may find the server less busy), never a bug. What the
    statement was writing is rolled back with its transaction.
    """

    code = "REQUEST_TIMEOUT"

    def __init__(self) -> None:
        super().__init__(
            "the database stopped a statement of this request at its time limit "
            "(statement_timeout, below INVENTORY_REQUEST_TIMEOUT); nothing it was writing "
            "was kept: retry shortly"
        )
        # The HTTP answer carries Retry-After (service/web/exchange.py).
        request_state.note_unavailable()


def is_statement_timeout(error: BaseException | None) -> bool:
    """True when `error`, or what it wraps, is PostgreSQL cancelling a statement."""
    return any(isinstance(cause, asyncpg.QueryCanceledError) for cause in _causes(error))


class CommitOutcomeUnknown(Exception):
    """COMMIT was sent and the connection failed before its answer: committed or not, no one here knows.

    Raised by connections.transaction from the connection's own error (its
    __cause__). Only a change that can be made again safely (a place by
    replica id, a heartbeat, a report) may be retried after it
    (service/database/transactions.py); any other is answered
    DatabaseUnavailable(outcome_unknown=True).
    """


def _causes(error: BaseException | None) -> Iterator[BaseException]:
    """`error` and what it wraps (SQLAlchemy's `orig`, or its cause), a few levels deep."""
    seen = 0
    while error is not None and seen < 5:
        yield error
        orig = getattr(error, "orig", None)
        error = orig if isinstance(orig, BaseException) else error.__cause__
        seen += 1


def is_database_unavailable(error: BaseException | None) -> bool:
    """True when `error`, or what it wraps, means the database cannot be reached."""
    return any(isinstance(cause, _UNAVAILABLE) for cause in _causes(error))


# Errors after which a connection must not be handed out again, by the reason
# counted (inventory_db_connections_dropped_total). Each is the connection's
# fault or its server's, not the statement's: a demoted primary answers every
# later write on the same connection "read-only transaction" (595 in a row on
# one pooled connection, measured with Patroni), a terminated session or a
# restarting server never answers again.
_UNUSABLE: tuple[tuple[type[BaseException], str], ...] = (
    (asyncpg.ReadOnlySQLTransactionError, "read_only"),
    (asyncpg.AdminShutdownError, "terminated"),
    (asyncpg.CrashShutdownError, "terminated"),
    (asyncpg.IdleSessionTimeoutError, "terminated"),
    (asyncpg.CannotConnectNowError, "starting_up"),
    (asyncpg.PostgresConnectionError, "lost"),
    (asyncpg.InterfaceError, "lost"),
    (asyncpg.InternalClientError, "lost"),
    (OperationalError, "lost"),
    (InterfaceError, "lost"),
    (OSError, "lost"),
)


def connection_unusable(error: BaseException | None) -> str | None:
    """Why the connection that raised `error` must be dropped (a metric label), None if it may be reused.

    A pool timeout is not the connection's fault (every one was busy), nor is
    the request's own time limit; a statement's error (a constraint, a
    deadlock victim) leaves the connection fine.
    """
    for cause in _causes(error):
        if isinstance(cause, (PoolTimeout, TimeoutError)):
            return None
        for kind, reason in _UNUSABLE:
            if isinstance(cause, kind):
                return reason
    return None
