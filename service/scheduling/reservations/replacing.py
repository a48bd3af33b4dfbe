"""A reserved GPU that fails is replaced, by the shape's rules; DEGRADED when it cannot be (issue 47).

A reservation's GPUs are grouped in slots, one per replica it holds room
for (gpus.reservation_slot). A slot is broken when one of its GPUs, not held
by a replica placed into the reservation, is no longer usable or is
withheld by a taint (an XID, drift, an operator's: availability's rules), is
on a node that takes no placement (cordoned, drained, unreachable, lost),
or is gone from its node's report. Its GPUs are then let go whole and the slot
is set aside again as reserve() sets one aside (reserving.set_aside: place's
rules and ranking, among the GPUs free now). A slot that cannot be had stays
missing: the reservation is DEGRADED, `missingGpus` says how many, and the
event reservation_degraded is written once, when it becomes so. The
reservation is ACTIVE (or SCHEDULED, before its start) again once none is
missing.

Missing slots are tried again only when something could have changed, and
once whichever process looks: a try runs place's planner under the nodes'
locks, and every process's timeline looks every second. A try writes, in
its transaction, when the next is due (next_attempt_at: RETRY_AFTER_SECONDS
on) and how many free GPUs of the class were offered then (free_seen); the
reservation is due again at that time, or as soon as more free GPUs of its
class are offered (a replica released, a taint lifted, a node back). The
try claims the reservation's row first (FOR NO KEY UPDATE) and reads that
again under the lock, so a process that found it due at the same moment
waits, sees the other's try and skips it. Each retry is counted (RETRIES,
inventory_reservation_retries_total). A broken slot (a GPU failing now) is
never held back.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from sqlalchemy import text

from service.database.connections import Connection
from service.event_log.events import record_event
from service.scheduling.availability import (
    gpu_held_by,
    gpu_usable,
    gpu_withheld,
    node_schedulable,
    pool_offers,
)
from service.scheduling.gpu_pools import refresh_pools
from service.scheduling.place_request import PlaceRequest
from service.scheduling.reservations.reserving import ACTOR, LOCK_NODES, set_aside
from service.scheduling.taints import TaintEffect, Toleration, TolerationOperator
from service.scheduling.tenancy.charges import Charge, PreemptionPolicy

# A GPU of the reservation `r` that no longer gives room: unusable or
# withheld, and not held by a replica placed into it (that replica's
# failure is its scheduler's to handle, and the slot is in use).
_FAILED = f"""
    (NOT {gpu_usable("g")} OR {gpu_withheld("g")}
     OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = g.node_id AND {node_schedulable("n")}))
    AND NOT {gpu_held_by("g", "s.reservation = r.id")}
"""
# How long a reservation with missing slots waits for its next try when no
# more free GPUs of its class are offered meanwhile: a change the free count
# does not show (a fabric, a label) is found within that.
RETRY_AFTER_SECONDS = 30

# The free GPUs of the reservation `r`'s class offered now
# (availability.pool_offers: an index-only walk of ix_gpu_pools_free).
_FREE_OF_CLASS = (
    "(SELECT coalesce(sum(p.free), 0) FROM gpu_pools p"
    f" WHERE p.gpu_class = r.gpu_class AND {pool_offers('p')})"
)
# The reservation `r`'s missing slots may be tried again: never tried, its
# next try is due, or more free GPUs of its class are offered than at the last.
_RETRY_DUE = (
    "(r.next_attempt_at IS NULL OR r.next_attempt_at <= now()"
    f" OR {_FREE_OF_CLASS} > coalesce(r.free_seen, 0))"
)
# The reservations with a broken slot (a failed GPU, or fewer GPUs than a
# replica takes: one left its node's report) or with slots missing that may
# be tried again.
DUE = text(
    f"""
    SELECT r.id FROM reservations r
    WHERE r.state <> 'ENDED' AND (
        (r.missing_gpus > 0 AND {_RETRY_DUE})
        OR EXISTS (SELECT 1 FROM gpus g WHERE g.reservation = r.id AND {_FAILED})
        OR EXISTS (SELECT 1 FROM gpus g WHERE g.reservation = r.id
                   GROUP BY g.reservation_slot HAVING count(*) < r.gpus_per_replica))
    ORDER BY r.starts_at, r.id LIMIT :limit
    """
)
# Read under the row's lock: a try another process committed meanwhile is
# seen (retry_due false), so it is not made twice.
_ROW = text(
    f"""
    SELECT r.id, r.tenant, r.spec, r.count, r.gpus_per_replica, r.state, r.started_at,
           r.missing_gpus, {_RETRY_DUE} AS retry_due
    FROM reservations r WHERE r.id = :id AND r.state <> 'ENDED'
    FOR NO KEY UPDATE OF r
    """
)
_BROKEN = text(
    f"""
    SELECT DISTINCT g.reservation_slot AS slot FROM gpus g JOIN reservations r ON r.id = g.reservation
    WHERE r.id = :id AND {_FAILED}
    UNION
    SELECT g.reservation_slot FROM gpus g JOIN reservations r ON r.id = g.reservation
    WHERE r.id = :id GROUP BY g.reservation_slot, r.gpus_per_replica
    HAVING count(*) < r.gpus_per_replica
    """
)
# The broken slots' GPUs let go, but for any a replica placed into it holds.
_LET_GO = text(
    f"""
    UPDATE gpus g SET reservation = NULL, reservation_slot = NULL
    WHERE g.reservation = :id AND g.reservation_slot = ANY(CAST(:slots AS int[]))
      AND NOT {gpu_held_by("g", "s.reservation = CAST(:id AS text)")}
    RETURNING g.node_id
    """
)
_SLOTS = text("SELECT DISTINCT reservation_slot AS slot FROM gpus WHERE reservation = :id")
# The state after a try, and when the next is due while slots are missing.
_STATE = text(
    f"""
    UPDATE reservations r SET missing_gpus = :missing,
        state = CASE WHEN :missing > 0 THEN 'DEGRADED'
                     WHEN r.started_at IS NOT NULL THEN 'ACTIVE' ELSE 'SCHEDULED' END,
        next_attempt_at = CASE WHEN :missing > 0
                               THEN now() + make_interval(secs => :retry_after) END,
        free_seen = CASE WHEN :missing > 0 THEN {_FREE_OF_CLASS} END
    WHERE r.id = :id
    """
)


class _Retries:
    """Tries of missing slots by this process, by outcome (for /metrics).

    replaced: none missing after it; missing: some still are; skipped: found
    due, but another process's try was committed first.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {o: self.counts.get(o, 0) for o in ("replaced", "missing", "skipped")}


