"""The event log as a root query: what happened to a node or a replica, page by page."""

from __future__ import annotations

from datetime import datetime

import strawberry

from service import paging
from service.database import connections
from service.errors import InvalidInput
from service.event_log.events import EVENT_KINDS, EventFilter, list_events, unknown_kinds

from ..context import Info
from ..event_types import Event, event_id
from ..pages import answer, paged


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
        description=paged("Events oldest first (by id), kept for INVENTORY_EVENT_RETENTION.")
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
        request = info.context.page_request(first)
        async with connections.autocommit(info.context.engine) as conn:
            records = await list_events(
                conn,
                event_filter(node_id, replica_id, kinds),
                first=request.limit,
                after=event_id(after),
                since=since,
                retention=info.context.settings.event_retention,
            )
        return answer(paging.cut(records, request, lambda r: str(r.id)), Event.of)
