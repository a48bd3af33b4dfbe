"""The Event object type: one row of the event log as GraphQL shows it."""

from __future__ import annotations

from datetime import datetime

import strawberry
from strawberry.scalars import JSON

from service.errors import InvalidInput
from service.event_log.events import EventRecord


@strawberry.type(
    description=(
        "Something that happened: a state change (registered, report_changed, cordoned, "
        "drained, uncordoned, unreachable, lost, back, removed), an allocation or a release."
    )
)
class Event:
    id: strawberry.ID = strawberry.field(
        description="Orders events across service processes; pass as `after` to page or resume."
    )
    at: datetime = strawberry.field(description="When it was written, by the database's clock.")
    kind: str
    node_id: strawberry.ID | None
    replica_id: strawberry.ID | None
    shard_id: strawberry.ID | None
    actor: str | None = strawberry.field(
        description="Who did it: a token's name, or liveness-sweep for the service itself."
    )
    reason: str | None
    detail: JSON = strawberry.field(description="Kind-specific facts, e.g. a release's shards.")

    @classmethod
    def of(cls, event: EventRecord) -> Event:
        return cls(
            id=strawberry.ID(str(event.id)),
            at=event.at,
            kind=event.kind,
            node_id=strawberry.ID(event.node_id) if event.node_id is not None else None,
            replica_id=strawberry.ID(event.replica_id) if event.replica_id is not None else None,
            shard_id=strawberry.ID(event.shard_id) if event.shard_id is not None else None,
            actor=event.actor,
            reason=event.reason,
            detail=JSON(event.detail),
        )


def event_id(value: strawberry.ID | None, field: str = "after") -> int | None:
    if value is None:
        return None
    try:
        parsed = int(str(value))
    except ValueError:
        raise InvalidInput(field, str(value), "expected an event id from a previous page") from None
    if parsed < 0:
        raise InvalidInput(field, str(value), "expected an event id from a previous page")
    return parsed
