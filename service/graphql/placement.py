"""explainPlacement: what place would answer, without holding anything."""

from __future__ import annotations

import strawberry

from service.database import connections
from service.scheduling import placement
from service.scheduling.rejections import Rejection

from .allocation_types import InvalidPlacement, PlaceInput, PlacementExplanation
from .context import Info


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
