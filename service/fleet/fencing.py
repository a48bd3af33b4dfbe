"""What a node that comes back must stop: incarnations, fences, held shards and their reconciliation.

A node partitioned past INVENTORY_LOST_AFTER keeps running its engines while
the inventory frees their GPUs (policy `free`) or holds them (policy
`hold`). When it comes back, the inventory and the node must agree again,
and the inventory's record wins:

- The agent sends the incarnation it last saw (nodes.incarnation: one more
  each time the node returns from LOST or reports a new boot id). One newer
  than the service's is a bug or an impostor: BAD_INPUT, an event
  `future_incarnation` (written on its own, since the request writes
  nothing else), and nothing else stored changes.
- The agent sends the shards its engines run, each with the fence the engine
  was started with. Every running shard that the inventory does not hold for
  that node with that fence is answered in shardsToStop, and so is one it
  holds whose NO_EXECUTE taint's time has come (TAINTED: not tolerated, or
  its tolerationSeconds ran out; the inventory frees nothing for it), with a
  reason:
  PREEMPTED (released to make room for another replica: preemptedBy
  names it), FREED_WHILE_LOST (released as the consequence of a node
  lost: the liveness sweep, or a held shard freed), FENCE_SUPERSEDED (the shard id is
  stored with another fence or on another node), RELEASED (anything else: a
  scheduler released it, or its record aged out of the event log).
- Under `hold`, the shards of a LOST node keep their GPUs (nothing is placed
  on them: their allocated_gpus rows stay) until the node returns and
  confirms them (reconcile: the replicas whose held shards on the node all
  run with the right fence are kept, the others freed whole) or an
  operator frees them (free_held).

A fence never issued (above the sequence's last value, or below 1) is
BAD_INPUT naming the field: no placement ever handed it to an engine.

The heartbeat or report that carries any of this is one transaction with its
checks, its reconciliation and its answer (contact_heartbeat,
contact_report), and does not take the batched or one-statement paths: those
write before anything could be checked.
"""

from __future__ import annotations

import enum
import json
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.bounds import MAX_ID_LENGTH, MAX_RUNNING_SHARDS
from service.database.connections import Connection
from service.database.transactions import in_transaction
from service.errors import InvalidInput, NodeNotFound
from service.event_log.events import record_event
from service.fleet import node_writes
from service.fleet.gpu_changes import check_reason
from service.fleet.node_reads import BeatRecord
from service.fleet.reports import NodeReport, validate_report
from service.scheduling.allocations import release_replica
from service.scheduling.taints import stop_by_sql
from service.stored_text import id_problem

log = logging.getLogger(__name__)

T = TypeVar("T")

ACTOR = "fencing"


class StopReason(enum.Enum):
    RELEASED = "RELEASED"
    FREED_WHILE_LOST = "FREED_WHILE_LOST"
    FENCE_SUPERSEDED = "FENCE_SUPERSEDED"
    # A NO_EXECUTE taint on its GPUs or node that it does not tolerate, or no
    # longer (its tolerationSeconds ran out): service/scheduling/taints.py.
    TAINTED = "TAINTED"
    # Stopped to make room for another replica (preemption, issue 46:
    # service/scheduling/tenancy/victims.py); ShardToStop.preempted_by names it.
    PREEMPTED = "PREEMPTED"
    # Still on a maintenance window's node at its start: released by the
    # window's start (service/fleet/maintenance/transitions.py).
    MAINTENANCE = "MAINTENANCE"
    # Its replica promised to be gone (PlaceInput.until) by the start of a
    # reservation whose GPUs it used, and was freed then
    # (service/scheduling/reservations/).
    RESERVATION = "RESERVATION"


@dataclass(frozen=True)
class RunningShard:
    shard_id: str
    fence: int


@dataclass(frozen=True)
class ShardToStop:
    shard_id: str
    fence: int
    reason: StopReason
    # PREEMPTED: the replica that took its GPUs.
    preempted_by: str | None = None


@dataclass(frozen=True)
class Contact:
    """What an agent says besides its report: the incarnation it last saw, what its engines run.

    None: the agent did not say (an older agent); an empty tuple of running
    shards says its engines run nothing.
    """

    incarnation: int | None = None
    running: tuple[RunningShard, ...] | None = None

    @property
    def says_anything(self) -> bool:
        return self.incarnation is not None or self.running is not None


