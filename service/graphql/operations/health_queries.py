"""Read-only fields of fleet health: the shards NO_EXECUTE taints move."""

from __future__ import annotations

from datetime import datetime

import strawberry

from service import paging
from service.database import connections
from service.fleet.health import moves

from ..context import Info
from ..health_types import Taint
from ..pages import answer, paged
from ..types import Allocation


@strawberry.type(
    description=(
        "A shard a NO_EXECUTE taint moves: its engine is told to stop (shardsToStop, TAINTED) "
        "from stopBy on; the inventory keeps its GPUs until it is released."
    )
)
class ShardToMove:
    shard_id: strawberry.ID
    allocation: Allocation
    stop_by: datetime
    overdue: bool = strawberry.field(description="stopBy has passed.")
    taint: Taint = strawberry.field(
        description="The first NO_EXECUTE taint on it (the node's, then by GPU and key)."
    )

    @classmethod
    def of(cls, move: moves.ShardToMove) -> ShardToMove:
        # Taint and Allocation are served by the domain's records.
        return cls(
            shard_id=strawberry.ID(move.shard.shard_id),
            allocation=move.shard,  # type: ignore[arg-type]
            stop_by=move.stop_by,
            overdue=move.overdue,
            taint=move.taint,  # type: ignore[arg-type]
        )


@strawberry.type
class HealthQueries:
    @strawberry.field(
        description=paged(
            "Shards a NO_EXECUTE taint on their GPUs or node tells to stop (now, or once their "
            "toleration runs out), sorted by shard id. The inventory frees nothing itself: the "
            "scheduler replaces and releases them.",
            cursor="shard id",
        )
    )
    async def shards_to_move(
        self,
        info: Info,
        node_id: strawberry.ID | None = None,
        first: int | None = None,
        after: strawberry.ID | None = None,
    ) -> list[ShardToMove]:
        request = info.context.page_request(first)
        async with connections.autocommit(info.context.engine) as conn:
            found = await moves.shards_to_move(
                conn,
                node_id=None if node_id is None else str(node_id),
                first=request.limit,
                after=None if after is None else str(after),
            )
        return answer(paging.cut(found, request, lambda m: m.shard.shard_id), ShardToMove.of)
