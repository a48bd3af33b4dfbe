"""place() and its transactions: lock the best free node (or a plan's nodes) and hold its GPUs.

Why it is correct under concurrency is told in the package's docstring
(service/scheduling/placement/__init__.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from service.database.connections import Connection, cached_text
from service.database.transactions import MAX_ATTEMPTS, TransactionConflict
from service.scheduling.allocations import (
    Allocated,
    AllocationRequest,
    NotStored,
    Refused,
    ReplicaReleased,
    ShardRecord,
    ShardRequest,
    Stored,
    Tombstoned,
    allocate_or_refuse,
    lock_nodes,
    shard_from_row,
    store_calls,
)
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import preemption
from service.scheduling.placement.explanation import (
    Unplaceable,
    refused_placement,
    unplaceable,
)
from service.scheduling.placement.plan import (
    Plan,
    shard_ids,
    validate_place,
    without_topology,
)
from service.scheduling.placement.statements import (
    LOCK_OR_SKIP,
    REPLICA,
    WINDOW,
    candidates,
    claim_statement,
    facts_of,
    free_indices,
    pick_sql,
    request_params,
    scan_size,
    spread_plan,
)
from service.scheduling.rejections import Rejection, RejectionCode, shown
from service.scheduling.reservation_admission import admission, placed_into
from service.scheduling.taints import tolerations_json
from service.scheduling.tenancy.charges import ChargeRefused, PreemptionPolicy
from service.scheduling.tenancy.headroom import headroom
from service.scheduling.topology_fit import fit_order
from service.scheduling.verdicts import judge

# Each round either places, finds no room on committed data, or waited for
# another transaction to finish with a busy node; this bounds a pathological run.
MAX_ROUNDS = 64


async def _same_replica(conn: Connection, request: PlaceRequest) -> Allocated | Rejection | None:
    stored = [
        shard_from_row(r) for r in await conn.execute(REPLICA, {"replica_id": request.replica_id})
    ]
    return _answer_stored(request, stored)


def _answer_stored(
    request: PlaceRequest, stored: Sequence[ShardRecord]
) -> Allocated | Rejection | None:
    """A retried place answers what is stored; a different replica under that id is refused."""
    if not stored:
        return None
    if [s.shard_id for s in stored] == sorted(shard_ids(request)) and all(
        len(s.gpu_indices) == request.gpus_per_shard for s in stored
    ):
        return Allocated(tuple(stored))
    return Rejection(
        RejectionCode.DUPLICATE_SHARD,
        f"replica {shown(request.replica_id)} already holds {len(stored)} shard(s) of another "
        "shape; release it first or use a new replica id",
        node_id=stored[0].node_id,
        held_by=stored[0].shard_id,
    )


class Busy:
    """A claim that found some of its nodes locked by another transaction: which ones.

    Nothing of the claim is held (its savepoint was rolled back): the caller
    waits for them with nothing held (wait_for_nodes) and plans again. Also
    what placement groups' claims answer (service/scheduling/groups/claiming.py).
    """

    def __init__(self, node_ids: set[str]) -> None:
        self.node_ids = node_ids


async def claim_plan(
    conn: Connection,
    request: PlaceRequest,
    plan: Plan,
    actor: str | None,
) -> Allocated | Busy | None:
    """Lock the plan's nodes without waiting and allocate on them; None when the plan went stale."""
    node_ids = sorted({node_id for node_id, _ in plan.nodes})
    savepoint = await conn.begin_nested()
    try:
        got = {r.id for r in await conn.execute(LOCK_OR_SKIP, {"ids": node_ids})}
        if len(got) < len(node_ids):
            # Rolling back the savepoint lets go of the nodes we did get.
            await savepoint.rollback()
            return Busy(set(node_ids) - got)
        free, near = await _usable_gpus(conn, request, plan, node_ids)
        names = iter(shard_ids(request))
        shards: list[ShardRequest] = []
        per = request.gpus_per_shard
        for node_id, count in plan.nodes:
            indices = free.get(node_id, [])
            if len(indices) < count * per:
                await savepoint.rollback()
                return None
            for k in range(count):
                chosen = tuple(indices[k * per : (k + 1) * per])
                # railAligned: the shard is handed exactly its GPUs' near HCAs.
                hcas = (
                    tuple(sorted({h for i in chosen for h in near[(node_id, i)]}))
                    if request.rail_aligned
                    else None
                )
                shards.append(ShardRequest(next(names), node_id, chosen, hcas))
        # ChargeRefused (the tenant's limit) goes up to place(), which answers
        # it: no other plan would be charged differently.
        result = await allocate_or_refuse(
            conn,
            AllocationRequest(
                request.replica_id,
                tuple(shards),
                weights=request.weights,
                tolerations=request.tolerations,
                charge=request.charge,
                until=request.until,
                reservation=request.reservation,
            ),
            actor,
            fabric=plan.fabric,
        )
        if isinstance(result, Rejection):
            await savepoint.rollback()
            return None
        await savepoint.commit()
        return result
    except BaseException:
        if savepoint.is_active:
            await savepoint.rollback()
        raise


