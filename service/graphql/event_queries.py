"""The event log as a root query: what happened to a node or a replica, page by page."""

from __future__ import annotations

from datetime import datetime

import strawberry

from service import connections
from service.errors import InvalidInput
from service.events import EVENT_KINDS, EventFilter, list_events, unknown_kinds

from .context import Info
from .event_types import Event, event_id


def event_filter(
    node_id: strawberry.ID | None, replica_id: strawberry.ID | None, kinds: list[str] | None
) -> EventFilter:
    """The filter of `events` (query and subscription); an unknown kind is BAD_INPUT."""
    unknown = unknown_kinds(kinds or ())
    if unknown:
        raise InvalidInput(
            "kinds",
            unknown[0] if len(unknown) == 1 else unknown,
            f"not an event kind; the kinds are {', '.join(sorted(EVENT_KINDS))}",
        )
    return EventFilter(
        node_id=str(node_id) if node_id is not None else None,
        replica_id=str(replica_id) if replica_id is not None else None,
        kinds=tuple(kinds) if kinds is not None else None,
    )


@strawberry.type
class EventQueries:
    @strawberry.field(
        description=(
            "Events oldest first, kept for INVENTORY_EVENT_RETENTION. Pass the last id of a "
            "page as `after` for the next one."
        )
    )
    async def events(
        self,
        info: Info,
        node_id: strawberry.ID | None = None,
        replica_id: strawberry.ID | None = None,
        kinds: list[str] | None = None,
        since: datetime | None = None,
        first: int | None = None,
        after: strawberry.ID | None = None,
    ) -> list[Event]:
        page = info.context.page_size(first)
        async with connections.autocommit(info.context.engine) as conn:
            records = await list_events(
                conn,
                event_filter(node_id, replica_id, kinds),
                first=page,
                after=event_id(after),
                since=since,
                retention=info.context.settings.event_retention,
            )
        return [Event.of(r) for r in records]
