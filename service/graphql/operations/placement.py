"""explainPlacement and fit: what place would answer, without holding anything."""

from __future__ import annotations

from typing import Annotated

import strawberry

from service.database import connections
from service.scheduling import placement
from service.scheduling.placement import fit as fits
from service.scheduling.rejections import Rejection

from ..allocation_types import Fit, InvalidPlacement, PlaceInput, PlacementExplanation
from ..context import Info


@strawberry.type
class PlacementQueries:
    @strawberry.field(
        description="Whether place would succeed now and, per node, the first check that fails."
    )
    async def explain_placement(self, info: Info, input: PlaceInput) -> PlacementExplanation:
        request = input.to_request()
        async with connections.autocommit(info.context.engine) as conn:
            outcome = await placement.explain(conn, request)
        if isinstance(outcome, Rejection):
            raise InvalidPlacement(outcome.message)
        return PlacementExplanation.of(outcome, request.gpus_per_shard)

    @strawberry.field(
        description=(
            "How many more replicas of this shape fit now: place's own planner on the nodes as "
            "they are, in a read-only transaction. replicaId names nothing here (any id place "
            "accepts). excludeNodes: counted as gone (after draining these). A shape place would "
            "refuse: BAD_INPUT with place's message."
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
    ) -> Fit:
        size = info.context.page_request(first).size
        request = shape.to_request()
        async with connections.read_only(info.context.engine) as conn:
            outcome = await fits.fit(
                conn, request, exclude=[str(n) for n in exclude_nodes or ()], first=size
            )
        if isinstance(outcome, Rejection):
            raise InvalidPlacement(outcome.message)
        return Fit.of(outcome, request.gpus_per_shard)
