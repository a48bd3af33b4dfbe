"""placeGroup, scaleGroup and releaseGroup: a group's replicas held or freed all together, in the caller's transaction.

How a group is held: the board is read from committed data (reads.read_window,
the first members of every class that may take a shard, which gives the plan
the whole board gives; reads.read_board for the shapes it cannot read and to
tell why nothing fits; locking nothing), the whole group planned
(planning.plan_group), and then, inside one savepoint, the group's row
written and its members claimed: every node of the plan locked without
waiting, each node's GPUs packed by the rule the plan was made by and
allocate() through the one store path (claiming.claim_group; members on one
node each without topology or tolerations in one round,
claiming.claim_members). A member is an ordinary replica: every check,
event, fence and generation of a replica applies, and so does any filter
availability gains. When a member's nodes are held by another transaction,
the savepoint is rolled back (nothing of the group stays), this waits for
those nodes' holders with nothing held, and plans again; when the plan no
longer holds (someone committed first: on the data it was made on, it
always holds), it plans again. "Unplaceable" is said only of a plan made on
committed data, so N concurrent calls on room for K groups place exactly K.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import text

from service.database.connections import Connection, keep_until_commit
from service.database.transactions import MAX_ATTEMPTS, TransactionConflict
from service.errors import InventoryError
from service.scheduling.allocations import release_replica
from service.scheduling.groups.board import Board
from service.scheduling.groups.charging import asked_by_class, quota_first, refused_charge
from service.scheduling.groups.claiming import claim_group, claim_members, claimed_together
from service.scheduling.groups.paths import CLOSENESS
from service.scheduling.groups.planning import Bounded, GroupPlan, Member, Misfit, plan_group
from service.scheduling.groups.preempting import preempt_for
from service.scheduling.groups.reads import (
    StoredGroup,
    read_board,
    read_group,
    read_window,
    windowed,
)
from service.scheduling.groups.requests import (
    GroupRequest,
    GroupRole,
    member_id,
    request_from_spec,
    shape_of,
    validate_group,
    validate_group_id,
    validate_role,
)
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import Unplaceable, preemption, unplaceable
from service.scheduling.placement.claims import Busy, wait_for_nodes
from service.scheduling.placement.explanation import RoleVerdict
from service.scheduling.rejections import Rejection, RejectionCode, invalid, shown
from service.scheduling.tenancy.charges import ChargeRefused, PreemptionPolicy, TenantForbidden
from service.scheduling.tenancy.quota_claims import charge_group
from service.scheduling.tenancy.victims import Preemption

MAX_ROUNDS = 64
# A plan that fails under the locks although no node was busy means what was
# read changed since (the claim packs each node as the plan did: on the data
# the plan read it cannot fail, claiming.py); a plan that fails so this many
# times running is not retried but answered CONFLICT, with the count the
# docs give for conflicts (docs/scheduler/errors.md): one constant.
MAX_STALE = MAX_ATTEMPTS

# Whether the groupId is stored, the member ids some other replica already
# uses (placed by place() or allocate()), and, when neither, the group's row
# and its members' rows written, answering the group's generation: one
# statement. No generation when the groupId is stored (or a concurrent call
# stored it first: the insert waits for it) or an id is used. The members'
# foreign key is checked at the end of the statement, when the group's row
# is there.
_START = """
    SELECT EXISTS (SELECT 1 FROM placement_groups WHERE group_id = :group_id) AS placed,
           ARRAY(SELECT DISTINCT s.replica_id FROM shards s
                 WHERE s.replica_id = ANY(CAST(:ids AS text[])) ORDER BY 1) AS used
