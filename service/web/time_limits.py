"""Requests' time limits, kept by one watchdog instead of a timer per request.

`asyncio.timeout` arms a timer for every request (on uvloop, a libuv timer
started and stopped) for a limit that almost never fires. Every GraphQL request has the same limit
(INVENTORY_REQUEST_TIMEOUT), so the requests in flight reach their deadlines
in the order they began: one watchdog, armed while any request runs, fires
every `tick` (a tenth of the limit, at most a second) and cancels the
requests past their deadline. A request is stopped between
its limit and its limit plus one tick.

A Limit is used as `asyncio.timeout` is: `with limit:` around the work turns
the watchdog's cancellation into TimeoutError, and only that one (a request
also cancelled by someone else, a server's shutdown say, stays cancelled).
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Limit:
    """One request's deadline, from `TimeLimits.begin` until its answer starts or it ends."""

    __slots__ = ("_cancelling", "_limits", "deadline", "expired", "task")

    def __init__(self, limits: TimeLimits, deadline: float, task: asyncio.Task[object]) -> None:
        self._limits = limits
        self.deadline = deadline
        self.task = task
        self.expired = False
        self._cancelling = task.cancelling()

    def end(self) -> None:
        """No longer limited (its answer started, or it ended)."""
        self._limits.running.pop(self, None)

    def __enter__(self) -> Limit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.end()
        if not self.expired:
            return
        # As asyncio.timeout: this limit's cancellation is handled here.
        if self.task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()


class TimeLimits:
    """The time limits of one endpoint's requests, all `seconds` long."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.tick = min(seconds / 10, 1.0)
        # In the order they began, which is the order of their deadlines.
        self.running: dict[Limit, None] = {}
        # The watchdog: a timer, not a task (nothing left pending when a loop
        # closes), and of the loop it was armed on (tests run one loop each).
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def begin(self) -> Limit:
        """The current task's limit, from now."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a time limit needs a task to cancel")
        loop = task.get_loop()
        limit = Limit(self, loop.time() + self.seconds, task)
        self.running[limit] = None
        if self._watchdog is None or self._loop is not loop:
            self._loop = loop
            self._watchdog = loop.call_later(self.tick, self._watch)
        return limit

    def _watch(self) -> None:
        self._watchdog = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        while self.running:
            limit = next(iter(self.running))
            if limit.deadline > now:
                break
            del self.running[limit]
            if limit.task.get_loop() is loop:  # else: left behind by a closed loop
                limit.expire()
        if self.running:
            self._watchdog = loop.call_later(self.tick, self._watch)
