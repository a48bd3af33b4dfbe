"""Live events for subscribers, whichever service process wrote them.

Each process holds ONE dedicated asyncpg connection that LISTENs on the
events channel (committed event ids are announced in batches), reads the new rows
in one statement per burst, and hands them to every in-process subscriber.
One connection per process rather than per subscriber: a thousand dashboards
must not cost PostgreSQL a thousand connections.

If the connection drops (a PostgreSQL restart, a failover), it reconnects and
catches up by reading the events written since the last one it delivered, so
subscribers see a pause rather than a hole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections, database_url
from service.errors import InventoryError
from service.event_log.event_announcements import parse_payload
from service.event_log.events import (
    EVENTS_CHANNEL,
    EventFilter,
    EventRecord,
    events_by_id,
    list_events,
)
from service.tasks import stop_task

log = logging.getLogger(__name__)

# A subscriber that stops reading must not grow the process's memory without
# bound: past this many undelivered events it is cut off (and told why).
SUBSCRIBER_BACKLOG = 10_000
# Ids already delivered, remembered to drop duplicates that a reconnect's
# catch-up read and a late notification could both produce.
RECENT_IDS = 50_000
CATCH_UP_PAGE = 1_000
# Named, so an operator can find the process's listener in pg_stat_activity.
LISTENER_NAME = "llmgw-inventory-events"


class SubscriberTooSlow(InventoryError):
    """The subscriber fell SUBSCRIBER_BACKLOG events behind and was dropped."""

    code = "SUBSCRIBER_TOO_SLOW"


class Subscription:
    def __init__(self, stream: EventStream, event_filter: EventFilter) -> None:
        self._stream = stream
        self.filter = event_filter
        self.queue: asyncio.Queue[EventRecord | None] = asyncio.Queue()
        self.overflowed = False
        self.ended: BaseException | None = None

    def offer(self, event: EventRecord) -> None:
        if self.overflowed or not self.filter.matches(event):
            return
        if self.queue.qsize() >= SUBSCRIBER_BACKLOG:
            self.overflowed = True
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(event)

    def close(self) -> None:
        self._stream.unsubscribe(self)

    def end(self, error: BaseException) -> None:
        """Stop the subscriber with `error` (its token ended), ahead of any backlog."""
        self.ended = error
        self._stream.unsubscribe(self)
        self.queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[EventRecord]:
        try:
            while True:
                event = await self.queue.get()
                if self.ended is not None:
                    raise self.ended
                if event is None:
                    raise SubscriberTooSlow(
                        f"fell {SUBSCRIBER_BACKLOG} events behind; resubscribe with `after`"
                    )
                yield event
        finally:
            self._stream.unsubscribe(self)


class EventStream:
    """The process's LISTEN connection and its subscribers."""

    def __init__(
        self,
        dsn: str,
        engine: AsyncEngine,
        *,
        reconnect_delay: float = 1.0,
        connect_timeout: float = 60.0,
    ) -> None:
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self._engine = engine
        self._reconnect_delay = reconnect_delay
        self._subscribers: set[Subscription] = set()
        self._pending: list[int] = []
        self._wakeup = asyncio.Event()
        self._recent: deque[int] = deque(maxlen=RECENT_IDS)
        self._recent_set: set[int] = set()
        self._last_id: int | None = None
        self._listening = asyncio.Event()
        # Set at the first LISTEN and never cleared: from then on a reconnect
        # catches up from _last_id, so subscribers miss nothing.
        self._started = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-stream")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    async def wait_listening(self, within: float) -> bool:
        """Wait until the LISTEN connection is up (at startup), at most `within` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._listening.wait()
        return self.listening

    async def wait_started(self, within: float) -> bool:
        """Wait until the stream has listened once (it has a position), at most `within` seconds.

        Before that, an event committed between a subscriber's history read and
        the first LISTEN would be delivered by neither: subscribers wait for it.
        After it, a dropped connection is a pause that the catch-up read covers.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._started.wait()
        return self._started.is_set()

    # -- subscribers ----------------------------------------------------------

    def subscribe(self, event_filter: EventFilter) -> Subscription:
        subscription = Subscription(self, event_filter)
        self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscribers.discard(subscription)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    # -- the connection -------------------------------------------------------

    async def _run(self) -> None:
        while True:
            conn: Any = None
            dropped = asyncio.Event()
            try:
                # Each host of a multi-host URL in turn, as the pools connect.
                conn = await database_url.connect(
                    self._dsn,
                    timeout=self._connect_timeout,
                    server_settings={"application_name": LISTENER_NAME},
                )
                conn.add_termination_listener(lambda _c, d=dropped: d.set())
                await conn.add_listener(EVENTS_CHANNEL, self._on_notify)
                if self._last_id is None:
                    # Subscribers get what happens from now on; remember where
                    # "now" is, so a reconnect can catch up from here.
                    self._last_id = int(
                        await conn.fetchval("SELECT coalesce(max(id), 0) FROM events")
                    )
                self._listening.set()
                self._started.set()
                log.info("listening for events")
                # Anything committed while we were not listening.
                await self._catch_up()
                await self._deliver_until(dropped)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("event stream connection failed: %s", error)
            finally:
                self._listening.clear()
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await asyncio.shield(conn.close(timeout=1))
            await asyncio.sleep(self._reconnect_delay)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            self._pending.extend(parse_payload(payload))
        except ValueError:
            log.warning("ignored a malformed notification %r", payload)
            return
        self._wakeup.set()

    async def _deliver_until(self, dropped: asyncio.Event) -> None:
        dropped_wait = asyncio.create_task(dropped.wait())
        try:
            while not dropped.is_set():
                wakeup = asyncio.create_task(self._wakeup.wait())
                await asyncio.wait({wakeup, dropped_wait}, return_when=asyncio.FIRST_COMPLETED)
                wakeup.cancel()
                self._wakeup.clear()
                ids, self._pending = self._pending, []
                if ids and not self._subscribers:
                    # Nobody to hand them to: no read. Every process hears every
                    # process's events, and reading them for no one was a few
                    # percent of a registration's CPU here, PostgreSQL's too.
                    # A subscriber gets what happens from its subscription on,
                    # and a reconnect catches up from here.
                    self._last_id = max(self._last_id or 0, *ids)
                elif ids:
                    # One read per burst of notifications, shared by every subscriber.
                    async with connections.autocommit(self._engine) as conn:
                        self._publish(await events_by_id(conn, ids))
        finally:
            dropped_wait.cancel()

    async def _catch_up(self) -> None:
        async with connections.autocommit(self._engine) as conn:
            while True:
                page = await list_events(
                    conn, EventFilter(), first=CATCH_UP_PAGE, after=self._last_id
                )
                self._publish(page)
                if len(page) < CATCH_UP_PAGE:
                    return

    def _publish(self, events: list[EventRecord]) -> None:
        for event in events:
            if event.id in self._recent_set:
                continue
            if len(self._recent) == self._recent.maxlen:
                self._recent_set.discard(self._recent[0])
            self._recent.append(event.id)
            self._recent_set.add(event.id)
            self._last_id = max(self._last_id or 0, event.id)
            for subscription in list(self._subscribers):
                subscription.offer(event)