"""
_INSERT_GROUP = text(
    f"""
    WITH start AS ({_START}), g AS (
        INSERT INTO placement_groups (group_id, spec)
        SELECT :group_id, CAST(:spec AS jsonb) FROM start
        WHERE NOT start.placed AND cardinality(start.used) = 0
        ON CONFLICT (group_id) DO NOTHING RETURNING group_id, generation
    ), m AS (
        INSERT INTO group_members (replica_id, group_id, role, n)
        SELECT m.replica_id, g.group_id, m.role, m.n
        FROM g, unnest(CAST(:ids AS text[]), CAST(:roles AS text[]), CAST(:ns AS int[]))
            AS m(replica_id, role, n)
    )
    SELECT start.placed, start.used, (SELECT generation FROM g) AS generation FROM start
    """
)
_INSERT_MEMBERS = text(
    """
    INSERT INTO group_members (replica_id, group_id, role, n)
    SELECT unnest(CAST(:ids AS text[])), :group_id, unnest(CAST(:roles AS text[])),
           unnest(CAST(:ns AS int[]))
    """
)
# Whether a group that found no room is stored after all (a retry) or its
# ids are used: the check _INSERT_GROUP makes before it writes, made alone.
_STARTING = text(_START)
_LOCK_GROUP = text(
    "SELECT group_id, spec, generation FROM placement_groups WHERE group_id = :group_id FOR UPDATE"
)
_BUMP = text(
    "UPDATE placement_groups SET generation = generation + 1, spec = CAST(:spec AS jsonb)"
    " WHERE group_id = :group_id"
)
_DROP_MEMBERS = text("DELETE FROM group_members WHERE replica_id = ANY(CAST(:ids AS text[]))")
_DROP_GROUP = text("DELETE FROM placement_groups WHERE group_id = :group_id")


class GroupGenerationConflict(InventoryError):
    """A scale or release naming a generation of the group that is not its current one: nothing changed."""

    code = "CONFLICT"

    def __init__(self, group_id: str, named: int, current: int) -> None:
        super().__init__(
            f"group {group_id!r} changed since generation {named}: its generation is {current}; "
            "read it again (group) and retry with the current generation"
        )
        self.group_id, self.named, self.current = group_id, named, current

    @property
    def extensions(self) -> dict[str, object]:
        return {
            "code": self.code,
            "groupId": self.group_id,
            "generation": self.named,
            "currentGeneration": self.current,
        }


@dataclass(frozen=True)
class _Taken:
    """Nothing written: the groupId is stored (by a retry, or a concurrent call), or `used` ids are."""

    used: tuple[str, ...]


@dataclass(frozen=True)
class _Held:
    """The plan claimed, and the group's generation when this call wrote its row."""

    plan: GroupPlan
    generation: int | None


def requests_of(group: GroupRequest) -> dict[str, PlaceRequest]:
    return {r.role: replace(r.shape, replica_id="") for r in group.roles}


def _member_request(group: GroupRequest, board: Board, member: Member) -> PlaceRequest:
    request = shape_of(
        member.role, board.requests[member.role], group.group_id, member.n, group.charge
    )
    # FABRIC locality: the plan's fabric is the member's (the claim hands it to allocate()).
    if member.plan.fabric is not None and request.fabric is None:
        request = replace(request, fabric=member.plan.fabric)
    return request


def _bounded(group: GroupRequest, bounded: Bounded) -> Rejection:
    """The answer when the planner's search reached its bound: nothing held, and not "no room"."""
    return Rejection(
        RejectionCode.SEARCH_BOUND, f"group {shown(group.group_id)}: {bounded.message}"
    )


async def _unplaceable(
    conn: Connection, group: GroupRequest, board: Board, misfit: Misfit
) -> Unplaceable:
    """Unplaceable for the group: which role failed, at which level, each role's verdict alone, and the failing role's verdicts per node."""
    role = group.role(misfit.role)
    assert role is not None
    request = shape_of(misfit.role, board.requests[misfit.role], group.group_id, misfit.n)
    why = await unplaceable(conn, request, [])
    hard = " (hard)" if group.locality.hard else ""
    message = (
        f"group {shown(group.group_id)} does not fit: role {shown(misfit.role)} replica "
        f"{misfit.n + 1} of {role.replicas} found no room at locality "
        f"{misfit.level.value}{hard}: {misfit.message}"
    )
    roles = []
    for r in group.roles:
        alone = replace(group, roles=(r,), kv_from=None, kv_to=None)
        outcome = plan_group(board.fork(), alone)
        if isinstance(outcome, Bounded):
            roles.append(RoleVerdict(r.role, False, f"not decided alone: {outcome.message}"))
        elif isinstance(outcome, Misfit):
            said = (
                f"{r.replicas} replicas do not fit even without the other roles: {outcome.message}"
            )
            roles.append(RoleVerdict(r.role, False, said))
        else:
            said = f"{r.replicas} replicas fit without the other roles"
            if r.role == misfit.role:
                said += "; not beside them"
            roles.append(RoleVerdict(r.role, r.role != misfit.role, said))
    return Unplaceable(message, why.verdicts, why.omitted, roles=tuple(roles))


