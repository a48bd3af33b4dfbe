"""Reservations' root fields: reserve, releaseReservation, reservations, reservation (issue 47).

Only translation: the rules are service/scheduling/reservations/'s. A
scheduler token bound to a tenant reserves, releases and reads as that
tenant only (charges.bound_tenant).
"""

from __future__ import annotations

import strawberry

from service import paging
from service.database.connections import Connection
from service.scheduling import placement, reservations
from service.scheduling.rejections import Rejection
from service.scheduling.tenancy import charges

from ..allocation_types import AllocationRejected, Unplaceable
from ..context import Info
from ..pages import answer, paged
from ..reservation_types import Reservation, ReservationInput, ReservationState, ReserveResult
from .tenancy import bound_to


@strawberry.type
class ReservationQueries:
    @strawberry.field(
        description=paged(
            "Reservations sorted by id, of one tenant and in one state when named.", cursor="id"
        )
    )
    async def reservations(
        self,
        info: Info,
        tenant: strawberry.ID | None = None,
        state: ReservationState | None = None,
        first: int | None = None,
        after: strawberry.ID | None = None,
    ) -> list[Reservation]:
        request = info.context.page_request(first)
        named = None if tenant is None else str(tenant)
        bound = bound_to(info.context)
        if bound is not None:
            named = charges.bound_tenant("reservations", bound, named)
        start = None if after is None else str(after)

        async def work(conn: Connection) -> list[reservations.Reservation]:
            return list(
                await reservations.list_reservations(
                    conn,
                    tenant=named,
                    state=None if state is None else state.value,
                    first=request.limit,
                    after=start,
                )
            )

        found = await info.context.read(work)
        return answer(paging.cut(found, request, lambda r: r.id), Reservation.of)

    @strawberry.field(description="One reservation; null when there is none with this id.")
    async def reservation(self, info: Info, id: strawberry.ID) -> Reservation | None:
        found = await info.context.read(lambda conn: reservations.get_reservation(conn, str(id)))
        if found is None:
            return None
        bound = bound_to(info.context)
        if bound is not None and bound != found.tenant:
            return None
        return Reservation.of(found)


@strawberry.type
class ReservationMutations:
    @strawberry.mutation(
        description=(
            "Scheduler: set aside room for `count` replicas of `shape` for [start, end), for a "
            "tenant. The GPUs are chosen now, among GPUs free now, by place's rules and ranking, "
            "all or nothing (Unplaceable says why). Re-sent with the same id and spec, answers "
            "what is stored; the id with another spec is refused, CONFLICT."
        )
    )
    async def reserve(self, info: Info, input: ReservationInput) -> ReserveResult:
        named = None if input.tenant is None else str(input.tenant)
        tenant = charges.bound_tenant("reserve", bound_to(info.context), named)
        spec = input.to_spec(tenant)

        async def work(
            conn: Connection,
        ) -> reservations.Reservation | placement.Unplaceable | Rejection:
            return await reservations.reserve(conn, spec, info.context.actor)

        outcome = await info.context.write(work, idempotent=True)
        if isinstance(outcome, Rejection):
            return AllocationRejected.of(outcome)
        if isinstance(outcome, placement.Unplaceable):
            return Unplaceable.of(outcome)
        return Reservation.of(outcome)

    @strawberry.mutation(
        description=(
            "Scheduler: end a reservation now: its GPUs not placed into are free again, replicas "
            "placed into it stay as ordinary replicas. An ended one answers as it is."
        )
    )
    async def release_reservation(self, info: Info, id: strawberry.ID) -> Reservation:
        bound = bound_to(info.context)

        async def work(conn: Connection) -> reservations.Reservation:
            if bound is not None:
                found = await reservations.get_reservation(conn, str(id))
                if found is not None and found.tenant != bound:
                    raise charges.TenantForbidden("releaseReservation", bound, found.tenant)
            return await reservations.release_reservation(conn, str(id), info.context.actor)

        return Reservation.of(await info.context.write(work, idempotent=True))