RETRIES = _Retries()


def shape_of(spec: dict[str, Any]) -> PlaceRequest:
    """The shape a reservation was made for, from its stored spec (ReservationSpec.stored)."""
    shape = dict(spec["shape"])
    tolerations = tuple(
        Toleration(
            key=t["key"],
            operator=TolerationOperator(t["operator"]),
            value=t["value"],
            effect=None if t["effect"] is None else TaintEffect(t["effect"]),
            toleration_seconds=t["toleration_seconds"],
        )
        for t in shape.pop("tolerations")
    )
    label = shape.pop("label")
    return PlaceRequest(
        **{
            **shape,
            "tolerations": tolerations,
            "label": None if label is None else tuple(label),
            "charge": Charge(**shape["charge"]),
            "preemption": PreemptionPolicy(shape["preemption"]),
        }
    )


async def replace_failed(conn: Connection, reservation_id: str) -> bool:
    """Replace the reservation's broken slots (and retry its missing ones); whether anything changed."""
    nodes = [r.id for r in await conn.execute(LOCK_NODES, {"id": reservation_id})]
    row = (await conn.execute(_ROW, {"id": reservation_id})).first()
    if row is None:
        return False
    broken = sorted(r.slot for r in await conn.execute(_BROKEN, {"id": reservation_id}))
    if not broken and row.missing_gpus == 0:
        return False
    if not broken and not row.retry_due:
        # Another process tried it since this one found it due.
        RETRIES.add("skipped")
        return False
    if broken:
        await conn.execute(_LET_GO, {"id": reservation_id, "slots": broken})
        await refresh_pools(conn, nodes)
    have = {r.slot for r in await conn.execute(_SLOTS, {"id": reservation_id})}
    shape = shape_of(row.spec)
    replaced = []
    for slot in sorted(set(range(row.count)) - have):
        savepoint = await conn.begin_nested()
        refused = await set_aside(conn, reservation_id, shape, row.tenant, slot, ACTOR)
        if refused is not None:
            await savepoint.rollback()
            break
        await savepoint.commit()
        replaced.append(slot)
    missing = (row.count - len(have) - len(replaced)) * row.gpus_per_replica
    await conn.execute(
        _STATE, {"id": reservation_id, "missing": missing, "retry_after": RETRY_AFTER_SECONDS}
    )
    if row.missing_gpus > 0:
        RETRIES.add("missing" if missing > 0 else "replaced")
    if missing > 0 and row.state != "DEGRADED":
        await record_event(
            conn,
            "reservation_degraded",
            actor=ACTOR,
            reason=f"{missing} GPUs could not be replaced",
            detail={"reservation": reservation_id, "missingGpus": missing, "broken": broken},
        )
    return bool(broken or replaced or missing != row.missing_gpus)