async def _claim(
    conn: Connection,
    group: GroupRequest,
    board: Board,
    plan: GroupPlan,
    actor: str | None,
    held: Mapping[tuple[str, str], Sequence[int]] | None = None,
) -> bool | Busy:
    """Claim every member in the caller's savepoint: True, a Busy to wait for, or False (stale).

    Each member's GPUs are spread away from those of its role's other
    members on the same node (placement/numa.py); `held`: what (role,
    node) the group held before this claim (scaleGroup).
    """
    requests = [_member_request(group, board, member) for member in plan.members]
    if claimed_together([(r, m.plan) for r, m in zip(requests, plan.members, strict=True)]):
        # One round for the whole group (claiming.claim_members): its nodes
        # locked at once, one store of every member. Its members need no
        # topology: each node's GPUs are one cell, which it hands out by
        # count as the plan counted them.
        members = [(r, m.plan, m.role) for r, m in zip(requests, plan.members, strict=True)]
        together = await claim_members(conn, members, actor, held)
        return together if isinstance(together, Busy) else together is not None
    return await claim_group(conn, plan, requests, actor, held)


async def _plan(
    conn: Connection,
    group: GroupRequest,
    requests: dict[str, PlaceRequest],
    anchors: Sequence[str],
    window: bool,
) -> tuple[Board, tuple[Board, GroupPlan] | Misfit | Bounded]:
    """The board read and the plan on it: on the group's window when `window`, else the whole board.

    No plan on the window means none on the whole board (reads.read_window),
    whose Misfit (or Bounded) is the one to tell: it is read for that.
    """
    if window:
        board = await read_window(conn, group, requests)
        if board is not None:
            outcome = plan_group(board, group, anchors)
            if not isinstance(outcome, Misfit | Bounded):
                return board, outcome
    board = await read_board(conn, group, requests)
    return board, plan_group(board, group, anchors)


async def _hold(
    conn: Connection,
    group: GroupRequest,
    actor: str | None,
    write_rows: bool,
    anchors: Sequence[str] = (),
    numbered: dict[str, int] | None = None,
    held: Mapping[tuple[str, str], Sequence[int]] | None = None,
    *,
    wait: bool = True,
) -> _Held | Misfit | Bounded | _Taken | Busy:
    """Plan and claim the group's replicas in one savepoint, planning again after a wait or a stale plan.

    `numbered`: the first member number of each role (scaleGroup adds after
    the ones it has). `write_rows`: write the group's member rows. `wait`
    false: a member's nodes held by another transaction are answered
    (Busy), not waited for (the caller holds locks: preemption's claim).
    """
    stale = 0
    generation: int | None = None
    requests = requests_of(group)
    window = windowed(group, requests, anchors)
    for _ in range(MAX_ROUNDS):
        board, outcome = await _plan(conn, group, requests, anchors, window)
        if isinstance(outcome, Misfit | Bounded):
            return outcome
        _, plan = outcome
        if numbered:
            plan = replace(
                plan,
                members=tuple(replace(m, n=m.n + numbered.get(m.role, 0)) for m in plan.members),
            )
        rows = {
            "group_id": group.group_id,
            "ids": [member_id(group.group_id, m.role, m.n) for m in plan.members],
            "roles": [m.role for m in plan.members],
            "ns": [m.n for m in plan.members],
        }
        savepoint = await conn.begin_nested()
        try:
            if write_rows:
                spec = json.dumps(group.spec())
                inserted = (await conn.execute(_INSERT_GROUP, {**rows, "spec": spec})).one()
                if inserted.generation is None:
                    await savepoint.rollback()
                    return _Taken(tuple(inserted.used))
                generation = int(inserted.generation)
            else:
                await conn.execute(_INSERT_MEMBERS, rows)
            asked = asked_by_class(group)
            if len(asked) > 1:
                # A group of several classes takes their quota rows in class
                # order before any node is locked (quota_claims.charge_group
                # says why). One class needs no round trip for it: its
                # members' claims take the one row, and a member past the
                # limit is refused, which rolls the whole group back.
                await charge_group(conn, group.charge.tenant_id, asked)
            claimed = await _claim(conn, group, board, plan, actor, held)
        except BaseException:
            if savepoint.is_active:
                await savepoint.rollback()
            raise
        if claimed is True:
            # No RELEASE: the savepoint's work commits with the transaction.
            await keep_until_commit(savepoint)
            return _Held(plan, generation)
        await savepoint.rollback()
        if isinstance(claimed, Busy):
            if not wait:
                return claimed
            stale = 0
            await wait_for_nodes(conn, claimed.node_ids)
            continue
        stale += 1
        if stale >= MAX_STALE:
            raise TransactionConflict(stale)
    raise TransactionConflict(MAX_ROUNDS)


