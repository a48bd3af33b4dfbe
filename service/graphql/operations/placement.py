"""explainPlacement and fit: what place would answer, without holding anything."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Annotated

import strawberry

from service.scheduling import placement
from service.scheduling.placement import fit as fits
from service.scheduling.rejections import Rejection
from service.scheduling.tenancy.charges import PreemptionPolicy

from ..allocation_types import Fit, InvalidPlacement, PlaceInput, PlacementExplanation
from ..context import Info
from ..reservation_types import AT
from .tenancy import bound_charge


@strawberry.type
class PlacementQueries:
    @strawberry.field(
        description="Whether place would succeed now and, per node, the first check that fails."
    )
    async def explain_placement(self, info: Info, input: PlaceInput) -> PlacementExplanation:
        request = input.to_request()
        charge = bound_charge(info.context, "explainPlacement", request.charge)
        request = replace(request, charge=charge)
        if request.preemption is PreemptionPolicy.LOWER_PRIORITY:
            # Its victim search tries sets in savepoints it rolls back, taking
            # none of the claim's locks (placement/preemption.py: trial): on
            # the primary, in a transaction of its own that is always rolled
            # back.
            outcome = await info.context.what_if(lambda conn: placement.explain(conn, request))
        else:
            outcome = await info.context.read(
                lambda conn: placement.explain(conn, request), max_age=request.max_age
            )
        if isinstance(outcome, Rejection):
            raise InvalidPlacement(outcome.message)
        return PlacementExplanation.of(outcome, request.gpus_per_shard)

    @strawberry.field(
        description=(
            "How many more replicas of this shape fit now: place's own planner on the nodes as "
            "they are, in a read-only transaction, within the tenant's limit (limitedBy "
            "QUOTA_EXCEEDED: nodes that would take one more but for it). replicaId names nothing "
            "here (any id place accepts). excludeNodes: counted as gone (after draining these). "
            "A shape place would refuse: BAD_INPUT with place's message."
        )
    )
    async def fit(
        self,
        info: Info,
        shape: PlaceInput,
        exclude_nodes: list[strawberry.ID] | None = None,
        first: Annotated[
            int | None,
            strawberry.argument(
                description="Most entries of nodes (default and limit: the page size)."
            ),
        ] = None,
        at: Annotated[datetime | None, strawberry.argument(description=AT)] = None,
    ) -> Fit:
        size = info.context.page_request(first).size
        request = replace(shape.to_request(), at=at)
        request = replace(request, charge=bound_charge(info.context, "fit", request.charge))
        exclude = [str(n) for n in exclude_nodes or ()]
        outcome = await info.context.read(
            lambda conn: fits.fit(conn, request, exclude=exclude, first=size),
            max_age=request.max_age,
            transaction=True,
        )
        if isinstance(outcome, Rejection):
            raise InvalidPlacement(outcome.message)
        return Fit.of(outcome, request.gpus_per_shard)