class FutureIncarnation(InvalidInput):
    """An agent claims an incarnation its node has not reached: a bug or an impostor."""

    def __init__(self, node_id: str, claimed: int, current: int) -> None:
        super().__init__(
            "incarnation",
            claimed,
            f"node {node_id!r} is at incarnation {current}; an agent cannot have seen a later "
            "one (a bug, or another machine reporting under this node's id)",
        )
        self.node_id = node_id
        self.current = current


def validate_contact(contact: Contact) -> None:
    """What can be refused without reading the database."""
    if contact.incarnation is not None and contact.incarnation < 1:
        raise InvalidInput("incarnation", contact.incarnation, "incarnations start at 1")
    if contact.running is None:
        return
    if len(contact.running) > MAX_RUNNING_SHARDS:
        raise InvalidInput(
            "runningShards",
            f"{len(contact.running)} shards",
            f"at most {MAX_RUNNING_SHARDS} running shards per node",
        )
    seen: set[str] = set()
    for i, shard in enumerate(contact.running):
        where = f"runningShards[{i}]"
        if not shard.shard_id or id_problem(shard.shard_id) is not None:
            raise InvalidInput(
                f"{where}.shardId",
                shard.shard_id,
                f"a shard id is 1 to {MAX_ID_LENGTH} characters, without NUL",
            )
        if shard.shard_id in seen:
            raise InvalidInput(f"{where}.shardId", shard.shard_id, "listed twice")
        seen.add(shard.shard_id)
        if shard.fence < 0:
            raise InvalidInput(f"{where}.fence", shard.fence, "fences are never negative")
        if shard.fence == 0:
            raise InvalidInput(
                f"{where}.fence", shard.fence, "was never issued (fences start at 1)"
            )


# The largest fence issued so far (0 before the first): the sequence's last
# value, once it was called.
_LAST_FENCE = text(
    "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM shard_fence"
)
_LOCK_NODE = text("SELECT incarnation FROM nodes WHERE id = :id FOR NO KEY UPDATE")


async def check_contact(conn: Connection, node_id: str, contact: Contact) -> int | None:
    """Check the contact against what is stored, with the node's row locked; its incarnation.

    None when the node is not registered (a report creates it: there is no
    earlier life to compare with).
    """
    validate_contact(contact)
    if contact.running:
        issued = int((await conn.execute(_LAST_FENCE)).scalar_one())
        for i, shard in enumerate(contact.running):
            if shard.fence > issued:
                raise InvalidInput(
                    f"runningShards[{i}].fence",
                    shard.fence,
                    f"was never issued (the largest fence issued is {issued})",
                )
    current: int | None = (await conn.execute(_LOCK_NODE, {"id": node_id})).scalar()
    if current is not None and contact.incarnation is not None and contact.incarnation > current:
        raise FutureIncarnation(node_id, contact.incarnation, current)
    return current


async def record_future_incarnation(engine: AsyncEngine, error: FutureIncarnation) -> None:
    """The event for a refused future incarnation, in a transaction of its own (the request wrote nothing)."""
    log.warning(
        "node %s claims incarnation %s, the service has %s: refused",
        error.node_id,
        error.value,
        error.current,
    )

    async def work(conn: Connection) -> None:
        await record_event(
            conn,
            "future_incarnation",
            node_id=error.node_id,
            actor=ACTOR,
            reason=error.message,
            detail={"claimed": error.value, "current": error.current},
        )

    await in_transaction(engine, work)


_HOLD = text(
    """
    UPDATE shards SET held_since = now()
    WHERE node_id = ANY(CAST(:ids AS text[])) AND held_since IS NULL
    RETURNING shard_id, replica_id, node_id, fence
    """
)


async def hold_shards_on(conn: Connection, node_ids: Sequence[str], actor: str) -> list[str]:
    """Policy hold: the shards of these lost nodes keep their GPUs until confirmed or freed.

    Their allocated_gpus rows stay, so the GPUs are not free (availability
    counts them held) and nothing is placed on them. The caller holds the
    nodes' locks (the liveness sweep's). Returns the held shard ids.
    """
    rows = sorted(
        await conn.execute(_HOLD, {"ids": sorted(set(node_ids))}), key=lambda r: r.shard_id
    )
    for r in rows:
        await record_event(
            conn,
            "replica_held_while_lost",
            node_id=r.node_id,
            replica_id=r.replica_id,
            shard_id=r.shard_id,
            actor=actor,
            reason=f"node {r.node_id} lost; INVENTORY_LOST_POLICY=hold keeps its GPUs",
            detail={"fence": r.fence},
        )
    return [r.shard_id for r in rows]


