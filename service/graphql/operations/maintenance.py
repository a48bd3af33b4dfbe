"""Maintenance windows' root fields: scheduleMaintenance, cancelMaintenance, maintenanceWindows, maintenanceWindow."""

from __future__ import annotations

import strawberry

from service import paging
from service.database.connections import Connection
from service.fleet import maintenance
from service.fleet.maintenance import WindowRecord
from service.scheduling.maintenance_rule import MaintenanceState

from ..context import Info
from ..maintenance_types import MaintenanceInput, MaintenanceWindow
from ..pages import answer, paged


@strawberry.type
class MaintenanceQueries:
    @strawberry.field(
        description=paged("Maintenance windows by id, optionally in one state.", cursor="window id")
    )
    async def maintenance_windows(
        self,
        info: Info,
        state: MaintenanceState | None = None,
        first: int | None = None,
        after: strawberry.ID | None = None,
    ) -> list[MaintenanceWindow]:
        request = info.context.page_request(first)
        found = await info.context.read(
            lambda conn: maintenance.list_windows(
                conn, state=state, first=request.limit, after=None if after is None else str(after)
            )
        )
        return answer(paging.cut(found, request, lambda w: w.id), MaintenanceWindow.of)

    @strawberry.field(description="One maintenance window; null when there is none of that id.")
    async def maintenance_window(self, info: Info, id: strawberry.ID) -> MaintenanceWindow | None:
        found = await info.context.read(lambda conn: maintenance.read_window(conn, str(id)))
        return None if found is None else MaintenanceWindow.of(found)


@strawberry.type
class MaintenanceMutations:
    @strawberry.mutation(
        description=(
            "Operator: book a maintenance window (docs/operations/maintenance.md). Re-sent with "
            "the same id and spec: the stored window; another spec, or an overlap with an open "
            "window on one of the nodes: CONFLICT."
        )
    )
    async def schedule_maintenance(self, info: Info, input: MaintenanceInput) -> MaintenanceWindow:
        spec = input.to_spec()

        async def work(conn: Connection) -> WindowRecord:
            return await maintenance.schedule(conn, spec, info.context.actor)

        return MaintenanceWindow.of(await info.context.write(work, idempotent=True))

    @strawberry.mutation(
        description=(
            "Operator: cancel a window: undoes what has not happened (its taints lifted, its asks "
            "to move forgotten); replicas already stopped stay released. A done or cancelled "
            "window is answered as it is."
        )
    )
    async def cancel_maintenance(self, info: Info, id: strawberry.ID) -> MaintenanceWindow:
        async def work(conn: Connection) -> WindowRecord:
            return await maintenance.cancel(conn, str(id), info.context.actor)

        return MaintenanceWindow.of(await info.context.write(work, idempotent=True))
