"""A reservation's changes on time (service/scheduling/timeline/): its start, its end, and idle ending.

- start: SCHEDULED (or DEGRADED) -> ACTIVE (DEGRADED while GPUs are
  missing) at starts_at; the replicas placed with `until` that still hold its
  GPUs are freed whole, their engines told RESERVATION (fencing.shardsToStop),
  in the same transaction; event reservation_active.
- end: -> ENDED at ends_at; its GPUs not placed into are free again; event
  reservation_ended.
- unused: -> ENDED releaseIfUnusedAfter seconds after the start when nothing
  was placed into it.
- replace: a failed reserved GPU's slot set aside again (replacing.py);
  DEGRADED while it cannot be.

Each takes the reservation's nodes first, then changes its row with a
conditional UPDATE (timeline's rule: made once, whichever process).
"""

from __future__ import annotations

from sqlalchemy import text

from service.database.connections import Connection
from service.event_log.events import record_event
from service.scheduling.allocations import release_replica
from service.scheduling.reservations.replacing import DUE as REPLACEMENTS_DUE
from service.scheduling.reservations.replacing import replace_failed
from service.scheduling.reservations.reserving import ACTOR, ENDS, LOCK_NODES, end_reservation
from service.scheduling.timeline import Transition

_START_DUE = (
    "r.state IN ('SCHEDULED', 'DEGRADED') AND r.started_at IS NULL AND r.starts_at <= now()"
)
_STARTS = text(
    f"SELECT r.id FROM reservations r WHERE r.state <> 'ENDED' AND {_START_DUE}"
    " ORDER BY r.starts_at, r.id LIMIT :limit"
)
_START = text(
    f"""
    UPDATE reservations r SET started_at = now(),
        state = CASE WHEN r.missing_gpus > 0 THEN 'DEGRADED' ELSE 'ACTIVE' END
    WHERE r.id = :id AND {_START_DUE}
    RETURNING r.state
    """
)
# The replicas on its GPUs that were not placed into it: placed with an
# `until` at or before its start (availability.gpu_admitted), due to go now.
_UNTIL_REPLICAS = text(
    """
    SELECT DISTINCT s.replica_id FROM gpus g
    JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx
    JOIN shards s ON s.shard_id = a.shard_id
    WHERE g.reservation = :id AND s.reservation IS DISTINCT FROM :id
    ORDER BY 1
    """
)


async def start(conn: Connection, reservation_id: str) -> bool:
    await conn.execute(LOCK_NODES, {"id": reservation_id})
    row = (await conn.execute(_START, {"id": reservation_id})).first()
    if row is None:
        return False
    stopped = [r.replica_id for r in await conn.execute(_UNTIL_REPLICAS, {"id": reservation_id})]
    for replica_id in stopped:
        await release_replica(
            conn,
            replica_id,
            ACTOR,
            f"reservation {reservation_id} starts: the replica was placed until then",
            stopped_for={"stopReason": "RESERVATION", "reservation": reservation_id},
        )
    await record_event(
        conn,
        "reservation_active",
        actor=ACTOR,
        detail={"reservation": reservation_id, "state": row.state, "stopped": stopped},
    )
    return True


def _due(why: str) -> str:
    return (
        f"SELECT r.id FROM reservations r WHERE r.state <> 'ENDED' AND {ENDS[why]}"
        " ORDER BY r.starts_at, r.id LIMIT :limit"
    )


async def _end(conn: Connection, reservation_id: str) -> bool:
    return await end_reservation(conn, reservation_id, ACTOR, "end")


async def _unused(conn: Connection, reservation_id: str) -> bool:
    return await end_reservation(conn, reservation_id, ACTOR, "unused")


# In this order each round: a reservation whose start and end both passed
# (the service was down) is started, then ended.
TRANSITIONS = (
    Transition("reservation_start", _STARTS, start),
    Transition("reservation_end", text(_due("end")), _end),
    Transition("reservation_unused", text(_due("unused")), _unused),
    # A failed reserved GPU replaced (replacing.py), DEGRADED when it cannot be.
    Transition("reservation_replace", REPLACEMENTS_DUE, replace_failed),
)
