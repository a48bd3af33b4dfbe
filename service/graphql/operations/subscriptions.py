"""The `events` subscription: changes as they happen, whichever service process made them.

Served over graphql-transport-ws on /graphql. The events reach this process
through its one LISTEN connection (service/event_log/event_stream.py); each subscriber
gets a filtered view of that stream.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import strawberry

from service.database import connections
from service.errors import InventoryError
from service.event_log.event_stream import EventStream
from service.event_log.events import EventFilter, list_events

from ..context import Info
from ..event_types import Event, event_id
from .event_queries import event_filter

REPLAY_PAGE = 500


class EventStreamUnavailable(InventoryError):
    code = "UNAVAILABLE"

    def __init__(self) -> None:
        super().__init__("this service process is not streaming events; try again shortly")


def _stream(info: Info) -> EventStream:
    connection = info.context.request
    app = getattr(connection, "app", None)
    stream = getattr(getattr(app, "state", None), "event_stream", None)
    if not isinstance(stream, EventStream):
        raise EventStreamUnavailable()
    return stream


@strawberry.type
class EventSubscriptions:
    @strawberry.subscription(
        description=(
            "Events as they are committed, from every service process. With `after`, the "
            "stored events after that id come first, then live ones, with none missed or "
            "repeated in between: a scheduler resumes from the last id it saw."
        )
    )
    async def events(
        self,
        info: Info,
        node_id: strawberry.ID | None = None,
        replica_id: strawberry.ID | None = None,
        kinds: list[str] | None = None,
        after: strawberry.ID | None = None,
    ) -> AsyncGenerator[Event, None]:
        # Checked before the stream starts (this is not itself a generator):
        # a bad filter is then the subscription's `error` message with its
        # code, where an error raised inside the stream ended it with a
        # traceback in the log.
        wanted = event_filter(node_id, replica_id, kinds)
        resume_from = event_id(after)
        stream = _stream(info)
        # A process serves before its LISTEN is first up when that takes longer
        # than db_timeout (a loaded machine, a slow database). A subscriber let
        # in then reads its history, and an event committed before the stream's
        # first connection is neither in that history nor delivered live (the
        # stream starts from the newest event it finds): a hole. Wait for the
        # stream; if it never started, refuse, and the client retries.
        if not await stream.wait_started(within=info.context.settings.db_timeout):
            raise EventStreamUnavailable()
        return _events(info, stream, wanted, resume_from)


async def _events(
    info: Info, stream: EventStream, wanted: EventFilter, resume_from: int | None
) -> AsyncGenerator[Event, None]:
    # Subscribe before reading the history, so nothing committed in
    # between is missed; what the history already gave is skipped below.
    subscription = stream.subscribe(wanted)
    # Ended with an error if the connection's token ends (service/access_control/token_watch.py).
    info.context.streams.add(subscription)
    replayed: set[int] = set()
    try:
        if resume_from is not None:
            cursor = resume_from
            while True:
                async with connections.autocommit(info.context.engine) as conn:
                    page = await list_events(
                        conn,
                        wanted,
                        first=REPLAY_PAGE,
                        after=cursor,
                        retention=info.context.settings.event_retention,
                    )
                for record in page:
                    if subscription.ended is not None:
                        raise subscription.ended
                    replayed.add(record.id)
                    yield Event.of(record)
                if len(page) < REPLAY_PAGE:
                    break
                cursor = page[-1].id
        async for record in subscription:
            if record.id in replayed or (resume_from is not None and record.id <= resume_from):
                continue
            yield Event.of(record)
    finally:
        info.context.streams.discard(subscription)
        subscription.close()