async def _usable_gpus(
    conn: Connection, request: PlaceRequest, plan: Plan, node_ids: list[str]
) -> tuple[dict[str, list[int]], dict[tuple[str, int], list[str]]]:
    """Per locked node, the GPUs the plan may take, in the order shards take them.

    Without topology, the free GPUs by index. With it, the fit order of
    service.scheduling.topology_fit (whole groups, best fit first), and each GPU's near
    HCAs on the fabric.
    """
    tolerations = tolerations_json(request.tolerations)
    if not request.needs_topology:
        rows = await conn.execute(
            free_indices(request.tolerating, request.admitting),
            {
                "ids": node_ids,
                "cls": request.gpu_class,
                "tolerations": tolerations,
                "until": request.until,
                "reservation": request.reservation,
            },
        )
        return {r.node_id: list(r.indices) for r in rows}, {}
    params = {
        "ids": node_ids,
        "cls": request.gpu_class,
        "per": request.gpus_per_shard,
        "fabric": plan.fabric,
        "domain": plan.domain,
        "tolerations": tolerations,
        "until": request.until,
        "reservation": request.reservation,
    }
    free: dict[str, list[int]] = {}
    near: dict[tuple[str, int], list[str]] = {}
    statement = cached_text(usable_gpus_sql(request, plan.domain is not None))
    for r in await conn.execute(statement, params):
        free.setdefault(r.node_id, []).append(r.idx)
        near[(r.node_id, r.idx)] = list(r.hcas)
    return free, near


def usable_gpus_sql(request: PlaceRequest, domain: bool) -> str:
    """_usable_gpus' statement with topology: the fit order of the nodes :ids, node by node.

    `domain`: only the GPUs of the plan's NVLink domain (:domain).

    The SQL generated below looks like this: docs/internals/sql/scheduling.placement.claims/usable_gpus_sql.nvlink.sql
    (every shape beside it).
    """
    order = fit_order(request, "g.node_id = ANY(CAST(:ids AS text[]))", domain=domain)
    return f"{order} ORDER BY 1, 4"


async def wait_for_nodes(conn: Connection, node_ids: set[str]) -> None:
    """Wait until whoever holds these nodes has committed or rolled back, then let go of them.

    Nothing else is held at this point (every attempt's savepoint was rolled
    back), so waiting cannot deadlock.
    """
    savepoint = await conn.begin_nested()
    try:
        await lock_nodes(conn, sorted(node_ids))
    finally:
        await savepoint.rollback()


async def place(
    conn: Connection,
    request: PlaceRequest,
    actor: str | None = None,
) -> Allocated | Unplaceable | Rejection:
    """Pick GPUs for the replica and hold them, in the caller's transaction.

    Answers Allocated (also for a retry of a place that already succeeded),
    Unplaceable with per-node verdicts when there is no room on committed
    data or past the tenant's limit (its `quota`), or a Rejection for bad
    input (a tenant that does not exist among it) or a replica id already in
    use. Raises ReplicaReleased for a replica id released while it held
    nothing (allocations/storing.py), nothing held.

    With preemption LOWER_PRIORITY, no room on free GPUs (within the
    limit) stops the victims placement/preemption.py chooses, in this
    transaction (Allocated.preempted), or says why not (Unplaceable).
    """
    problem = validate_place(request)
    if problem is None:
        problem = await admission(conn, request)
    if problem is not None:
        return problem
    try:
        placed = await _place(conn, request, actor)
        if isinstance(placed, Allocated) and request.reservation is not None:
            await placed_into(conn, request.reservation)
        return placed
    except ChargeRefused as refused:
        # The claim's own verdict, under the quota's lock: its savepoint was
        # rolled back, nothing is held.
        return await refused_placement(conn, request, refused.refusal)