_HELD_ON = text(
    """
    SELECT shard_id, replica_id, fence FROM shards
    WHERE node_id = :node_id AND held_since IS NOT NULL
    ORDER BY replica_id, shard_id
    """
)
_UNHOLD = text("UPDATE shards SET held_since = NULL WHERE shard_id = ANY(CAST(:ids AS text[]))")


@dataclass(frozen=True)
class Reconciled:
    kept: tuple[str, ...]
    freed_replicas: tuple[str, ...]


async def reconcile(conn: Connection, node_id: str, running: Sequence[RunningShard]) -> Reconciled:
    """The node confirms its held shards: the replicas it still runs whole are kept, the rest freed.

    A held replica is kept when each of its held shards on this node runs
    with its fence; otherwise it is freed whole (replicas fail whole), with
    an event replica_freed_after_loss, and its engine is told
    FREED_WHILE_LOST by shards_to_stop.
    """
    runs = {r.shard_id: r.fence for r in running}
    by_replica: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for r in await conn.execute(_HELD_ON, {"node_id": node_id}):
        by_replica[r.replica_id].append((r.shard_id, r.fence))
    kept: list[str] = []
    freed: list[str] = []
    for replica_id, held in sorted(by_replica.items()):
        missing = [(s, f) for s, f in held if runs.get(s) != f]
        if not missing:
            kept += [s for s, _ in held]
            continue
        shard_id, fence = missing[0]
        runs_fence = runs.get(shard_id)
        why = (
            f"its shard {shard_id} is not running"
            if runs_fence is None
            else f"its shard {shard_id} runs fence {runs_fence}, not {fence}"
        )
        reason = f"node {node_id} came back from LOST and {why}: replica {replica_id} freed whole"
        await record_event(
            conn,
            "replica_freed_after_loss",
            node_id=node_id,
            replica_id=replica_id,
            actor=ACTOR,
            reason=reason,
        )
        await release_replica(conn, replica_id, ACTOR, reason, after_loss=True)
        freed.append(replica_id)
    if kept:
        await conn.execute(_UNHOLD, {"ids": kept})
        for replica_id, held in sorted(by_replica.items()):
            for shard_id, fence in held:
                if shard_id in kept:
                    await record_event(
                        conn,
                        "replica_reconciled",
                        node_id=node_id,
                        replica_id=replica_id,
                        shard_id=shard_id,
                        actor=ACTOR,
                        reason=f"node {node_id} came back still running it with fence {fence}",
                        detail={"fence": fence},
                    )
    return Reconciled(tuple(kept), tuple(freed))


async def free_held(conn: Connection, node_id: str, actor: str | None, reason: str) -> int:
    """An operator frees the replicas held for this node, whole; GPUs freed."""
    reason = check_reason(reason)
    if (await conn.execute(_LOCK_NODE, {"id": node_id})).scalar() is None:
        raise NodeNotFound(node_id)
    freed = 0
    replicas = sorted({r.replica_id for r in await conn.execute(_HELD_ON, {"node_id": node_id})})
    for replica_id in replicas:
        await record_event(
            conn,
            "replica_freed_after_loss",
            node_id=node_id,
            replica_id=replica_id,
            actor=actor,
            reason=reason,
        )
        freed += await release_replica(conn, replica_id, actor, reason, after_loss=True)
    return freed


