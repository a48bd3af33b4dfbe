"""Releasing a shard or a whole replica: its GPUs go back to the pools, with events."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Row

from service.bounds import MAX_ID_LENGTH, MAX_SHARDS
from service.database.connections import Connection
from service.event_log.events import record_event
from service.scheduling.generations import GenerationConflict, bump_generations, current_generation
from service.scheduling.gpu_pools import refresh_pools

# The nodes holding the shards to release, found and locked in one statement.
_LOCK_SHARD_NODES = text(
    """
    SELECT id FROM nodes WHERE id IN (SELECT node_id FROM shards WHERE shard_id = :shard_id)
    ORDER BY id FOR NO KEY UPDATE
    """
)
_LOCK_REPLICA_NODES = text(
    """
    SELECT id FROM nodes WHERE id IN (SELECT node_id FROM shards WHERE replica_id = :replica_id)
    ORDER BY id FOR NO KEY UPDATE
    """
)
_RELEASE_SHARD = text(
    """
    DELETE FROM shards WHERE shard_id = :shard_id AND node_id = ANY(CAST(:nodes AS text[]))
    RETURNING shard_id, replica_id, node_id, gpu_indices, fence
    """
)
_RELEASE_REPLICA = text(
    """
    WITH forgotten AS (
        -- Its row in `replicas` (allocations/storing.py), and any tombstone: it freed something.
        DELETE FROM replicas WHERE replica_id = :replica_id
    )
    DELETE FROM shards WHERE replica_id = :replica_id AND node_id = ANY(CAST(:nodes AS text[]))
    RETURNING shard_id, replica_id, node_id, gpu_indices, fence
    """
)
# A release that freed nothing: the replica id's tombstone. The insert waits
# for a claim of the id that is committing now (its row), after which the
# release looks again and frees what that claim stored.
_TOMBSTONE = text(
    """
    INSERT INTO replicas AS r (replica_id, released_at, tombstone_until, released_by)
    VALUES (:replica_id, now(), now() + make_interval(secs => :seconds), :actor)
    ON CONFLICT (replica_id) DO UPDATE SET
        released_at = EXCLUDED.released_at,
        tombstone_until = EXCLUDED.tombstone_until,
        released_by = EXCLUDED.released_by
    """
)
# Tombstones past their time, a batch per liveness sweep (ix_replicas_tombstone_until).
_EXPIRED = text(
    """
    DELETE FROM replicas WHERE replica_id IN (
        SELECT replica_id FROM replicas WHERE tombstone_until <= now() LIMIT :batch
    )
    RETURNING replica_id
    """
)
EXPIRED_BATCH = 1000


async def _release(
    conn: Connection,
    lock_holders: Any,
    delete: Any,
    params: dict[str, Any],
    actor: str | None,
    reason: str | None,
    *,
    after_loss: bool = False,
    generation: tuple[str, int] | None = None,
    stopped_for: Mapping[str, Any] | None = None,
    locked: Sequence[str] | None = None,
) -> list[Row[Any]]:
    """The released shards' rows (shard_id, replica_id, node_id, gpu_indices, fence).

    `generation`: (replica id, generation) the caller named; checked under the
    nodes' locks, before anything is deleted (GenerationConflict otherwise).
    `after_loss`: the release is the consequence of a node lost (the liveness
    sweep, or a held shard freed): its events say so, and an engine that
    still runs the shard is told FREED_WHILE_LOST (service/fleet/fencing.py).
    `stopped_for`: what made the service release it, added to each event's
    detail: {"stopReason": a fencing.StopReason's value, ...}, which an engine
    that still runs the shard is told: a maintenance window's start; a
    preemption, whose detail also names the preemptor (preemptedBy); a
    reservation's start, to a replica placed `until` then, whose detail also
    names the reservation.
    `locked`: the nodes the shards are on, which the caller holds locked
    and read the shards under: one pass, without locking them again (no
    shard appears elsewhere meanwhile).
    """
    released_rows: list[Row[Any]] = []
    # Lock first, then delete only on the locked nodes: the recount in
    # refresh_pools is exact only while no one else writes to the node. A
    # shard that appeared on another node meanwhile is found by the next pass.
    for _ in range(MAX_SHARDS + 1):
        if locked is not None:
            node_ids = list(locked)
        else:
            node_ids = [r.id for r in await conn.execute(lock_holders, params)]
        if generation is not None:
            replica_id, named = generation
            current = await current_generation(conn, replica_id)
            if current is not None and current != named:
                raise GenerationConflict(replica_id, named, current)
            generation = None
        if not node_ids:
            break
        released = list(await conn.execute(delete, {**params, "nodes": sorted(node_ids)}))
        await refresh_pools(conn, node_ids)
        for r in released:
            detail: dict[str, Any] = {"gpuIndices": sorted(r.gpu_indices), "fence": r.fence}
            if after_loss:
                detail["afterLoss"] = True
            if stopped_for:
                detail.update(stopped_for)
            await record_event(
                conn,
                "released",
                node_id=r.node_id,
                replica_id=r.replica_id,
                shard_id=r.shard_id,
                actor=actor,
                reason=reason,
                detail=detail,
            )
        released_rows += released
        if locked is not None:
            break
    return released_rows


async def release_shard(
    conn: Connection, shard_id: str, actor: str | None = None, reason: str | None = None
) -> int:
    """Free one shard's GPUs; how many were freed (0 when it was not allocated: not an error).

    The replica's other shards stay, and its generation moves up.
    """
    released = await _release(
        conn, _LOCK_SHARD_NODES, _RELEASE_SHARD, {"shard_id": shard_id}, actor, reason
    )
    await bump_generations(conn, [r.replica_id for r in released])
    return sum(len(r.gpu_indices) for r in released)


async def release_replica(
    conn: Connection,
    replica_id: str,
    actor: str | None = None,
    reason: str | None = None,
    *,
    generation: int | None = None,
    after_loss: bool = False,
    tombstone_for: float | None = None,
    stopped_for: Mapping[str, Any] | None = None,
) -> int:
    """Free every shard of a replica: replicas fail whole, so they are freed whole.

    With `generation`, only when it is the replica's current one
    (GenerationConflict otherwise, nothing freed); a replica that holds no
    shard frees nothing whatever generation is named (a retried release).
    With `tombstone_for` (a scheduler's release: INVENTORY_RELEASE_TOMBSTONE),
    a replica that held nothing is tombstoned for that many seconds: a place
    or allocate of its id arriving meanwhile is refused (ReplicaReleased,
    allocations/storing.py), and one committing right now is waited for and
    its shards freed. Not when the release names a generation: its scheduler
    knew the placement (it read the generation), so finding nothing means
    the placement was released already (a retried release), not a place it
    gave up on; the id may be placed again at once.
    """
    params = {"replica_id": replica_id}
    released = await _release(
        conn,
        _LOCK_REPLICA_NODES,
        _RELEASE_REPLICA,
        params,
        actor,
        reason,
        after_loss=after_loss,
        generation=None if generation is None else (replica_id, generation),
        stopped_for=stopped_for,
    )
    gave_up = generation is None and 1 <= len(replica_id) <= MAX_ID_LENGTH
    if not released and tombstone_for is not None and gave_up:
        await conn.execute(_TOMBSTONE, {**params, "seconds": tombstone_for, "actor": actor})
        # What a claim that was committing meanwhile stored (freeing it also
        # takes the tombstone back: something was held after all).
        released = await _release(
            conn, _LOCK_REPLICA_NODES, _RELEASE_REPLICA, params, actor, reason
        )
    return sum(len(r.gpu_indices) for r in released)


async def preempt_replica(
    conn: Connection,
    replica_id: str,
    preempted_by: str,
    actor: str | None,
    reason: str,
    *,
    nodes: Sequence[str] | None = None,
) -> int:
    """Free every shard of a replica stopped to make room for `preempted_by`; GPUs freed.

    The release path every release takes (the pools recounted under the
    nodes' locks, an event per shard, the quota counters kept by their
    triggers), its events naming the preemptor. No tombstone: the victim's
    scheduler may place it again under the same id.

    `nodes`: every node the replica's shards are on, which the caller holds
    locked and read the shards under (placement/preemption.py): a claim
    that adds a shard to a replica locks every node the replica is on first
    (allocating.py's _LOCK_FOR_REPLICA; place refuses a replica id in use),
    so none is added before this transaction ends, and one pass over them
    frees every shard. None: the nodes are found and locked here.
    """
    released = await _release(
        conn,
        _LOCK_REPLICA_NODES,
        _RELEASE_REPLICA,
        {"replica_id": replica_id},
        actor,
        reason,
        stopped_for={"stopReason": "PREEMPTED", "preemptedBy": preempted_by},
        locked=None if nodes is None else sorted(nodes),
    )
    return sum(len(r.gpu_indices) for r in released)


async def forget_expired_tombstones(conn: Connection) -> int:
    """Tombstones past their time go (a batch at a time; the liveness sweep calls it)."""
    return len((await conn.execute(_EXPIRED, {"batch": EXPIRED_BATCH})).all())