async def _place(
    conn: Connection, request: PlaceRequest, actor: str | None
) -> Allocated | Unplaceable | Rejection:
    changed = 0
    for _ in range(MAX_ROUNDS):
        busy: set[str] = set()
        # Every round starts with the one-node look, which checks the replica
        # id first: a concurrent place of the same replica may have committed
        # while this one waited.
        outcome = await _place_on_one_node(conn, request, actor, busy)
        if outcome is None and request.shards > 1:
            outcome = await _spread(conn, request, actor, busy)
        if isinstance(outcome, Allocated | Rejection):
            return outcome
        if outcome is _CONFLICT:
            continue
        if not busy:
            # The replica may have been placed by a concurrent retry between
            # the check above and the candidates read: that is not "no room".
            again = await _same_replica(conn, request)
            if again is not None:
                return again
            # No room; and were there room, would the tenant's limit, or its
            # absence, refuse it? That is the more useful answer.
            charge = request.charge
            mine = (await headroom(conn, charge.tenant_id, [request.gpu_class]))[request.gpu_class]
            refusal = mine.refusal(request.gpus)
            if refusal is not None:
                return await refused_placement(conn, request, refusal)
            declined: preemption.NoChoice | None = None
            if request.preemption is PreemptionPolicy.LOWER_PRIORITY:
                got = await preemption.preempt(
                    conn,
                    request,
                    actor,
                    lambda c: _claim_without_waiting(c, request, actor),
                    mine,
                )
                if isinstance(got, Allocated):
                    return got
                if not isinstance(got, preemption.NoChoice):
                    if isinstance(got, set):
                        # Nothing is held (its savepoint was rolled back).
                        await wait_for_nodes(conn, got)
                    elif got.no_room:  # Not a victim taken by another: a conflict.
                        changed += 1
                        if changed >= MAX_ATTEMPTS:
                            raise TransactionConflict(changed)
                    continue
                declined = got
            if request.shards > 1:
                facts, _ = await spread_plan(conn, request)
            else:
                facts = await candidates(conn, request)
            answer = await unplaceable(conn, request, facts)
            if declined is not None:
                answer = replace(
                    answer,
                    message=f"{answer.message}; preemption: {declined.why}",
                    blocking_budgets=declined.blocking,
                )
            return answer
        await wait_for_nodes(conn, busy)
    raise TransactionConflict(MAX_ROUNDS)


async def _claim_without_waiting(
    conn: Connection, request: PlaceRequest, actor: str | None
) -> Allocated | set[str] | None:
    """place()'s claim after its victims were freed: Allocated, the nodes others hold, or None.

    Never waits for a node's lock (the caller holds the victims' nodes,
    budgets and quota rows: waiting now could close a cycle); the nodes
    another transaction holds are answered, for the caller to wait for
    with nothing held.
    """
    busy: set[str] = set()
    # Without savepoints of its own (two round trips fewer): the caller's
    # savepoint is rolled back whenever this holds nothing, which lets go of
    # a node found full, and nothing here waits for a lock (the tenant's
    # quota row is the caller's already, so the claim's charge never waits
    # for it either).
    outcome = await _place_on_one_node(conn, request, actor, busy, savepoints=False)
    if outcome is None and request.shards > 1:
        outcome = await _spread(conn, request, actor, busy)
    if isinstance(outcome, Allocated):
        return outcome
    return busy or None


async def place_without_waiting(
    conn: Connection, request: PlaceRequest, actor: str | None = None
) -> Allocated | Rejection | None:
    """place()'s one-node look, in the caller's transaction, never waiting for another's lock.

    For a transaction that holds claims of other callers
    (service/scheduling/place_batches.py): it may lock nodes but must not
    wait for a lock while holding them, so whatever place() would wait or
    plan further for (every node of the window held by others, no room on
    one node, a conflict) is None, and the caller runs place() in a
    transaction of its own. Answers Allocated, or a Rejection (bad input, or
    the replica id holding other shards) exactly as place() would.

    Without savepoints (two round trips fewer per claim): a node locked and
    then found full stays locked until the batch commits, which is safe
    because this never waits (see _place_on_one_node). An exception leaves
    the transaction unusable: the caller must roll it back whole.
    """
    problem = validate_place(request)
    if problem is not None:
        return problem
    if request.admitting:
        # Checked against its reservation first (place()): in a transaction of its own.
        return None
    try:
        outcome = await _place_on_one_node(conn, request, actor, set(), savepoints=False)
    except (ReplicaReleased, ChargeRefused):
        # Its claim wrote nothing and the transaction is fine: place() in a
        # transaction of its own says so (a quota another transaction held is
        # waited for there).
        return None
    if isinstance(outcome, Allocated | Rejection):
        return outcome
    return None