# For each running shard, what the inventory holds under its id, whether a
# NO_EXECUTE taint's time for it has come (taints.stop_by_sql), and whether
# a release of exactly that shard and fence on this node followed a loss
# (released events carry the fence, and afterLoss when a loss caused them;
# allocations._release), or for another reason the service released it for
# (stopReason: a maintenance window's start). The event lookup walks this node's events
# (ix_events_node_id), only for shards the inventory does not hold as run.
_RUNNING_VS_HELD = text(
    f"""
    SELECT r.shard_id, r.fence, s.node_id AS held_on, s.fence AS held_fence,
           CASE WHEN s.node_id = :node_id AND s.fence = r.fence THEN NULL ELSE EXISTS (
               SELECT 1 FROM events e
               WHERE e.node_id = :node_id AND e.kind = 'released' AND e.shard_id = r.shard_id
                 AND e.detail ->> 'fence' = CAST(r.fence AS text)
                 AND e.detail ? 'afterLoss'
           ) END AS freed_after_loss,
           CASE WHEN s.node_id = :node_id AND s.fence = r.fence THEN NULL ELSE (
               SELECT ARRAY[e.detail ->> 'stopReason', e.detail ->> 'preemptedBy'] FROM events e
               WHERE e.node_id = :node_id AND e.kind = 'released' AND e.shard_id = r.shard_id
                 AND e.detail ->> 'fence' = CAST(r.fence AS text)
                 AND e.detail ? 'stopReason'
               ORDER BY e.id DESC LIMIT 1
           ) END AS stopped_for,
           CASE WHEN s.node_id = :node_id AND s.fence = r.fence
                THEN coalesce({stop_by_sql("s")} <= now(), false) END AS tainted
    FROM jsonb_to_recordset(CAST(:running AS jsonb)) AS r(shard_id text, fence int)
    LEFT JOIN shards s ON s.shard_id = r.shard_id
    ORDER BY r.shard_id
    """
)


async def shards_to_stop(
    conn: Connection, node_id: str, running: Sequence[RunningShard]
) -> list[ShardToStop]:
    """Every running shard the inventory does not hold for this node with this fence, and why."""
    if not running:
        return []
    rows = await conn.execute(
        _RUNNING_VS_HELD,
        {
            "node_id": node_id,
            "running": json.dumps([{"shard_id": r.shard_id, "fence": r.fence} for r in running]),
        },
    )
    stops: list[ShardToStop] = []
    for r in rows:
        if r.held_on == node_id and r.held_fence == r.fence:
            if r.tainted:
                # Held, and told to stop: the inventory frees nothing itself
                # (the scheduler replaces and releases it).
                stops.append(ShardToStop(r.shard_id, r.fence, StopReason.TAINTED))
            continue
        preempted_by = None
        if r.freed_after_loss:
            reason = StopReason.FREED_WHILE_LOST
        elif r.stopped_for is not None:
            # Released by the service for a reason of its own (a maintenance
            # window's start, a preemption naming the preemptor:
            # placement/preemption.py): releases.py's stopped_for.
            reason = StopReason(r.stopped_for[0])
            preempted_by = r.stopped_for[1]
        elif r.held_on is not None:
            reason = StopReason.FENCE_SUPERSEDED
        else:
            reason = StopReason.RELEASED
        stops.append(ShardToStop(r.shard_id, r.fence, reason, preempted_by))
    return stops


@dataclass(frozen=True)
class Answer:
    """What a contact answers besides the node: the shards its engines must stop."""

    shards_to_stop: tuple[ShardToStop, ...]


async def _after_contact(conn: Connection, node_id: str, contact: Contact) -> Answer:
    if contact.running is None:
        return Answer(())
    await reconcile(conn, node_id, contact.running)
    return Answer(tuple(await shards_to_stop(conn, node_id, contact.running)))


async def _refusing_future(engine: AsyncEngine, work: Callable[[Connection], Awaitable[T]]) -> T:
    try:
        # Idempotent: a beat or a report with the shards a node runs says the
        # same the second time.
        return await in_transaction(engine, work, idempotent=True)
    except FutureIncarnation as error:
        await record_future_incarnation(engine, error)
        raise


async def contact_heartbeat(
    engine: AsyncEngine, node_id: str, contact: Contact
) -> tuple[BeatRecord, Answer]:
    """A heartbeat carrying a contact, in one transaction: checks, beat, reconcile, answer."""

    async def work(conn: Connection) -> tuple[BeatRecord, Answer]:
        if await check_contact(conn, node_id, contact) is None:
            raise NodeNotFound(node_id)
        beat = (await node_writes.heartbeat_many(conn, [node_id]))[node_id]
        return beat, await _after_contact(conn, node_id, contact)

    return await _refusing_future(engine, work)


async def contact_report(
    engine: AsyncEngine, report: NodeReport, contact: Contact, actor: str | None
) -> tuple[node_writes.Registration, Answer]:
    """A report carrying a contact, in one transaction: checks, report, reconcile, answer."""
    validate_report(report)

    async def work(conn: Connection) -> tuple[node_writes.Registration, Answer]:
        await check_contact(conn, report.id, contact)
        registration = await node_writes.register_node(conn, report, actor)
        return registration, await _after_contact(conn, report.id, contact)

    return await _refusing_future(engine, work)
