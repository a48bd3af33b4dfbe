"""A reservation as stored and read back (Reservation), and the reads of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Row

from service.database.connections import Connection
from service.scheduling.availability import gpu_held_by


@dataclass(frozen=True)
class ReservedGpus:
    node_id: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Reservation:
    id: str
    tenant: str
    gpu_class: str
    gpus_per_replica: int
    count: int
    start: datetime
    end: datetime | None
    state: str
    # The GPUs set aside now (gpus.reservation), by node.
    gpus: tuple[ReservedGpus, ...]
    # Replicas placed into it that still hold GPUs.
    used: int
    missing_gpus: int
    release_if_unused_after: int | None
    reason: str | None
    spec: dict[str, Any]


# A reservation's own columns, its GPUs by node and its replicas placed into it.
_COLUMNS = """
    r.id, r.tenant, r.gpu_class, r.gpus_per_replica, r.count, r.starts_at, r.ends_at, r.state,
    r.missing_gpus, r.release_if_unused_after, r.reason, r.spec,
    ARRAY(SELECT json_build_object('node', g.node_id,
                                   'indices', array_agg(g.idx ORDER BY g.idx))
          FROM gpus g WHERE g.reservation = r.id
          GROUP BY g.node_id ORDER BY g.node_id) AS gpus,
    (SELECT count(DISTINCT s.replica_id) FROM shards s WHERE s.reservation = r.id) AS used
"""
_ONE = text(f"SELECT {_COLUMNS} FROM reservations r WHERE r.id = :id")
# A page in id order (ix_reservations_tenant_id for a tenant; the primary key otherwise).
_PAGE = text(
    f"""
    SELECT {_COLUMNS} FROM reservations r
    WHERE (CAST(:tenant AS text) IS NULL OR r.tenant = :tenant)
      AND (CAST(:state AS text) IS NULL OR r.state = :state)
      AND r.id > :after
    ORDER BY r.id LIMIT :first
    """
)


def reservation_of(row: Row[Any]) -> Reservation:
    return Reservation(
        id=row.id,
        tenant=row.tenant,
        gpu_class=row.gpu_class,
        gpus_per_replica=row.gpus_per_replica,
        count=row._mapping["count"],
        start=row.starts_at,
        end=row.ends_at,
        state=row.state,
        gpus=tuple(ReservedGpus(g["node"], tuple(g["indices"])) for g in row.gpus),
        used=row.used,
        missing_gpus=row.missing_gpus,
        release_if_unused_after=row.release_if_unused_after,
        reason=row.reason,
        spec=row.spec,
    )


async def get_reservation(conn: Connection, reservation_id: str) -> Reservation | None:
    row = (await conn.execute(_ONE, {"id": reservation_id})).first()
    return None if row is None else reservation_of(row)


async def list_reservations(
    conn: Connection,
    *,
    tenant: str | None = None,
    state: str | None = None,
    first: int = 100,
    after: str | None = None,
) -> Sequence[Reservation]:
    rows = await conn.execute(
        _PAGE, {"tenant": tenant, "state": state, "first": first, "after": after or ""}
    )
    return [reservation_of(r) for r in rows]


@dataclass(frozen=True)
class ReservedUse:
    """What live reservations set aside of a class for a tenant, and how much of it is unused."""

    tenant: str
    gpu_class: str
    reserved: int
    unused: int


# Per tenant and class: the GPUs live reservations set aside, and of them
# those no replica placed into the reservation holds (ix_gpus_reservation).
_RESERVED_USE = text(
    f"""
    SELECT r.tenant, r.gpu_class, count(*) AS reserved,
           count(*) FILTER (WHERE NOT {gpu_held_by("g", "s.reservation = r.id")}) AS unused
    FROM reservations r JOIN gpus g ON g.reservation = r.id
    WHERE r.state <> 'ENDED'
    GROUP BY r.tenant, r.gpu_class ORDER BY 1, 2
    """
)
_BY_STATE = text("SELECT state, count(*) AS n FROM reservations GROUP BY state")


async def reserved_use(conn: Connection) -> list[ReservedUse]:
    return [
        ReservedUse(r.tenant, r.gpu_class, int(r.reserved), int(r.unused))
        for r in await conn.execute(_RESERVED_USE)
    ]


async def reservations_by_state(conn: Connection) -> dict[str, int]:
    return {r.state: int(r.n) for r in await conn.execute(_BY_STATE)}


Sample = tuple[tuple[tuple[str, str], ...], float]


async def families(conn: Connection) -> list[tuple[str, str, str, list[Sample]]]:
    """The Prometheus families of reservations (service/metrics.py writes them): name, kind, help, samples."""
    use = await reserved_use(conn)
    by_state = await reservations_by_state(conn)

    def per_class(value: str) -> list[Sample]:
        return [
            ((("tenant", u.tenant), ("gpu_class", u.gpu_class)), getattr(u, value)) for u in use
        ]

    return [
        ("inventory_reserved_gpus", "gauge",
         "GPUs live reservations set aside, by tenant and class (not free to other places).",
         per_class("reserved")),
        ("inventory_reserved_unused_gpus", "gauge",
         "Of the GPUs live reservations set aside, those no replica placed into them holds.",
         per_class("unused")),
        ("inventory_reservations", "gauge",
         "Reservations by state (DEGRADED: a reserved GPU failed and could not be replaced).",
         [((("state", s),), by_state.get(s, 0)) for s in ("SCHEDULED", "ACTIVE", "DEGRADED", "ENDED")]),
    ]  # fmt: skip