async def claim_calls(
    conn: Connection,
    shape: PlaceRequest,
    calls: Sequence[tuple[PlaceRequest, str | None]],
    room: Sequence[tuple[str, int]],
    *,
    wait: bool = True,
) -> dict[int, Stored]:
    """One claim (claim_statement) for calls of `shape` on nodes this transaction has locked, best first.

    `room`: (node id, at most how many calls it takes). Answers by the
    call's position in `calls`; a call the nodes had no room for is absent.
    Each call is charged to its own request's charge; `wait` as
    store_calls' (false: a busy quota is Refused, not waited for).
    """
    topology = {"fabric": shape.fabric} if shape.rail_aligned else {}
    params: dict[str, Any]
    if len(calls) == 1 and len(room) == 1 and room[0][1] >= 1:
        (request, actor), (node_id, _) = calls[0], room[0]
        params = {
            "node_id": node_id,
            "replica_id": request.replica_id,
            "actor": actor,
            "names": shard_ids(request),
            "tenant": request.charge.tenant_id,
            "priority": request.charge.priority,
            "deployment": request.charge.deployment,
        }
    else:
        params = {
            "node_ids": [node_id for node_id, _ in room],
            "caps": [cap for _, cap in room],
            "replica_ids": [r.replica_id for r, _ in calls],
            "actors": [actor for _, actor in calls],
            "tenants": [r.charge.tenant_id for r, _ in calls],
            "priorities": [r.charge.priority for r, _ in calls],
            "deployments": [r.charge.deployment for r, _ in calls],
            "names": [name for r, _ in calls for name in shard_ids(r)],
            "shards": shape.shards,
        }
    several = "node_ids" in params
    params |= {
        "cls": shape.gpu_class,
        "need": shape.gpus,
        "per": shape.gpus_per_shard,
        # The shards pin the weights they were placed with.
        "weights": shape.weights,
        "tolerations": tolerations_json(shape.tolerations),
        "until": shape.until,
        "reservation": shape.reservation,
        **topology,
    }
    answers = await store_calls(conn, claim_statement(shape, several), params, wait=wait)
    # The statement numbers calls from 1 (WITH ORDINALITY).
    return {call - 1: outcome for call, outcome in answers.items()}


class _Conflict:
    """Someone committed first (this replica's shards, or GPUs the plan counted on): start over."""


_CONFLICT = _Conflict()


@dataclass(frozen=True)
class _Window:
    """Nothing was picked: the window, best first; every node in it was held by someone else.

    Empty when no node had room.
    """

    node_ids: tuple[str, ...]


@dataclass(frozen=True)
class _NoUse:
    """The node the try locked had no room for the replica after all."""

    node_id: str


async def _place_on_one_node(
    conn: Connection,
    request: PlaceRequest,
    actor: str | None,
    busy: set[str],
    *,
    savepoints: bool = True,
) -> Allocated | Rejection | _Conflict | None:
    """The common case: every shard on one node. Two statements per try, in a savepoint.

    None when no node has room on committed data, apart from the nodes added
    to `busy` (held by other transactions right now). A Rejection or an
    Allocated may also be the answer stored for this replica id.

    The savepoint (two more round trips) stays, also on the first try. A try
    can lock a node and then find it full (a claim on it committed between
    pick_sql's snapshot and its lock) or lose its shard ids to a concurrent
    retry; only rolling back to a savepoint taken before the lock lets go of
    that node. Kept until commit instead, it would be held while place()
    waits for busy nodes (see wait_for_nodes), and two schedulers each keeping a
    node the other waits for deadlock. Tried without the savepoint: in one of
    four bursts of 48 concurrent places on room for 24 GPUs, 23 transactions
    were deadlock victims (a second each before PostgreSQL broke the cycle),
    where the savepoint makes waiting deadlock-free.

    savepoints=False is for a transaction that never waits for a lock
    (place_without_waiting): a node it keeps locked until commit cannot be
    part of a deadlock, since the transaction waits for no one; a claim that
    found its node full wrote nothing (store_calls() takes back an incomplete
    claim's rows), and an error leaves the transaction to be rolled back
    whole by its owner.
    """
    full: set[str] = set()
    drawn_first = request.needs_topology
    while True:
        if not savepoints:
            outcome = await _try_one_node(
                conn, request, actor, busy | full, drawn_first, wait=False
            )
        else:
            outcome = await _try_in_savepoint(conn, request, actor, busy | full, drawn_first)
        if isinstance(outcome, _Window):
            if not outcome.node_ids:
                if drawn_first:
                    # Drawn before the topology check: look at every node.
                    drawn_first = False
                    continue
                return None
            busy.update(outcome.node_ids)
            continue
        if isinstance(outcome, _NoUse):
            full.add(outcome.node_id)
            continue
        return outcome