async def _answer_stored(
    conn: Connection, group: GroupRequest, stored: StoredGroup
) -> StoredGroup | Rejection:
    if stored.spec == group.spec():
        return stored
    return Rejection(
        RejectionCode.CONFLICT,
        f"group {shown(group.group_id)} is already placed with other roles, shapes or locality; "
        "release it first or use a new groupId",
    )


async def place_group(
    conn: Connection, group: GroupRequest, actor: str | None = None
) -> StoredGroup | Unplaceable | Rejection:
    """Every replica of every role held, or none: the group as stored, Unplaceable, or a Rejection.

    Past its tenant's limit (the group's GPUs of a class, all together):
    Unplaceable with `quota`. With preemption LOWER_PRIORITY, a group that
    finds no room stops the least victim set that makes room for all of it
    (_preempt_for), or nothing.
    """
    problem = validate_group(group)
    if problem is not None:
        return problem
    try:
        return await _place_group(conn, group, actor)
    except ChargeRefused as refused:
        return await refused_charge(conn, group, refused.refusal)


async def _place_group(
    conn: Connection, group: GroupRequest, actor: str | None
) -> StoredGroup | Unplaceable | Rejection:
    for _ in range(MAX_STALE):
        # Whether the groupId is stored or its ids used is asked by the
        # statement that writes the group's rows (_INSERT_GROUP), after the
        # plan: a round trip fewer for every group placed. A plan that finds
        # no room asks it alone: a retry of a stored group is answered what is
        # stored however full the cluster is now.
        outcome = await _hold(conn, group, actor, write_rows=True)
        if isinstance(outcome, Misfit | Bounded):
            ids = [
                member_id(group.group_id, r.role, n) for r in group.roles for n in range(r.replicas)
            ]
            start = (await conn.execute(_STARTING, {"group_id": group.group_id, "ids": ids})).one()
            refused = await _refused(conn, group, start.placed, start.used)
            if refused is not None:
                return refused
            if isinstance(outcome, Bounded):
                return _bounded(group, outcome)
            over = await quota_first(conn, group)
            if over is not None:
                return over
            declined: preemption.NoChoice | None = None
            if group.preemption is PreemptionPolicy.LOWER_PRIORITY:
                got = await _preempt_for(conn, group, actor)
                if isinstance(got, tuple):
                    taken, preempted = got
                    assert taken.generation is not None
                    placed = await read_group(
                        conn, group.group_id, (group.spec(), taken.generation)
                    )
                    assert placed is not None
                    return replace(placed, preempted=preempted)
                if got is None:
                    # The victims, or the nodes, changed meanwhile: plan again.
                    continue
                declined = got
            board = await read_board(conn, group, requests_of(group))
            return _declined(await _unplaceable(conn, group, board, outcome), declined)
        if isinstance(outcome, _Taken):
            refused = await _refused(conn, group, True, outcome.used)
            if refused is not None:
                return refused
            # Stored by a concurrent call and released since: plan again.
            continue
        assert not isinstance(outcome, Busy) and outcome.generation is not None
        placed = await read_group(conn, group.group_id, (group.spec(), outcome.generation))
        assert placed is not None
        return placed
    raise TransactionConflict(MAX_STALE)


