"""Read-only fields of fleet health: remediations, the shards NO_EXECUTE taints move."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import strawberry

from service import paging
from service.database import connections
from service.fleet.health import drift, moves
from service.fleet.health import remediations as remediation_records
from service.fleet.health.remediations import RemediationState

from ..context import Info
from ..health_types import (
    Remediation,
    Taint,
    ValidationRequest,
    remediation_id,
    validations_to_run,
)
from ..pages import answer, paged
from ..profile_types import HardwareProfile
from ..types import Allocation


@strawberry.type(
    description=(
        "A shard a NO_EXECUTE taint moves: its engine is told to stop (shardsToStop, TAINTED) "
        "from stopBy on; the inventory keeps its GPUs until it is released. Or one a maintenance "
        "window asked to move (maintenanceWindow): released by the window's start if still placed."
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
    maintenance_window: strawberry.ID | None = strawberry.field(
        default=None,
        description=(
            "The maintenance window that asked it to move (its taint is `taint`, stopBy its "
            "start); null for a NO_EXECUTE taint's."
        ),
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
            maintenance_window=(
                None if move.maintenance_window is None else strawberry.ID(move.maintenance_window)
            ),
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

    @strawberry.field(
        description=paged(
            "Remediations, sorted by id (oldest first), optionally in one state or of one node.",
            cursor="remediation id",
        )
    )
    async def remediations(
        self,
        info: Info,
        state: RemediationState | None = None,
        node_id: strawberry.ID | None = None,
        first: int | None = None,
        after: strawberry.ID | None = None,
    ) -> list[Remediation]:
        request = info.context.page_request(first)
        start = None if after is None else remediation_id(after, "after")
        found = await info.context.read(
            lambda conn: remediation_records.list_remediations(
                conn,
                state=state,
                node_id=None if node_id is None else str(node_id),
                first=request.limit,
                after=start,
            )
        )
        return answer(paging.cut(found, request, lambda r: str(r.id)), Remediation.of)

    @strawberry.field(
        graphql_type=list[ValidationRequest],
        description=(
            "Agent: the validations its node should run now (Node.validationsToRun, for an agent "
            "token, which reads no nodes)."
        ),
    )
    def validations_to_run(self, info: Info, node_id: strawberry.ID) -> Any:
        return validations_to_run(str(node_id), info)

    @strawberry.field(description="The operators' hardware profiles, by name.")
    async def hardware_profiles(self, info: Info) -> list[HardwareProfile]:
        async with connections.autocommit(info.context.engine) as conn:
            found = await drift.profiles(conn)
        return [HardwareProfile.of(p) for p in found]
