"""Concurrent `place` calls of one process share transactions, a few at a time.

Why: a claim's commit (its WAL flush) costs PostgreSQL more than its two
statements' rows, and N schedulers in N transactions keep N backends
competing for the cores and for the same best-fit nodes. Here the calls queue in the process; at most
`transactions` transactions place at once, each holding up to `size` claims,
one after another, and commits once. Callers wait in Python, not in
PostgreSQL's lock queues.

What stays as it was:
- Every placement is in exactly one transaction, and each claim in a batch
  is made on nodes locked by this transaction
  (placement.place_without_waiting; calls of one shape share the statement
  that picks and locks their nodes and the one claim statement that holds
  their GPUs, each call's rows written whole or not at all,
  place_several_without_waiting), without a savepoint: safe because the
  batch never waits for a node's lock. A claim that would wait for one, or
  plan over several nodes, or answer Unplaceable, is not made in the batch:
  it runs as place() in a transaction of its own afterwards (waiting while
  holding other callers' claims could deadlock).
- No late commit: a batch commits before the earliest of its calls' client
  deadlines (connections.transaction), or is rolled back and each call is
  run alone within its own. The one wait left is an
  insert meeting the same shard id uncommitted (one replica placed twice at
  once); should that close a cycle, PostgreSQL's deadlock check ends it
  with an error, which is the case below.
- A failure of one claim fails no other and half-writes nothing: a claim
  that raises ends its batch, whose transaction is rolled back whole; that
  call is retried alone (where its error, if any, is its own answer), the
  claims made before it in the batch are made again alone, and the calls
  not yet tried go back to the queue. A batch whose COMMIT fails wrote
  nothing, and each of its calls is retried alone; a retry of a place that
  did commit answers what is stored (the replica id).
- Events are announced after the commit, as for any transaction.

Batches form on their own: a call that finds no transaction placing starts
one at once (a lone caller waits for no one); calls that arrive while one is
placing wait for the next batch, and another transaction starts only when a
full batch is waiting (at most `transactions`). Why not one per free slot,
as at first: the calls of a batch share one pick and one claim statement,
so its cost is mostly per batch, and starting a transaction for whichever
call found a slot free makes small batches that pay it more often. Not one
transaction per process either: a slow database would then bound a
process's rate by one batch's round trips. A call cancelled while queued is
dropped before its claim is tried; one cancelled after may still be placed
(as a request whose client went away after COMMIT), and a retry answers
what is stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections, request_state
from service.database.request_state import ClientDeadline, DeadlinePassed
from service.database.transactions import in_transaction
from service.event_log.event_announcements import announce
from service.event_log.events import collecting_recorded
from service.scheduling.allocations import Allocated
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import (
    Unplaceable,
    place,
    place_several_without_waiting,
    place_without_waiting,
    same_shape,
)
from service.scheduling.rejections import Rejection

log = logging.getLogger(__name__)

Outcome = Allocated | Unplaceable | Rejection


class _Alone:
    """Not placed in the batch: the caller runs place() in a transaction of its own."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _client_deadline() -> ClientDeadline | None:
    state = request_state.current()
    return None if state is None else state.client_deadline


@dataclass
class _Call:
    request: PlaceRequest
    actor: str | None
    # When its client stops waiting: the batch that carries it commits before
    # the earliest of its calls' deadlines, or not at all.
    deadline: ClientDeadline | None = field(default_factory=_client_deadline)
    answer: asyncio.Future[Allocated | Rejection | _Alone] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def settle(self, outcome: Allocated | Rejection | _Alone) -> None:
        if not self.answer.done():
            self.answer.set_result(outcome)


@dataclass
class BatchCounts:
    """What the batches did, for /metrics and the tests (process-local)."""

    transactions: int = 0
    placed: int = 0
    # Calls run alone, by why: "waits" (place() had to wait, plan over
    # several nodes, or say Unplaceable), "error" (a claim raised),
    # "abandoned" (placed in a batch that another claim's error rolled
    # back), "commit" (the batch's COMMIT failed).
    alone: dict[str, int] = field(default_factory=dict)
    # Calls of a group placed by the group's one claim statement, and the
    # ones claimed apart (by the one-call path, in the batch), by why
    # (placement.place_several_without_waiting).
    together: int = 0
    apart: dict[str, int] = field(default_factory=dict)

    def count_alone(self, reason: str) -> None:
        self.alone[reason] = self.alone.get(reason, 0) + 1

    def count_claim(self, apart: str | None) -> None:
        """A group's call: placed by its claim statement (None), or claimed apart and why."""
        if apart is None:
            self.together += 1
        else:
            self.apart[apart] = self.apart.get(apart, 0) + 1


COUNTS = BatchCounts()