async def _preempt_for(
    conn: Connection,
    group: GroupRequest,
    actor: str | None,
    write_rows: bool = True,
    anchors: Sequence[str] = (),
    numbered: dict[str, int] | None = None,
    held: Mapping[tuple[str, str], Sequence[int]] | None = None,
) -> tuple[_Held, tuple[Preemption, ...]] | preemption.NoChoice | None:
    """The group held whole by stopping victims (preempting.py), or why not; None: plan again.

    The arguments are _hold's: placeGroup's whole group (`write_rows`), or
    the replicas scaleGroup adds close to its `anchors`.
    """
    requests = requests_of(group)
    window = windowed(group, requests, anchors)

    async def planner(c: Connection) -> GroupPlan | None:
        _, outcome = await _plan(c, group, requests, anchors, window)
        return None if isinstance(outcome, Misfit | Bounded) else outcome[1]

    async def claim(c: Connection) -> _Held | set[str] | None:
        got = await _hold(c, group, actor, write_rows, anchors, numbered, held, wait=False)
        if isinstance(got, Busy):
            return got.node_ids
        return got if isinstance(got, _Held) else None

    return await preempt_for(conn, group, actor, planner, claim)


async def _refused(
    conn: Connection, group: GroupRequest, placed: bool, used: Sequence[str]
) -> StoredGroup | Rejection | None:
    """The answer to a group whose groupId is stored (what is stored, or CONFLICT) or whose ids are used."""
    if placed:
        stored = await read_group(conn, group.group_id)
        if stored is not None:
            return await _answer_stored(conn, group, stored)
    if used:
        return Rejection(
            RejectionCode.CONFLICT,
            f"replica id {shown(used[0])} of group {shown(group.group_id)} is already held "
            "by a replica placed on its own; release it or use a new groupId",
        )
    return None


def group_of(stored: StoredGroup) -> GroupRequest:
    """A stored group as a request again (its spec), for scaling."""
    return request_from_spec(stored.group_id, stored.spec)


async def scale_group(
    conn: Connection,
    group_id: str,
    role: str,
    replicas: int,
    shape: PlaceRequest | None,
    generation: int | None,
    actor: str | None = None,
    *,
    bound: str | None = None,
) -> StoredGroup | Unplaceable | Rejection:
    """Add `replicas` (> 0) of `role` close to the group, or remove the farthest -replicas; all or nothing.

    The added replicas are charged as the group was (its tenant's limit,
    QUOTA_EXCEEDED). `bound`: the tenant the caller's token is bound to; a
    group of another tenant is refused (TenantForbidden), nothing changed.
    """
    problem = validate_group_id(group_id)
    if problem is not None:
        return problem
    if replicas == 0:
        return invalid("replicas=0: add (more than 0) or remove (less than 0) replicas")
    head = (await conn.execute(_LOCK_GROUP, {"group_id": group_id})).first()
    if head is None:
        return invalid(f"groupId {shown(group_id)!r} names no placed group")
    if generation is not None and generation != head.generation:
        raise GroupGenerationConflict(group_id, generation, int(head.generation))
    stored = await read_group(conn, group_id)
    assert stored is not None
    group = group_of(stored)
    if bound is not None and group.charge.tenant_id != bound:
        raise TenantForbidden("scaleGroup", bound, group.charge.tenant_id)
    existing = group.role(role)
    members = [m for m in stored.members if m.role == role]
    if replicas < 0:
        if existing is None:
            return invalid(f"role {shown(role)!r} is not a role of group {shown(group_id)}")
        if -replicas > len(members):
            return invalid(f"replicas={replicas}: role {shown(role)!r} has {len(members)} replicas")
        gone = _farthest(stored, role, -replicas)
        for replica in gone:
            await release_replica(conn, replica, actor)
        await conn.execute(_DROP_MEMBERS, {"ids": gone})
        kept = tuple(
            r if r.role != role else replace(r, replicas=r.replicas + replicas) for r in group.roles
        )
        await _bump(conn, replace(group, roles=tuple(r for r in kept if r.replicas > 0)))
        after = await read_group(conn, group_id)
        assert after is not None
        return after
    if existing is None:
        if shape is None:
            return invalid(
                f"role {shown(role)!r} is new to group {shown(group_id)}: give its shape"
            )
        added = GroupRole(role, replicas, replace(shape, replica_id=""))
    else:
        if shape is not None and replace(shape, replica_id="") != existing.shape:
            return invalid(
                f"shape differs from role {shown(role)!r}'s: a role's replicas share one shape"
            )
        added = GroupRole(role, replicas, existing.shape)
    first = 1 + max((m.n for m in members), default=-1)
    problem = validate_role(group_id, "scaleGroup", added, highest=first + replicas - 1)
    if problem is not None:
        return problem
    # The new replicas alone, planned close to the nodes the group uses
    # (and, hard locality, in the zone the group is in).
    addition = replace(group, roles=(added,), kv_from=None, kv_to=None)
    anchors = sorted({s.node_id for m in stored.members for s in m.shards})
    held: dict[tuple[str, str], list[int]] = {}
    for m in members:
        for s in m.shards:
            held.setdefault((role, s.node_id), []).extend(s.gpu_indices)
    try:
        preempted = await _add(conn, addition, actor, anchors, {role: first}, held)
    except ChargeRefused as refused:
        # The additions are charged as one, as a group is.
        return await refused_charge(conn, addition, refused.refusal)
    if not isinstance(preempted, tuple):
        return preempted
    roles = (
        tuple(
            r if r.role != role else replace(r, replicas=r.replicas + replicas) for r in group.roles
        )
        if existing is not None
        else (*group.roles, added)
    )
    await _bump(conn, replace(group, roles=roles))
    after = await read_group(conn, group_id)
    assert after is not None
    return replace(after, preempted=preempted)


