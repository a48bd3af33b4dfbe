"""Ends what a token opened once the token ends: revoked through any process, or expired.

A websocket is authenticated once, at connection_init, and its subscriptions
can stay open for days: without a second look, a revoked or expired token kept
streaming the cluster's events forever. So each process re-checks, every
RECHECK_INTERVAL, the tokens its open websockets were made with: one indexed
statement for all of them, and none at all while no such websocket is open.

The database decides (service/access_control/tokens.py STATUS: revoked_at, expires_at against
its clock), so a revocation made through any service process reaches every
process's sockets within RECHECK_INTERVAL plus one statement, and expiry needs
no event at all. LISTEN/NOTIFY would save the wait on a revocation but not on
an expiry, which nobody announces; one mechanism covers both.

While the database cannot be asked, nothing is ended (a token that cannot be
checked is not thereby revoked): the failure is logged once per outage and
counted (inventory_token_recheck_failures_total), and the next successful
round catches up.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Hashable

from sqlalchemy.ext.asyncio import AsyncEngine

from service import metrics
from service.access_control import tokens
from service.access_control.tokens import Status
from service.database import connections
from service.tasks import stop_task

log = logging.getLogger(__name__)

# A revoked token's subscriptions end within this plus one statement (the
# docs/security/roles.md promises 2 seconds).
RECHECK_INTERVAL = 1.0

OnEnd = Callable[[Status], None]


class TokenWatch:
    """One process's open connections by the token they were made with."""

    def __init__(
        self, engine: Callable[[], AsyncEngine], *, interval: float = RECHECK_INTERVAL
    ) -> None:
        self._engine = engine
        self._interval = interval
        self._holders: dict[Hashable, tuple[str, OnEnd]] = {}
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def watch(self, key: Hashable, token_id: str, on_end: OnEnd) -> None:
        """Call `on_end(status)` once, when `token_id` is no longer active; `key` is the holder."""
        self._holders[key] = (token_id, on_end)
        if self._task is None or self._task.done():
            # A context of its own: not the request id of whichever socket started it.
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="token-watch", context=contextvars.Context()
            )

    def forget(self, key: Hashable) -> None:
        """The holder closed: stop watching for it."""
        self._holders.pop(key, None)

    @property
    def watched(self) -> int:
        return len(self._holders)

    async def check(self) -> int:
        """One round: end the holders whose token ended; how many were ended."""
        if not self._holders:
            return 0
        token_ids = sorted({token_id for token_id, _ in self._holders.values()})
        async with connections.autocommit(self._engine()) as conn:
            ended = await tokens.ended_tokens(conn, token_ids)
        count = 0
        for key, (token_id, on_end) in list(self._holders.items()):
            status = ended.get(token_id)
            if status is None:
                continue
            del self._holders[key]
            log.info("closing what token %s opened: it was %s", token_id, status)
            metrics.COUNTERS.count_token_end(status)
            on_end(status)
            count += 1
        return count

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def _run(self) -> None:
        # Runs only while something is watched: an idle process asks nothing.
        while self._holders:
            await asyncio.sleep(self._interval)
            try:
                await self.check()
            except Exception as error:
                metrics.COUNTERS.count_token_check_failure()
                if not self._failing:
                    log.warning(
                        "cannot re-check the tokens of %d open websockets (they stay open "
                        "until a check succeeds): %s",
                        len(self._holders),
                        error,
                    )
                self._failing = True
            else:
                if self._failing:
                    log.info("token re-checks work again")
                self._failing = False