async def _try_in_savepoint(
    conn: Connection, request: PlaceRequest, actor: str | None, skip: set[str], drawn_first: bool
) -> Allocated | Rejection | _Window | _NoUse | _Conflict:
    savepoint = await conn.begin_nested()
    try:
        outcome = await _try_one_node(conn, request, actor, skip, drawn_first, wait=True)
    except BaseException:
        if savepoint.is_active:
            await savepoint.rollback()
        raise
    if isinstance(outcome, Allocated):
        await savepoint.commit()
    else:
        # Lets go of a node found full, or cordoned since the snapshot.
        await savepoint.rollback()
    return outcome


async def _try_one_node(
    conn: Connection,
    request: PlaceRequest,
    actor: str | None,
    skip: set[str],
    drawn_first: bool,
    *,
    wait: bool,
) -> Allocated | Rejection | _Window | _NoUse | _Conflict:
    """One try: pick and lock the best free node, then claim on it.

    Raises ChargeRefused when the claim's charge refused it (`wait`: whether
    the claim waits for a quota another transaction holds).
    """
    params = {
        **request_params(request),
        "replica_id": request.replica_id,
        "need": request.gpus,
        "limit": WINDOW,
        "scan": scan_size(request, WINDOW, drawn_first),
        "skip": sorted(skip),
    }
    rows = list(await conn.execute(cached_text(pick_sql(request, drawn_first)), params))
    head = rows[0]
    if head.shard_id is not None:
        answer = _answer_stored(request, [shard_from_row(r) for r in rows])
        assert answer is not None
        return answer
    if head.picked_node_id is None:
        return _Window(tuple(head.window_ids or ()))
    facts = facts_of(head, prefix="picked_")
    # judge() re-checks the row, so the SQL filters and the verdicts cannot
    # drift apart into a placement the verdicts would call unfit. Topology
    # is left to the claim, which counts the node's fit order (and its
    # domain) under the lock and holds nothing when it falls short.
    if not judge(facts, without_topology(request)).fits:
        return _NoUse(head.picked_node_id)
    outcome = await _claim_on(conn, request, actor, head.picked_node_id, wait=wait)
    if isinstance(outcome, Allocated):
        return outcome
    if isinstance(outcome, Tombstoned):
        raise outcome.refusal()
    if isinstance(outcome, Refused):
        outcome.raise_it()
    if not outcome.checked:
        return _NoUse(head.picked_node_id)
    return _CONFLICT


async def _claim_on(
    conn: Connection, request: PlaceRequest, actor: str | None, node_id: str, *, wait: bool
) -> Stored:
    """The claim (claim_statement) of every shard on one node this transaction has locked."""
    outcome = (await claim_calls(conn, request, [(request, actor)], [(node_id, 1)], wait=wait)).get(
        0
    )
    return NotStored(checked=False) if outcome is None else outcome


async def _spread(
    conn: Connection,
    request: PlaceRequest,
    actor: str | None,
    busy: set[str],
) -> Allocated | _Conflict | None:
    """Shards over several nodes of one fabric; None when they do not fit (see `busy`)."""
    while True:
        _, plan = await spread_plan(conn, request, skip=busy)
        if plan is None:
            return None
        outcome = await claim_plan(conn, request, plan, actor)
        if isinstance(outcome, Allocated):
            return outcome
        if outcome is None:
            # What we read changed before we locked (or the replica id was
            # taken meanwhile): start the round over, which checks both.
            return _CONFLICT
        busy |= outcome.node_ids
