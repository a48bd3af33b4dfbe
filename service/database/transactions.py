"""One transaction per mutation, retried when PostgreSQL picks it as a deadlock or serialization victim.

The retry is safe because the whole unit of work reruns from the start in a
new transaction; nothing of the failed attempt was committed.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, ExitStack
from typing import TypeVar

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections
from service.database.connections import NativeConnection
from service.errors import InventoryError

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_ATTEMPTS = 5
# SQLSTATEs PostgreSQL uses for a transaction it aborted to let another win.
RETRYABLE_SQLSTATES = {"40001", "40P01"}


class TransactionConflict(InventoryError):
    code = "CONFLICT"

    def __init__(self, attempts: int) -> None:
        super().__init__(
            f"the change kept colliding with concurrent changes ({attempts} attempts); retry later"
        )


# What runs around each attempt of in_transaction: entered before the
# transaction begins, it yields what to do once the transaction has committed
# (never when it rolled back). Higher layers install them (the event log's
# announcements: service/event_log/events.py), so this layer imports none.
TransactionWatcher = Callable[[AsyncEngine], AbstractContextManager[Callable[[], None]]]
_watchers: list[TransactionWatcher] = []


def watch_transactions(watcher: TransactionWatcher) -> None:
    """Run `watcher` around every attempt of in_transaction, from now on."""
    _watchers.append(watcher)


def sqlstate(error: BaseException) -> str | None:
    # asyncpg's own errors carry it; SQLAlchemy's wrap one (orig, or its cause).
    orig = getattr(error, "orig", None)
    for candidate in (error, orig, getattr(orig, "__cause__", None)):
        code = getattr(candidate, "sqlstate", None)
        if isinstance(code, str):
            return code
    return None


async def in_transaction(
    engine: AsyncEngine, work: Callable[[NativeConnection], Awaitable[T]]
) -> T:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with ExitStack() as watched:
                after_commit = [watched.enter_context(watch(engine)) for watch in _watchers]
                async with connections.transaction(engine) as conn:
                    result = await work(conn)
            # Only now, after COMMIT: listeners must never hear of an event
            # that a rollback then took back.
            for action in after_commit:
                action()
            return result
        except (DBAPIError, asyncpg.PostgresError) as error:
            if sqlstate(error) not in RETRYABLE_SQLSTATES:
                raise
            log.info("transaction lost a conflict (attempt %d): %s", attempt, sqlstate(error))
            await asyncio.sleep(random.uniform(0, 0.01 * 2**attempt))
    raise TransactionConflict(MAX_ATTEMPTS)
