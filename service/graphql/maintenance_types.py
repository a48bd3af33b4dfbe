"""GraphQL types of maintenance windows (contract-time.graphql): MaintenanceWindow, MaintenanceInput."""

from __future__ import annotations

from datetime import datetime

import strawberry

from service.fleet.maintenance import MaintenanceSpec, WindowRecord
from service.scheduling.maintenance_rule import MaintenanceState

from .scalars import utc

strawberry.enum(
    MaintenanceState,
    name="MaintenanceState",
    description=(
        "SCHEDULED (booked), DRAINING (from start - drainLead: placement avoids the nodes, their "
        "replicas are asked to move in waves within their disruption budgets), IN_PROGRESS (from "
        "start: NO_SCHEDULE, replicas still there told to stop), DONE (from end: the taint "
        "lifted), CANCELLED."
    ),
)


@strawberry.type(description="A maintenance window on some nodes: [start, end), half-open.")
class MaintenanceWindow:
    id: strawberry.ID
    node_ids: list[strawberry.ID]
    start: datetime
    end: datetime
    reason: str
    state: MaintenanceState
    replicas_left: int = strawberry.field(description="Replicas on these nodes not yet moved.")

    @classmethod
    def of(cls, w: WindowRecord) -> MaintenanceWindow:
        return cls(
            id=strawberry.ID(w.id),
            node_ids=[strawberry.ID(n) for n in w.node_ids],
            start=w.start,
            end=w.end,
            reason=w.reason,
            state=w.state,
            replicas_left=w.replicas_left,
        )


@strawberry.input
class MaintenanceInput:
    id: strawberry.ID
    node_ids: list[strawberry.ID]
    start: datetime
    end: datetime
    reason: str
    drain_lead: int = strawberry.field(
        default=3600, description="How long before start replicas are asked to move (seconds)."
    )

    def to_spec(self) -> MaintenanceSpec:
        start, end = utc(self.start), utc(self.end)
        assert start is not None and end is not None
        return MaintenanceSpec(
            id=str(self.id),
            node_ids=tuple(str(n) for n in self.node_ids),
            start=start,
            end=end,
            reason=self.reason,
            drain_lead=self.drain_lead,
        )
