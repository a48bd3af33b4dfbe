"""Reservations' GraphQL types (contract-time.graphql): Reservation, ReservationInput, ReserveResult."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated

import strawberry

from service.scheduling import reservations
from service.scheduling.tenancy.charges import DEFAULT_TENANT

from .allocation_types import AllocationRejected, PlaceInput, Unplaceable

# The `at` argument of fit, fitGroup and freeGpus (contract-time.graphql).
AT = (
    "The answer for that instant: GPUs set aside by reservations in force then taken out, "
    "replicas with `until` at or before it counted gone, the nodes of maintenance windows in "
    "force then kept out, the tenant's limit then. Without `at`, now."
)


@strawberry.enum(name="ReservationState")
class ReservationState(enum.Enum):
    SCHEDULED = "SCHEDULED"
    ACTIVE = "ACTIVE"
    DEGRADED = "DEGRADED"
    ENDED = "ENDED"


@strawberry.type
class ReservedGpus:
    node_id: strawberry.ID
    gpu_indices: list[int]


@strawberry.type
class Reservation:
    id: strawberry.ID
    tenant: strawberry.ID
    count: int = strawberry.field(
        description="What it holds room for: `count` replicas of `shape` (PlaceInput as fit reads it)."
    )
    start: datetime
    end: datetime | None
    state: ReservationState
    gpus: list[ReservedGpus] = strawberry.field(
        description="The GPUs set aside now (chosen at creation, replaced when one fails)."
    )
    used: int = strawberry.field(description="Replicas placed into it so far.")
    missing_gpus: int = strawberry.field(
        description=(
            "GPUs it should hold but could not replace (DEGRADED when > 0, before or after the "
            "start)."
        )
    )
    release_if_unused_after: int | None = strawberry.field(
        description=(
            "Ends by itself when nothing was placed into it this many seconds after start "
            "(null: never)."
        )
    )
    reason: str | None

    @classmethod
    def of(cls, r: reservations.Reservation) -> Reservation:
        return cls(
            id=strawberry.ID(r.id),
            tenant=strawberry.ID(r.tenant),
            count=r.count,
            start=r.start,
            end=r.end,
            state=ReservationState(r.state),
            gpus=[
                ReservedGpus(node_id=strawberry.ID(g.node_id), gpu_indices=list(g.gpu_indices))
                for g in r.gpus
            ],
            used=r.used,
            missing_gpus=r.missing_gpus,
            release_if_unused_after=r.release_if_unused_after,
            reason=r.reason,
        )


@strawberry.input
class ReservationInput:
    id: strawberry.ID
    tenant: strawberry.ID | None = strawberry.field(
        default=None, description="Null: the token's tenant, else default."
    )
    shape: PlaceInput = strawberry.field(
        description="One replica as place reads it (its replicaId is not used)."
    )
    count: int
    start: datetime
    end: datetime | None = strawberry.field(default=None, description="Null: until released.")
    release_if_unused_after: int | None = None
    reason: str | None = None

    def to_spec(self, tenant: str | None) -> reservations.ReservationSpec:
        return reservations.ReservationSpec(
            id=str(self.id),
            tenant=tenant or DEFAULT_TENANT,
            shape=self.shape.to_request(),
            count=self.count,
            start=self.start,
            end=self.end,
            release_if_unused_after=self.release_if_unused_after,
            reason=self.reason,
        )


ReserveResult = Annotated[
    Reservation | Unplaceable | AllocationRejected, strawberry.union("ReserveResult")
]
