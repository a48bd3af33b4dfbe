"""Requests that arrive together are answered together: one open batch per process.

Agents send far more small requests than anything else (heartbeats, and the
token lookup of every request), and PostgreSQL answers a hundred of them in
one statement at about the cost of one. A Batches keeps one batch in flight:
a request that arrives while a batch is being answered waits for the next
one, and the next one leaves as soon as the previous one is answered. No
timer: an idle service answers a lone request at once, a busy one in batches.

A batch's statements start after every request it carries arrived, so each
request sees everything committed before it came in, as a statement of its
own would. A failed batch fails every request it carried, and the next batch
starts afresh.

One connection serves batches for as long as they keep coming: taking a
pooled connection and giving it back (asyncpg's pool runs each through a
task with a timeout and a shielded release) cost as much client CPU as the
heartbeat batch's statement itself, for every batch, while a busy process
sends one batch right after another. The connection goes back to the pool
as soon as no request is waiting, and after a batch that failed (it may be
the connection that failed: the next batch takes a fresh one).

A convoy is split in two. Clients in a closed loop (each sends its next
request once the last is answered: a fixed set of schedulers, a load
generator's connections) can all end up in one batch: the process then has
nothing to do while PostgreSQL writes it, answers everything at once, and
gets everything back at once, round after round, idle while it could work.
So a batch of at least SPLIT_AT during which no
request arrived, and which was not itself a split, is the sign (a lone
request answered hours ago is not): the next batch carries the
earlier half of what waits and the other half leaves as soon as it is
answered, while the first half's answers go out and their next requests
come in, so each batch is written while the process works on the other.
Where requests keep arriving while a batch is out (agents on timers), a
batch still takes everything that waits: the split costs PostgreSQL a
statement more, worth paying only for the idle time it removes. Where other
processes on the same cores would have used that idle time anyway (the
benchmark's two service processes beside PostgreSQL on two cores), the
statement is all that is left: a small cost there, accepted for the
deployment this is for, a process on cores of its own with PostgreSQL on
another machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Generic, TypeVar

C = TypeVar("C")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_Batch = dict[K, list[asyncio.Future[V]]]

# Fewer waiting than this are taken whole even in a convoy, and a quiet
# batch smaller than this is no convoy: two statements for a handful of
# requests cost more than the overlap they buy.
SPLIT_AT = 8


class Batches(Generic[C, K, V]):
    """Answers `ask(key)` through `answer(connection, keys)`, one batch of distinct keys at a time.

    `connect()` gives the connection the batches run on (held while batches
    keep coming). `answer` returns what it found by key; a key it leaves out
    gets `missing(key)`, which may be an exception to raise in that caller.
    """

    def __init__(
        self,
        connect: Callable[[], AbstractAsyncContextManager[C]],
        answer: Callable[[C, Sequence[K]], Awaitable[Mapping[K, V]]],
        missing: Callable[[K], V | BaseException],
        max_batch: int,
    ) -> None:
        self._connect = connect
        self._answer = answer
        self._missing = missing
        self._max_batch = max_batch
        self._waiting: _Batch[K, V] = {}
        self._worker: asyncio.Task[None] | None = None
        # Whether a batch is being answered, and whether a request arrived
        # meanwhile: a convoy (see the module's docstring) is a batch of at
        # least SPLIT_AT that saw none and was taken whole; the next batch
        # is then split.
        self._out = False
        self._arrived_while_out = False
        self._convoy = False

    def ask(self, key: K) -> asyncio.Future[V]:
        """The answer for `key`, once its batch is answered (await it).

        The future itself rather than a coroutine around it: each coroutine
        level between the request's task and this future is made, suspended
        and resumed once per request (the heartbeat's path had three here).
        """
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append(future)
        self._arrived_while_out = self._arrived_while_out or self._out
        if self._worker is None:
            # In no request's context: a batch carries many requests (their
            # deadlines and time limits are theirs, not the batch's).
            self._worker = asyncio.create_task(
                self._answer_batches(), context=contextvars.Context()
            )
        return future

    async def _answer_batches(self) -> None:
        try:
            while self._waiting:
                async with contextlib.AsyncExitStack() as held:
                    try:
                        connection = await held.enter_async_context(self._connect())
                    except Exception as error:
                        # No connection (the pool's timeout, the database
                        # down): the batch that would have used it fails.
                        _fail(self._take_batch(), error)
                        continue
                    await self._answer_while_waiting(connection)
        finally:
            self._worker = None

    async def _answer_while_waiting(self, connection: C) -> None:
        """Batches on one connection until none is waiting or one fails."""
        while self._waiting:
            split = self._convoy and len(self._waiting) >= SPLIT_AT
            batch = self._take_batch((len(self._waiting) + 1) // 2 if split else None)
            self._out, self._arrived_while_out = True, False
            try:
                found = await self._answer(connection, list(batch))
            except Exception as error:
                _fail(batch, error)
                return
            finally:
                self._out = False
            self._convoy = len(batch) >= SPLIT_AT and not (self._arrived_while_out or split)
            for key, futures in batch.items():
                for future in futures:
                    if future.done():  # its request was cancelled meanwhile
                        continue
                    # Made per caller: an exception raised in several tasks
                    # would share one traceback.
                    outcome = found[key] if key in found else self._missing(key)
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)

    def _take_batch(self, limit: int | None = None) -> _Batch[K, V]:
        """The earliest `limit` waiting keys (at most max_batch), in the order they arrived."""
        limit = self._max_batch if limit is None else min(limit, self._max_batch)
        if len(self._waiting) <= limit:
            batch, self._waiting = self._waiting, {}
            return batch
        keys = list(self._waiting)[:limit]
        return {key: self._waiting.pop(key) for key in keys}


def _fail(batch: _Batch[K, V], error: Exception) -> None:
    for futures in batch.values():
        for future in futures:
            if not future.done():
                future.set_exception(error)