async def _add(
    conn: Connection,
    addition: GroupRequest,
    actor: str | None,
    anchors: Sequence[str],
    numbered: dict[str, int],
    held: Mapping[tuple[str, str], Sequence[int]],
) -> tuple[Preemption, ...] | Unplaceable | Rejection:
    """scaleGroup's new replicas held: the victims stopped for them (none on free GPUs), or why not.

    With the group's preemption LOWER_PRIORITY, replicas that find no room
    stop the least victim set that makes room for all of them, as placeGroup
    does for a whole group (_preempt_for), or nothing.
    """
    for _ in range(MAX_STALE):
        outcome = await _hold(
            conn,
            addition,
            actor,
            write_rows=False,
            anchors=anchors,
            numbered=numbered,
            held=held,
        )
        if isinstance(outcome, _Held):
            return ()
        if isinstance(outcome, Bounded):
            return _bounded(addition, outcome)
        assert isinstance(outcome, Misfit)
        over = await quota_first(conn, addition)
        if over is not None:
            return over
        declined: preemption.NoChoice | None = None
        if addition.preemption is PreemptionPolicy.LOWER_PRIORITY:
            got = await _preempt_for(conn, addition, actor, False, anchors, numbered, held)
            if isinstance(got, tuple):
                return got[1]
            if got is None:
                # The victims, or the nodes, changed meanwhile: plan again.
                continue
            declined = got
        board = await read_board(conn, addition, requests_of(addition))
        return _declined(await _unplaceable(conn, addition, board, outcome), declined)
    raise TransactionConflict(MAX_STALE)


def _declined(answer: Unplaceable, declined: preemption.NoChoice | None) -> Unplaceable:
    """A group's Unplaceable, saying why preemption made no room (and the budgets that kept it)."""
    if declined is None:
        return answer
    return replace(
        answer,
        message=f"{answer.message}; preemption: {declined.why}",
        blocking_budgets=declined.blocking,
    )


async def _bump(conn: Connection, group: GroupRequest) -> None:
    await conn.execute(_BUMP, {"group_id": group.group_id, "spec": json.dumps(group.spec())})


def _farthest(stored: StoredGroup, role: str, count: int) -> list[str]:
    """The `count` replicas of the role farthest from the rest: the worst KV paths, then the highest n."""
    worst: dict[str, int] = {}
    for path in stored.kv_paths:
        for end in (path.from_id, path.to_id):
            worst[end] = worst.get(end, 0) + CLOSENESS[path.kind]
    members = [m for m in stored.members if m.role == role]
    members.sort(key=lambda m: (-worst.get(m.replica_id, 0), -m.n))
    return [m.replica_id for m in members[:count]]


async def release_group(
    conn: Connection, group_id: str, generation: int | None, actor: str | None = None
) -> int:
    """Free every replica of the group and forget it: the GPUs freed (0 for no such group)."""
    head = (await conn.execute(_LOCK_GROUP, {"group_id": group_id})).first()
    if head is None:
        return 0
    if generation is not None and generation != head.generation:
        raise GroupGenerationConflict(group_id, generation, int(head.generation))
    stored = await read_group(conn, group_id)
    assert stored is not None
    freed = 0
    for member in stored.members:
        freed += await release_replica(conn, member.replica_id, actor)
    await conn.execute(_DROP_GROUP, {"group_id": group_id})
    return freed
