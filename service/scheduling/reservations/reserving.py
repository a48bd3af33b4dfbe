"""reserve() and releaseReservation: GPUs set aside for a tenant's window, chosen as place chooses.

Choosing: `count` replicas of the shape are placed by place() itself
(placement/claims.py: its rules, ranking, quota and locks) under stand-in
replica ids, in a savepoint, then turned into a reservation in the same
transaction: the stand-ins' shards go (their GPUs freed, their events with
them), the GPUs are marked (gpus.reservation) and their pools recounted
(the reserved bucket: availability.pool_counts). All or nothing: the first
stand-in that does not fit rolls the savepoint back and its Unplaceable is
the answer. The nodes stay locked by the stand-ins' claims until commit, so
no claim can take a GPU between the stand-in's release and its mark, and a
claim that comes after sees the mark (availability.gpu_admitted, read by
every claim under the nodes' locks): the guarantee that no GPU is set aside
and held against its reservation (docs/scheduler/reservations.md).

The quota: the stand-ins' claims are charged to the tenant (the limit checked
under the quota's lock, as any claim); once marked, the GPUs count as used
through tenancy_reserved (migration 0024) instead of as held.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from sqlalchemy import text

from service.bounds import (
    MAX_RESERVATION_REPLICAS,
    MAX_RESERVATION_START_PAST,
    MAX_RESERVATION_WINDOW,
    MAX_TEXT_LENGTH,
)
from service.database.connections import Connection
from service.errors import InvalidInput, InventoryError, shown
from service.event_log.events import record_event
from service.scheduling.allocations import Allocated
from service.scheduling.gpu_pools import refresh_pools
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import Unplaceable, place, validate_place
from service.scheduling.rejections import Rejection
from service.scheduling.reservations.records import Reservation, get_reservation
from service.scheduling.tenancy.charges import Charge
from service.stored_text import text_problem

ACTOR = "reservations"
# What the stand-in replicas are named (never a scheduler's: a uuid each).
STAND_IN = "reservation-stand-in-"


@dataclass(frozen=True)
class ReservationSpec:
    """A reserve as asked. `shape`: the PlaceInput as fit reads it (its replica id unused)."""

    id: str
    tenant: str
    shape: PlaceRequest
    count: int
    start: datetime
    end: datetime | None = None
    release_if_unused_after: int | None = None
    reason: str | None = None

    def stored(self) -> dict[str, Any]:
        """The spec as reservations.spec keeps it (a re-sent reserve is compared with it)."""
        shape = asdict(replace(self.shape, replica_id="", charge=Charge(self.tenant)))
        stored: dict[str, Any] = json.loads(
            json.dumps(
                {
                    "shape": shape,
                    "count": self.count,
                    "start": _time(self.start),
                    "end": None if self.end is None else _time(self.end),
                    "releaseIfUnusedAfter": self.release_if_unused_after,
                    "reason": self.reason,
                },
                default=_plain,
                sort_keys=True,
            )
        )
        return stored


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return _time(value)
    raise TypeError(type(value).__name__)


def _time(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


class ReservationConflict(InventoryError):
    """A reservation id reused with another spec: nothing changed."""

    code = "CONFLICT"

    def __init__(self, reservation_id: str) -> None:
        super().__init__(
            f"id={shown(reservation_id)!r}: a reservation with this id exists with another spec; "
            "re-send exactly the same spec, or use a new id"
        )
        self.reservation_id = reservation_id

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "field": "id", "value": shown(self.reservation_id)}


class ReservationNotFound(InventoryError):
    code = "NOT_FOUND"

    def __init__(self, reservation_id: str) -> None:
        super().__init__(f"id={shown(reservation_id)!r}: no such reservation")

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "field": "id"}


def check_spec(spec: ReservationSpec, now: datetime) -> Rejection | None:
    """The checks of a reserve that need no stored row; raises InvalidInput naming the field."""
    if spec.count <= 0:
        raise InvalidInput("count", spec.count, "must be at least 1")
    if spec.count > MAX_RESERVATION_REPLICAS:
        raise InvalidInput("count", spec.count, f"at most {MAX_RESERVATION_REPLICAS}")
    if spec.start < now - timedelta(seconds=MAX_RESERVATION_START_PAST):
        raise InvalidInput(
            "start",
            _time(spec.start),
            f"more than {MAX_RESERVATION_START_PAST} seconds in the past",
        )
    if spec.end is not None:
        if spec.end <= spec.start:
            raise InvalidInput("end", _time(spec.end), f"must be after start ({_time(spec.start)})")
        if spec.end <= now:
            raise InvalidInput("end", _time(spec.end), "is in the past")
        if (spec.end - spec.start).total_seconds() > MAX_RESERVATION_WINDOW:
            raise InvalidInput(
                "end",
                _time(spec.end),
                f"the window is longer than {MAX_RESERVATION_WINDOW} seconds",
            )
    if spec.release_if_unused_after is not None and not (
        0 <= spec.release_if_unused_after <= MAX_RESERVATION_WINDOW
    ):
        raise InvalidInput(
            "releaseIfUnusedAfter",
            spec.release_if_unused_after,
            f"must be between 0 and {MAX_RESERVATION_WINDOW} seconds",
        )
    if spec.reason is not None:
        problem = text_problem(spec.reason)
        if problem is None and len(spec.reason) > MAX_TEXT_LENGTH:
            problem = f"longer than {MAX_TEXT_LENGTH} characters"
        if problem is not None:
            raise InvalidInput("reason", spec.reason, problem)
    if spec.shape.until is not None or spec.shape.reservation is not None:
        raise InvalidInput("shape", "until/reservation", "a reservation's shape cannot name either")
    return validate_place(replace(spec.shape, replica_id=f"{STAND_IN}0"))


_NOW = text("SELECT now()")
# Two reserves of one id serialize here (47: the issue), so the second sees the first's row.
_ID_LOCK = text("SELECT pg_advisory_xact_lock(47, hashtext(:id))")
_FORGET_STAND_IN = text(
    """
    WITH gone AS (
        DELETE FROM shards WHERE replica_id = :name
        RETURNING node_id, gpu_indices
    ), rows AS (
        DELETE FROM replicas WHERE replica_id = :name
    ), said AS (
        -- A stand-in was never a replica: its claim leaves no event.
        DELETE FROM events WHERE replica_id = :name
    )
    SELECT node_id, gpu_indices FROM gone
    """
)
_INSERT = text(
    """
    INSERT INTO reservations (id, tenant, spec, gpu_class, gpus_per_replica, count, starts_at,
                              ends_at, state, release_if_unused_after, reason, started_at)
    VALUES (:id, :tenant, CAST(:spec AS jsonb), :cls, :per_replica, :count, :start, :end,
            CASE WHEN CAST(:start AS timestamptz) <= now() THEN 'ACTIVE' ELSE 'SCHEDULED' END,
            :unused, :reason,
            CASE WHEN CAST(:start AS timestamptz) <= now() THEN now() END)
    RETURNING state
    """
)
_MARK = text(
    """
    UPDATE gpus g SET reservation = :id, reservation_slot = :slot
    FROM jsonb_to_recordset(CAST(:gpus AS jsonb)) AS m(node_id text, idx int)
    WHERE g.node_id = m.node_id AND g.idx = m.idx AND g.reservation IS NULL
    RETURNING g.node_id
    """
)


async def set_aside(
    conn: Connection,
    reservation_id: str,
    shape: PlaceRequest,
    tenant: str,
    slot: int,
    actor: str | None,
) -> Unplaceable | Rejection | None:
    """Room for one replica of the shape, chosen by place() and marked as the reservation's `slot`.

    A stand-in replica is placed (place's rules, ranking, quota and locks),
    then forgotten and its GPUs marked, in the caller's transaction; its
    nodes stay locked until commit. Answers why it could not be placed, or
    None; on an answer the caller rolls back what it started.
    """
    name = f"{STAND_IN}{uuid.uuid4().hex}"
    request = replace(shape, replica_id=name, charge=Charge(tenant))
    placed = await place(conn, request, actor)
    if not isinstance(placed, Allocated):
        return placed
    gpus = [
        {"node_id": r.node_id, "idx": i}
        for r in await conn.execute(_FORGET_STAND_IN, {"name": name})
        for i in r.gpu_indices
    ]
    params = {"id": reservation_id, "slot": slot, "gpus": json.dumps(gpus)}
    marked = list(await conn.execute(_MARK, params))
    # Under the nodes' locks the stand-in's claim took: nothing else can have
    # marked or held these GPUs since.
    assert len(marked) == len(gpus), (len(marked), len(gpus))
    await refresh_pools(conn, sorted({g["node_id"] for g in gpus}))
    return None


async def reserve(
    conn: Connection, spec: ReservationSpec, actor: str | None
) -> Reservation | Unplaceable | Rejection:
    """Set aside room for `count` replicas of the shape for the window, in the caller's transaction.

    Answers the Reservation (also for a reserve re-sent with the same id and
    spec), Unplaceable when the GPUs cannot be had (nothing set aside), or a
    Rejection for a shape place would refuse. Raises InvalidInput (BAD_INPUT)
    and ReservationConflict (the id with another spec).
    """
    now: datetime = (await conn.execute(_NOW)).scalar_one()
    problem = check_spec(spec, now)
    if problem is not None:
        return problem
    await conn.execute(_ID_LOCK, {"id": spec.id})
    stored = await get_reservation(conn, spec.id)
    if stored is not None:
        if stored.spec != spec.stored():
            raise ReservationConflict(spec.id)
        return stored
    savepoint = await conn.begin_nested()
    try:
        # The row first: the GPUs marked for it count toward the tenant's
        # limit (tenancy_reserved) as each next slot's claim is charged.
        state = (
            await conn.execute(
                _INSERT,
                {
                    "id": spec.id,
                    "tenant": spec.tenant,
                    "spec": json.dumps(spec.stored()),
                    "cls": spec.shape.gpu_class,
                    "per_replica": spec.shape.gpus,
                    "count": spec.count,
                    "start": spec.start,
                    "end": spec.end,
                    "unused": spec.release_if_unused_after,
                    "reason": spec.reason,
                },
            )
        ).scalar_one()
        for slot in range(spec.count):
            refused = await set_aside(conn, spec.id, spec.shape, spec.tenant, slot, actor)
            if refused is not None:
                await savepoint.rollback()
                return refused
        detail = {
            "reservation": spec.id,
            "tenant": spec.tenant,
            "gpus": spec.count * spec.shape.gpus,
            "start": _time(spec.start),
        }
        await record_event(
            conn, "reservation_created", actor=actor, reason=spec.reason, detail=detail
        )
        if state == "ACTIVE":
            await record_event(
                conn, "reservation_active", actor=ACTOR, detail={"reservation": spec.id}
            )
        await savepoint.commit()
    except BaseException:
        if savepoint.is_active:
            await savepoint.rollback()
        raise
    made = await get_reservation(conn, spec.id)
    assert made is not None
    return made


# The nodes holding a reservation's GPUs, locked in id order: every writer of
# a reservation's GPUs or row takes its nodes first, then the row.
LOCK_NODES = text(
    """
    SELECT id FROM nodes WHERE id IN (SELECT g.node_id FROM gpus g WHERE g.reservation = :id)
    ORDER BY id FOR NO KEY UPDATE
    """
)
# When a reservation ends, by what ends it (a condition on its row `r`,
# re-checked by the conditional UPDATE, so it ends once).
ENDS = {
    "released": "true",
    "end": "r.ends_at <= now()",
    "unused": (
        "r.state IN ('ACTIVE', 'DEGRADED') AND r.placed_into_at IS NULL"
        " AND r.release_if_unused_after IS NOT NULL"
        " AND r.starts_at + make_interval(secs => r.release_if_unused_after) <= now()"
    ),
}
_ENDING = {
    why: text(
        f"""
        UPDATE reservations r SET state = 'ENDED', ended_at = now()
        WHERE r.id = :id AND r.state <> 'ENDED' AND {due}
        RETURNING r.id
        """
    )
    for why, due in ENDS.items()
}
_UNMARK = text(
    "UPDATE gpus SET reservation = NULL, reservation_slot = NULL WHERE reservation = :id"
)


async def end_reservation(
    conn: Connection, reservation_id: str, actor: str | None, why: str
) -> bool:
    """End it now if `why` (a key of ENDS) still holds: its GPUs not placed into are free again.

    Replicas placed into it stay, as ordinary replicas. Answers whether it ended now.
    """
    nodes = [r.id for r in await conn.execute(LOCK_NODES, {"id": reservation_id})]
    if (await conn.execute(_ENDING[why], {"id": reservation_id})).first() is None:
        return False
    await conn.execute(_UNMARK, {"id": reservation_id})
    await refresh_pools(conn, nodes)
    await record_event(
        conn, "reservation_ended", actor=actor, reason=why, detail={"reservation": reservation_id}
    )
    return True


async def release_reservation(
    conn: Connection, reservation_id: str, actor: str | None
) -> Reservation:
    """releaseReservation: end it early (an ended one answers as it is). Raises ReservationNotFound."""
    if await get_reservation(conn, reservation_id) is None:
        raise ReservationNotFound(reservation_id)
    await end_reservation(conn, reservation_id, actor, "released")
    ended = await get_reservation(conn, reservation_id)
    assert ended is not None
    return ended
