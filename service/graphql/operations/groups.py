"""Placement groups' root fields: placeGroup, scaleGroup, releaseGroup (one transaction each), fitGroup and group."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Annotated

import strawberry

from service import paging
from service.database.connections import Connection
from service.scheduling import groups
from service.scheduling.placement import Unplaceable as UnplaceableRecord
from service.scheduling.rejections import Rejection

from ..allocation_types import (
    Allocated,
    AllocationRejected,
    InvalidPlacement,
    PlaceInput,
    Unplaceable,
)
from ..context import Info
from ..group_types import (
    GroupFit,
    GroupPlaced,
    GroupPlacementExplanation,
    PlaceGroupInput,
    PlaceGroupResult,
)
from ..pages import answer, paged
from ..reservation_types import AT
from .allocation_mutations import count_place, count_preempted, place_result
from .tenancy import bound_charge, bound_to


def _bound(info: Info, operation: str, group: groups.GroupRequest) -> groups.GroupRequest:
    """The group charged as the caller may charge it (tenancy.bound_charge)."""
    return replace(group, charge=bound_charge(info.context, operation, group.charge))


def _result(
    outcome: groups.StoredGroup | UnplaceableRecord | Rejection,
) -> GroupPlaced | Unplaceable | AllocationRejected:
    """A group's outcome as PlaceGroupResult; a refusal or no room counted as place counts them."""
    if isinstance(outcome, groups.StoredGroup):
        count_preempted(outcome.preempted)
        return GroupPlaced.of(outcome)
    count_place(outcome)
    answered = place_result(outcome)
    assert not isinstance(answered, Allocated)
    return answered


@strawberry.type
class GroupQueries:
    @strawberry.field(
        description=(
            "How many more whole groups fit now, exact against placeGroup called one by one, "
            "and what limits the next (read-only; groupId names nothing here). A group "
            "placeGroup would refuse: BAD_INPUT with its message."
        )
    )
    async def fit_group(
        self,
        info: Info,
        group: PlaceGroupInput,
        at: Annotated[datetime | None, strawberry.argument(description=AT)] = None,
    ) -> GroupFit:
        request = _bound(info, "fitGroup", group.to_request())
        outcome = await info.context.read(
            lambda conn: groups.fit_group(conn, request, at=at),
            max_age=request.max_age,
            transaction=True,
        )
        if isinstance(outcome, Rejection):
            raise InvalidPlacement(outcome.message)
        return GroupFit.of(outcome)

    @strawberry.field(
        description=(
            "What placeGroup would do now: the plan and the locality level it reaches, or which "
            "role finds no room; per role, per node, the first check that fails."
        )
    )
    async def explain_group_placement(
        self, info: Info, input: PlaceGroupInput
    ) -> GroupPlacementExplanation:
        request = _bound(info, "explainGroupPlacement", input.to_request())
        outcome = await info.context.read(
            lambda conn: groups.explain_group(conn, request), max_age=request.max_age
        )
        if isinstance(outcome, Rejection):
            raise InvalidPlacement(outcome.message)
        return GroupPlacementExplanation.of(outcome)

    @strawberry.field(description=paged("Placed groups sorted by groupId.", cursor="groupId"))
    async def groups(
        self, info: Info, first: int | None = None, after: strawberry.ID | None = None
    ) -> list[GroupPlaced]:
        request = info.context.page_request(first)
        start = None if after is None else str(after)
        found = await info.context.read(lambda conn: groups.list_groups(conn, request.limit, start))
        return answer(paging.cut(found, request, lambda g: g.group_id), GroupPlaced.of)

    @strawberry.field(description="A placed group read back; null when no group has this id.")
    async def group(self, info: Info, group_id: strawberry.ID) -> GroupPlaced | None:
        stored = await info.context.read(lambda conn: groups.read_group(conn, str(group_id)))
        return None if stored is None else GroupPlaced.of(stored)


@strawberry.type
class GroupMutations:
    @strawberry.mutation(
        description=(
            "Scheduler: place every replica of every role, close on the KV-cache path, in one "
            "transaction, or none (Unplaceable says which role failed and why). Replica ids "
            "<groupId>-<role>-<n>; each is an ordinary replica. The same input again answers "
            "what is stored; another input under a placed groupId is CONFLICT."
        )
    )
    async def place_group(self, info: Info, input: PlaceGroupInput) -> PlaceGroupResult:
        request = _bound(info, "placeGroup", input.to_request())

        async def work(conn: Connection) -> groups.StoredGroup | UnplaceableRecord | Rejection:
            return await groups.place_group(conn, request, info.context.actor)

        return _result(await info.context.write(work))

    @strawberry.mutation(
        description=(
            "Adds (replicas > 0) or removes replicas of one role, close to the rest of the "
            "group; all or nothing."
        )
    )
    async def scale_group(
        self,
        info: Info,
        group_id: strawberry.ID,
        role: str,
        replicas: int,
        shape: Annotated[
            PlaceInput | None,
            strawberry.argument(
                description="Required for a role new to the group; else its shape."
            ),
        ] = None,
        generation: Annotated[
            int | None,
            strawberry.argument(
                description="The group's generation as last read; another one: CONFLICT."
            ),
        ] = None,
    ) -> PlaceGroupResult:
        request = shape.to_request() if shape is not None else None

        bound = bound_to(info.context)

        async def work(conn: Connection) -> groups.StoredGroup | UnplaceableRecord | Rejection:
            return await groups.scale_group(
                conn,
                str(group_id),
                role,
                replicas,
                request,
                generation,
                info.context.actor,
                bound=bound,
            )

        return _result(await info.context.write(work))

    @strawberry.mutation(
        description=(
            "Frees every replica of the group; the GPUs freed. A generation that is not the "
            "group's current one: CONFLICT."
        )
    )
    async def release_group(
        self, info: Info, group_id: strawberry.ID, generation: int | None = None
    ) -> int:
        async def work(conn: Connection) -> int:
            return await groups.release_group(conn, str(group_id), generation, info.context.actor)

        return await info.context.write(work)
