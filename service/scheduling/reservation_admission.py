"""Whether a place may use GPUs set aside: placing into a reservation, or with `until`.

Checked by place() (placement/claims.py) before it looks for GPUs, on what is
committed: which GPUs the request may then use is availability.gpu_admitted's,
re-checked by the claim under the nodes' locks. Imports nothing of placement,
which imports it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import text

from service.database.connections import Connection
from service.errors import InventoryError, shown
from service.scheduling.place_request import PlaceRequest
from service.scheduling.rejections import Rejection, RejectionCode, invalid_field

# The states in which a reservation may be placed into (contract: ACTIVE or DEGRADED, after its start).
PLACEABLE = ("ACTIVE", "DEGRADED")

_RESERVATION = text(
    """
    SELECT r.id, r.tenant, r.gpu_class, r.state, r.starts_at
    FROM reservations r WHERE r.id = :id
    """
)
_NOW = text("SELECT now()")


class ReservationForbidden(InventoryError):
    """A place into a reservation of another tenant: nothing placed."""

    code = "FORBIDDEN"

    def __init__(self, reservation: str, owner: str, tenant: str) -> None:
        super().__init__(
            f"reservation={shown(reservation)!r}: it belongs to tenant {owner!r}; tenant "
            f"{tenant!r} cannot place into it"
        )
        self.reservation = reservation
        self.tenant = tenant

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "field": "reservation", "value": shown(self.reservation),
                "tenant": self.tenant}  # fmt: skip


def _time(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


async def admission(conn: Connection, request: PlaceRequest) -> Rejection | None:
    """Why the request may not be placed as asked (INVALID, CONFLICT), or None.

    Raises ReservationForbidden for a reservation of another tenant.
    """
    if request.reservation is not None:
        row = (await conn.execute(_RESERVATION, {"id": request.reservation})).first()
        if row is None:
            return invalid_field("reservation", request.reservation, "no such reservation")
        if row.tenant != request.charge.tenant_id:
            raise ReservationForbidden(request.reservation, row.tenant, request.charge.tenant_id)
        if row.gpu_class != request.gpu_class:
            return invalid_field(
                "reservation",
                request.reservation,
                f"it sets aside {row.gpu_class} GPUs, not {request.gpu_class}",
            )
        if row.state not in PLACEABLE:
            ended = row.state == "ENDED"
            why = "it has ended" if ended else f"it starts at {_time(row.starts_at)}"
            return Rejection(
                RejectionCode.CONFLICT, f"reservation={shown(request.reservation)!r}: {why}"
            )
    if request.until is not None:
        now = (await conn.execute(_NOW)).scalar_one()
        if request.until <= now:
            return invalid_field("until", _time(request.until), "is not in the future")
    return None


_PLACED_INTO = text(
    """
    UPDATE reservations SET placed_into_at = now()
    WHERE id = :id AND placed_into_at IS NULL
    """
)


async def placed_into(conn: Connection, reservation: str) -> None:
    """A replica was placed into the reservation: releaseIfUnusedAfter no longer ends it.

    After the claim, which holds the nodes' locks: the reservation's row is
    taken after its nodes, as every writer of both takes them.
    """
    await conn.execute(_PLACED_INTO, {"id": reservation})
