"""One GPU out of placement: an operator's cordon on a flaky GPU of an otherwise good node.

A node cordon takes away all of a node's GPUs; on a large fleet the unit of
failure is one GPU, and cordoning the node for it wastes seven good ones. A
GPU cordon is the operator's intent, kept apart from the report's health like
a node's admin_state is kept apart from its liveness: the agent's next report
does not touch it, so it survives re-registration. What already runs on the
GPU keeps running; its holder is told (gpu_failed_under_allocation).

That a cordoned GPU is never free is service/scheduling/availability.py's rule.
"""

from __future__ import annotations

from sqlalchemy import text

from service.database.connections import Connection
from service.fleet.gpu_changes import (
    after_change,
    check_reason,
    gpu_detail,
    gpu_of,
    lock_gpus,
    record_events,
)

_SET_CORDON = text(
    """
    UPDATE gpus SET cordon_reason = :reason, cordon_actor = :actor,
        cordon_since = CASE WHEN CAST(:reason AS text) IS NULL THEN NULL
                            ELSE coalesce(cordon_since, now()) END
    WHERE node_id = :node_id AND idx = :idx
    """
)


async def cordon_gpu(
    conn: Connection, node_id: str, index: int, reason: str, actor: str | None
) -> None:
    reason = check_reason(reason)
    gpus = await lock_gpus(conn, node_id)
    gpu = gpu_of(gpus, node_id, index)
    params = {"node_id": node_id, "idx": index, "reason": reason, "actor": actor}
    await conn.execute(_SET_CORDON, params)
    events: list[dict[str, object]] = [
        {"kind": "gpu_cordoned", "reason": reason, "detail": gpu_detail(gpu)}
    ]
    await after_change(conn, node_id, gpus, {index: f"cordoned: {reason}"}, events)
    await record_events(conn, node_id, actor, events)


async def uncordon_gpu(conn: Connection, node_id: str, index: int, actor: str | None) -> None:
    gpus = await lock_gpus(conn, node_id)
    gpu = gpu_of(gpus, node_id, index)
    params = {"node_id": node_id, "idx": index, "reason": None, "actor": None}
    await conn.execute(_SET_CORDON, params)
    events: list[dict[str, object]] = [{"kind": "gpu_uncordoned", "detail": gpu_detail(gpu)}]
    await after_change(conn, node_id, gpus, {}, events)
    await record_events(conn, node_id, actor, events)
