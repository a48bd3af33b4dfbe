"""One transaction per mutation, retried when it failed without effect: a lost conflict, or the database away.

Two kinds of failure are retried by running the whole unit of work again
from the start, in a new transaction:

- PostgreSQL picked the transaction as a deadlock or serialization victim:
  nothing of it was committed; up to MAX_ATTEMPTS attempts, then CONFLICT.
- The database could not serve it (a demoted or restarting primary, a
  terminated session, no host answering; db_faults.is_database_unavailable),
  before COMMIT was sent: nothing was committed either. The connection is
  dropped (connections.py) and the work runs again on a new one, which finds
  the new primary, for as long as the write's budget lasts (RetryBudget).

A failure while COMMIT was in flight (CommitOutcomeUnknown) is neither: the
server may have committed. Only an idempotent write (`idempotent=True`: one
whose second run finds the first one's effect and answers the same, as a
place or an allocation by replica id, a heartbeat or a report does) is run
again then; any other is answered DATABASE_UNAVAILABLE saying the outcome is
unknown, never silently made twice. A release is not idempotent in this
sense: its answer counts the GPUs it freed, and a second run, finding
nothing, would answer 0 for GPUs the first may have freed.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections, request_state
from service.database.connections import NativeConnection
from service.database.db_faults import (
    CommitOutcomeUnknown,
    DatabaseUnavailable,
    connection_unusable,
    is_database_unavailable,
)
from service.database.request_state import DeadlinePassed
from service.errors import InventoryError

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_ATTEMPTS = 5
# SQLSTATEs PostgreSQL uses for a transaction it aborted to let another win.
RETRYABLE_SQLSTATES = {"40001", "40P01"}
# Waits between attempts while the database is away: doubling from the first
# to the last, each drawn at random between half and all of it, so that the
# writers of a process do not all knock at once on a primary just promoted.
FIRST_WAIT = 0.05
LONGEST_WAIT = 1.0


class TransactionConflict(InventoryError):
    code = "CONFLICT"

    def __init__(self, attempts: int) -> None:
        super().__init__(
            f"the change kept colliding with concurrent changes ({attempts} attempts); retry later"
        )


@dataclass
class RetryCounts:
    """Writes this process ran again, and the ones it gave up on, by cause (/metrics).

    Causes: conflict (a deadlock or serialization victim), unavailable (the
    database away before COMMIT), commit_unknown (the connection failed in
    COMMIT: run again only when idempotent).
    """

    retried: dict[str, int] = field(default_factory=dict)
    gave_up: dict[str, int] = field(default_factory=dict)

    def count(self, table: dict[str, int], cause: str) -> None:
        table[cause] = table.get(cause, 0) + 1


RETRIES = RetryCounts()


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


class RetryBudget:
    """How long one write may keep trying while the database is away, and what it tried.

    The budget ends at the first of: `window` seconds after the first
    attempt (INVENTORY_WRITE_RETRY, the engine's PoolSpec.write_retry), the
    request's own time limit less a connection timeout (request_state), so
    that the last attempt can still answer before the request is stopped, and
    the client's deadline when it sent one (after it, nothing may commit).
    """

    def __init__(self, engine: AsyncEngine, idempotent: bool) -> None:
        spec = connections.spec_of(engine)
        self.idempotent = idempotent
        self.window = spec.write_retry
        self.connect_timeout = spec.timeout
        self.started = asyncio.get_running_loop().time()
        self.conflicts = 0
        self.waits = 0

    def _ends_at(self) -> float:
        ends = self.started + self.window
        state = request_state.current()
        if state is not None and state.limit_at is not None:
            ends = min(ends, state.limit_at - self.connect_timeout)
        if state is not None and state.client_deadline is not None:
            ends = min(ends, state.client_deadline.at)
        return ends

    async def after(self, error: Exception) -> None:
        """Wait before the next attempt, or raise what the caller is answered with."""
        if sqlstate(error) in RETRYABLE_SQLSTATES:
            self.conflicts += 1
            if self.conflicts >= MAX_ATTEMPTS:
                RETRIES.count(RETRIES.gave_up, "conflict")
                raise TransactionConflict(MAX_ATTEMPTS) from error
            RETRIES.count(RETRIES.retried, "conflict")
            log.info(
                "transaction lost a conflict (attempt %d): %s", self.conflicts, sqlstate(error)
            )
            await asyncio.sleep(random.uniform(0, 0.01 * 2**self.conflicts))
            return
        if isinstance(error, CommitOutcomeUnknown):
            cause = "commit_unknown"
            if not self.idempotent:
                RETRIES.count(RETRIES.gave_up, cause)
                log.warning("the connection failed during COMMIT: %s", error.__cause__)
                raise DatabaseUnavailable(outcome_unknown=True) from error
        elif _without_effect(error):
            cause = "unavailable"
        else:
            raise error
        wait = min(FIRST_WAIT * 2**self.waits, LONGEST_WAIT) * random.uniform(0.5, 1.0)
        if asyncio.get_running_loop().time() + wait >= self._ends_at():
            RETRIES.count(RETRIES.gave_up, cause)
            raise error
        self.waits += 1
        RETRIES.count(RETRIES.retried, cause)
        log.info("database unavailable, retrying a write in %.2f s: %s", wait, _first_line(error))
        await asyncio.sleep(wait)


def _without_effect(error: BaseException) -> bool:
    """The database away before anything was committed; not SQLAlchemy's pool merely full."""
    if isinstance(error, PoolTimeout):
        return False
    return is_database_unavailable(error) or connection_unusable(error) is not None


def _first_line(error: BaseException) -> str:
    return (str(error) or type(error).__name__).splitlines()[0]


async def in_transaction(
    engine: AsyncEngine,
    work: Callable[[NativeConnection], Awaitable[T]],
    *,
    idempotent: bool = False,
) -> T:
    """Run `work` in one transaction and commit it; retried as the module says."""
    budget = RetryBudget(engine, idempotent)
    while True:
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
        except Exception as error:
            await budget.after(error)


async def retried(attempt: Callable[[], Awaitable[T]], engine: AsyncEngine) -> T:
    """An idempotent write outside in_transaction (a batched heartbeat, a one-statement report),
    run again while the database is away, within the same budget.

    Any failure of such a write may have come after its statement committed;
    it is run again only because running it twice is the same as once.
    """
    budget: RetryBudget | None = None
    state = request_state.current()
    deadline = None if state is None else state.client_deadline
    while True:
        if deadline is not None and asyncio.get_running_loop().time() >= deadline.at:
            # Not sent after the client stopped waiting (a statement outside a
            # transaction block commits as it ends: there is no COMMIT to check).
            raise DeadlinePassed(deadline, "before_begin")
        try:
            return await attempt()
        except Exception as error:
            if budget is None:
                budget = RetryBudget(engine, idempotent=True)
            await budget.after(error)
