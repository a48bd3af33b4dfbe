"""The scheduler's mutations: allocate, place and release. One transaction each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Annotated

import strawberry

from service.database.connections import Connection
from service.metrics import count_rejection
from service.scheduling import allocations, placement
from service.scheduling.place_batches import Outcome, place_batched
from service.scheduling.place_request import PlaceRequest
from service.scheduling.rejections import Rejection
from service.scheduling.tenancy import victims

from ..allocation_types import (
    Allocated,
    AllocateInput,
    AllocateResult,
    AllocationRejected,
    PlaceInput,
    PlaceResult,
    Unplaceable,
)
from ..context import Context, Info
from .tenancy import bound_charge


async def place_outcome(context: Context, request: PlaceRequest) -> Outcome:
    """`place`'s domain call, in transactions shared with concurrent calls (place_batches.py).

    The request's charge is bound to the caller first (a bound token naming
    another tenant: TenantForbidden, nothing placed), on both routes.
    """
    request = replace(request, charge=bound_charge(context, "place", request.charge))
    settings = context.settings
    return await place_batched(
        context.engine,
        request,
        context.actor,
        size=settings.place_batch,
        transactions=settings.place_transactions,
    )


def place_answer(outcome: Outcome) -> Allocated | Unplaceable | AllocationRejected:
    """`place`'s answer from its outcome: the PlaceResult member, counted (count_place)."""
    count_place(outcome)
    return place_result(outcome)


def count_place(outcome: Outcome) -> None:
    """Count a placement that did not allocate with the rejections, once it is answered.

    One that preempted counts its victims, by their tenant and the class
    (inventory_tenant_replicas_preempted_total): it committed.
    """
    if isinstance(outcome, allocations.Allocated):
        count_preempted(outcome.preempted)
    if isinstance(outcome, Rejection):
        count_rejection(outcome.code.value)
    elif isinstance(outcome, placement.Unplaceable):
        # Counted with the rejections, under its own name: "no room" is
        # the signal that the cluster needs more of a class.
        count_rejection("UNPLACEABLE")


def count_preempted(preempted: Sequence[victims.Preemption]) -> None:
    """The replicas a committed place or placeGroup stopped, by their tenant and class (/metrics)."""
    for victim in preempted:
        victims.PREEMPTED.count(victim.tenant, victim.gpu_class)


def place_result(outcome: Outcome) -> Allocated | Unplaceable | AllocationRejected:
    """The PlaceResult member a placement's outcome is answered with."""
    if isinstance(outcome, Rejection):
        return AllocationRejected.of(outcome)
    if isinstance(outcome, placement.Unplaceable):
        return Unplaceable.of(outcome)
    return Allocated.of(outcome)


@strawberry.type
class AllocationMutations:
    @strawberry.mutation(
        description=(
            "Scheduler: record a replica's shards, all or none, in one transaction. Re-sending "
            "exactly the same shards answers what is stored, so a timed-out call can be retried."
        )
    )
    async def allocate(self, info: Info, input: AllocateInput) -> AllocateResult:
        request = input.to_request()
        request = replace(request, charge=bound_charge(info.context, "allocate", request.charge))

        async def work(conn: Connection) -> allocations.Allocated | Rejection:
            return await allocations.allocate(conn, request, info.context.actor)

        # Idempotent: the same shards again answer what is stored.
        outcome = await info.context.write(work, idempotent=True)
        if isinstance(outcome, Rejection):
            count_rejection(outcome.code.value)
            return AllocationRejected.of(outcome)
        return Allocated.of(outcome)

    @strawberry.mutation(
        description=(
            "Scheduler: let the service pick the GPUs and hold them in the same transaction. "
            "Unplaceable says why per node; AllocationRejected is bad input or a replica id "
            "already holding other shards. With the X-Client-Timeout header, never committed "
            "after the client stopped waiting (DEADLINE_EXCEEDED); a replica id released while it "
            "held nothing is refused, CONFLICT."
        )
    )
    async def place(self, info: Info, input: PlaceInput) -> PlaceResult:
        outcome = await place_outcome(info.context, input.to_request())
        return place_answer(outcome)

    @strawberry.mutation(
        description="Free one shard's GPUs; returns how many GPUs were freed (0 if none were held)."
    )
    async def release_shard(self, info: Info, shard_id: strawberry.ID) -> int:
        async def work(conn: Connection) -> int:
            return await allocations.release_shard(conn, str(shard_id), info.context.actor)

        # Not run again after a COMMIT cut off in flight (its answer counts what
        # it freed, which a second run cannot know): see release_replica.
        return await info.context.write(work)

    @strawberry.mutation(
        description=(
            "Free every shard of a replica: replicas fail whole. Returns GPUs freed. A replica "
            "that held nothing, released without a generation (a place its scheduler gave up "
            "on), is tombstoned for INVENTORY_RELEASE_TOMBSTONE seconds: a place or allocate of "
            "its id arriving late is refused, CONFLICT."
        )
    )
    async def release_replica(
        self,
        info: Info,
        replica_id: strawberry.ID,
        generation: Annotated[
            int | None,
            strawberry.argument(
                description=(
                    "Release only if this is the replica's current generation "
                    "(Allocation.generation); otherwise code CONFLICT with currentGeneration, "
                    "nothing freed. A replica that holds no shard frees 0 whatever is named."
                )
            ),
        ] = None,
    ) -> int:
        async def work(conn: Connection) -> int:
            return await allocations.release_replica(
                conn,
                str(replica_id),
                info.context.actor,
                generation=generation,
                # A release of nothing: a place of this id arriving late is refused.
                tombstone_for=info.context.settings.release_tombstone,
            )

        # Run again when it failed before COMMIT; not after a COMMIT cut off in
        # flight: a second run would find nothing and answer 0 for GPUs the
        # first one may have freed. The scheduler is told the outcome is
        # unknown (DATABASE_UNAVAILABLE) and retries; its retry is safe.
        return await info.context.write(work)