class PlaceQueue:
    """One per engine: the calls waiting, and how many batch transactions are running."""

    def __init__(self, engine: AsyncEngine, size: int, transactions: int) -> None:
        self.engine = engine
        self.size = size
        self.transactions = transactions
        self.waiting: deque[_Call] = deque()
        self.running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def place(self, request: PlaceRequest, actor: str | None) -> Outcome:
        call = _Call(request, actor)
        self.waiting.append(call)
        if self.running == 0 or (
            self.running < self.transactions and len(self.waiting) >= self.size
        ):
            self.running += 1
            # In no request's state: the batch carries many requests, each
            # with its own deadline (_Call.deadline), none of them its own.
            task = asyncio.get_running_loop().create_task(
                self._run(), context=request_state.without_request()
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        outcome = await call.answer
        if isinstance(outcome, _Alone):
            # Idempotent: a place of a replica id already placed answers what is stored.
            return await in_transaction(
                self.engine, lambda conn: place(conn, request, actor), idempotent=True
            )
        return outcome

    async def _run(self) -> None:
        try:
            while self.waiting:
                batch: list[_Call] = []
                while self.waiting and len(batch) < self.size:
                    call = self.waiting.popleft()
                    if not call.answer.done():  # cancelled while queued
                        batch.append(call)
                if batch:
                    await self._batch(batch)
        finally:
            self.running -= 1

    async def _batch(self, batch: list[_Call]) -> None:
        groups = _by_shape(batch)
        placed: list[tuple[_Call, Allocated | Rejection]] = []
        deadlines = [call.deadline for call in batch if call.deadline is not None]
        deadline = min(deadlines, key=lambda d: d.at) if deadlines else None
        try:
            with collecting_recorded() as recorded:
                async with connections.transaction(self.engine, deadline) as conn:
                    for k, group in enumerate(groups):
                        try:
                            outcomes = await _place_group(conn, group)
                        except Exception as error:
                            # The transaction is unusable now: it is rolled back
                            # whole (raising out of the block), these calls are
                            # retried alone, the ones not tried go back to the queue.
                            log.warning(
                                "a claim failed inside a batch of %d; its calls (%d) are "
                                "retried alone, and the %d placed before them in the batch too",
                                len(batch),
                                len(group),
                                len(placed),
                                exc_info=True,
                            )
                            for call in group:
                                COUNTS.count_alone("error")
                                call.settle(_Alone("error"))
                            untried = [call for later in groups[k + 1 :] for call in later]
                            self.waiting.extendleft(reversed(untried))
                            raise _Abandoned from error
                        for call, outcome in zip(group, outcomes, strict=True):
                            if outcome is None:
                                COUNTS.count_alone("waits")
                                call.settle(_Alone("waits"))
                            else:
                                placed.append((call, outcome))
            announce(self.engine, recorded)
        except _Abandoned:
            # Nothing of this transaction was kept: what it placed is made again alone.
            for call, _ in placed:
                COUNTS.count_alone("abandoned")
                call.settle(_Alone("abandoned"))
            return
        except DeadlinePassed:
            # The earliest deadline of the batch passed before it could commit:
            # nothing was kept; each call alone, within its own deadline.
            for call in batch:
                if not call.answer.done():
                    COUNTS.count_alone("deadline")
                    call.settle(_Alone("deadline"))
            return
        except Exception:
            log.warning(
                "a batch of %d claims did not commit; each is retried alone",
                len(batch),
                exc_info=True,
            )
            for call in batch:
                if not call.answer.done():
                    COUNTS.count_alone("commit")
                    call.settle(_Alone("commit"))
            return
        except BaseException:
            # Cancelled (the process is stopping): the callers run alone, or are gone too.
            for call in batch:
                call.settle(_Alone("cancelled"))
            raise
        COUNTS.transactions += 1
        COUNTS.placed += sum(1 for _, outcome in placed if isinstance(outcome, Allocated))
        for call, outcome in placed:
            call.settle(outcome)


def _by_shape(batch: list[_Call]) -> list[list[_Call]]:
    """The batch's calls in groups placed together (same shape), each other call on its own."""
    groups: dict[PlaceRequest, list[_Call]] = {}
    alone: list[list[_Call]] = []
    for call in batch:
        shape = same_shape(call.request)
        if shape is None:
            alone.append([call])
        else:
            groups.setdefault(shape, []).append(call)
    return [*groups.values(), *alone]


async def _place_group(
    conn: connections.NativeConnection, group: list[_Call]
) -> list[Allocated | Rejection | None]:
    if len(group) == 1:
        return [await place_without_waiting(conn, group[0].request, group[0].actor)]
    answers, why = await place_several_without_waiting(conn, [(c.request, c.actor) for c in group])
    for reason in why:
        COUNTS.count_claim(reason)
    return answers


class _Abandoned(Exception):
    """A claim raised: the batch's transaction is rolled back whole."""


_queues: WeakKeyDictionary[AsyncEngine, PlaceQueue] = WeakKeyDictionary()


def queue_for(engine: AsyncEngine, size: int, transactions: int) -> PlaceQueue:
    """The engine's queue, made on first use with these limits."""
    queue = _queues.get(engine)
    if queue is None:
        queue = _queues[engine] = PlaceQueue(engine, size, transactions)
    return queue


async def place_batched(
    engine: AsyncEngine,
    request: PlaceRequest,
    actor: str | None,
    *,
    size: int,
    transactions: int,
) -> Outcome:
    """place(request), in a transaction shared with other calls of this process (see above)."""
    return await queue_for(engine, size, transactions).place(request, actor)
