"""A group's plan claimed under its nodes' locks, each node's GPUs packed by the rule the plan used.

The plan (planning.GroupPlan) says, per node and view of its GPUs, which
members take how many shards there (NodeShare), as counted on the board.
Here every node of the plan is locked at once without waiting (a Busy names
those another transaction holds), each view's offered GPUs are read under
the lock, and packing.pack, the function the planner judged the node by,
packs the same takes into the cells those GPUs make: each take gets the
GPUs of the cells pack named, so the claim takes what the plan found room
for. On committed data as the plan read it, that always succeeds: a lone
caller never finds its own plan gone (issue 44, where the claim gave each
member the lowest free indices and left an nvlinkShards member no NVLink
pair the plan had counted). A packing that fails here means another
transaction changed the nodes since the read: the caller plans again.

The common case is claimed in one round (claim_members, when
claimed_together): members each on one node, of one GPU class, without
topology or tolerations: every node locked at once with its GPUs read, one
store statement for all the members.

Within a cell a take gets GPUs as place's claim gives them: those a
PREFER_NO_SCHEDULE taint sends last after the rest, then by index; a take
without nvlinkShards spreads away from the NUMA nodes its role's other
members hold there (numa.spread_order, Dynamo #10171). A railAligned
member takes its own GPUs' fit order (claims.claim_plan), alone on its
nodes' GPUs of its class (board.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from sqlalchemy import TextClause, text

from service.database.connections import Connection
from service.scheduling.allocations import (
    Allocated,
    AllocationRequest,
    ShardRequest,
    allocate_on_locked_nodes,
    allocate_or_refuse,
)
from service.scheduling.availability import gpu_last_resort, gpu_offered
from service.scheduling.groups.packing import Cells, pack
from service.scheduling.groups.planning import GroupPlan, NodeShare
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement.claims import Busy, claim_plan
from service.scheduling.placement.numa import numa_of, spread_order
from service.scheduling.placement.plan import Plan, shard_ids
from service.scheduling.placement.statements import LOCK_OR_SKIP, LOCK_WITH_GPUS_OR_SKIP
from service.scheduling.rejections import Rejection
from service.scheduling.taints import tolerations_json


@lru_cache(maxsize=2)
def _offered(tolerating: bool) -> TextClause:
    """The GPUs of class :cls the nodes :ids offer a request (availability.gpu_offered), with their cells' facts.

    Read under the nodes' locks, so what it counts is what allocate() will
    find: each GPU's NVLink group, NUMA node, and whether a PREFER_NO_SCHEDULE
    taint sends it last.
    """
    return text(
        f"""
        SELECT g.node_id, g.idx, g.nvlink_group, g.numa_node,
               {gpu_last_resort("g", tolerating)} AS last_resort
        FROM gpus g
        WHERE g.node_id = ANY(CAST(:ids AS text[])) AND g.gpu_class = :cls
          AND {gpu_offered("g", tolerating)}
        ORDER BY g.node_id, g.idx
        """
    )


@dataclass(frozen=True)
class _Gpu:
    idx: int
    group: int | None
    numa: int | None
    last_resort: bool


def _claim_order(g: _Gpu) -> tuple[bool, int]:
    """Within a cell, as place's claim takes them: last-resort GPUs last, then by index."""
    return (g.last_resort, g.idx)


def cells_and_gpus(gpus: Sequence[_Gpu], grouped: bool) -> tuple[Cells, list[list[_Gpu]]]:
    """A node's offered GPUs of one view as cells (packing.cells_of's order) and each cell's GPUs.

    Grouped: one cell per NVLink group, most free GPUs first, then fewest
    used last, then by the group's number; then the GPUs in none. Otherwise
    one cell of them all. Within a cell: last-resort GPUs last, then by index.
    """

    if not grouped:
        every = sorted(gpus, key=_claim_order)
        return (len(every),), [every]
    groups: dict[int, list[_Gpu]] = {}
    rest: list[_Gpu] = []
    for g in gpus:
        if g.group is None:
            rest.append(g)
        else:
            groups.setdefault(g.group, []).append(g)
    # As the planner orders the cells it counted (board.NodeClass.cells):
    # most free first, then fewest used last; like cells by group number.
    ordered = sorted(
        groups.items(),
        key=lambda item: (-len(item[1]), sum(g.last_resort for g in item[1]), item[0]),
    )
    lists = [sorted(members, key=_claim_order) for _, members in ordered]
    lists.append(sorted(rest, key=_claim_order))
    return tuple(len(cell) for cell in lists), lists


def _assign(
    share: NodeShare,
    gpus: Sequence[_Gpu],
    roles: Sequence[str],
    kin: dict[tuple[str, str], list[int]],
) -> dict[int, list[tuple[int, ...]]] | None:
    """Each member's shards on the node (its index in the plan -> the GPUs of each shard), or None.

    pack() on the cells the GPUs make, as the plan packed the same takes on
    the cells it counted; None when they no longer hold them (the node
    changed since the plan's read). `kin`: the GPUs each role holds on each
    node so far, which a take without nvlinkShards spreads away from.
    """
    cells, lists = cells_and_gpus(gpus, share.grouped)
    takes = tuple(take for _, take in share.takes)
    packed = pack(cells, takes)
    if packed is None:
        return None
    packing, _ = packed
    numa = {(share.node_id, g.idx): g.numa for g in gpus}
    used: set[int] = set()
    given: dict[int, list[tuple[int, ...]]] = {}
    for (member, take), got in zip(share.takes, packing, strict=True):
        role = roles[member]
        if take.nvlink:
            shards = []
            for cell in got:
                chosen = [g.idx for g in lists[cell] if g.idx not in used][: take.per]
                used.update(chosen)
                shards.append(tuple(chosen))
        else:
            # The take's own order (place's claim: last-resort GPUs last, then
            # by index, spread over NUMA nodes away from its role's), within
            # the cells pack gave it.
            preferred = [g.idx for g in sorted(gpus, key=_claim_order) if g.idx not in used]
            held = kin.get((role, share.node_id))
            if held:
                last = {g.idx for g in gpus if g.last_resort}
                preferred = spread_order(share.node_id, preferred, held, numa, last)
            rank = {i: k for k, i in enumerate(preferred)}
            chosen = []
            for cell, count in enumerate(got):
                free = sorted(
                    (g.idx for g in lists[cell] if g.idx not in used), key=rank.__getitem__
                )
                chosen += free[:count]
            chosen.sort(key=rank.__getitem__)
            used.update(chosen)
            shards = [tuple(chosen[k * take.per : (k + 1) * take.per]) for k in range(take.shards)]
        kin.setdefault((role, share.node_id), []).extend(i for s in shards for i in s)
        given[member] = shards
    return given


async def claim_group(
    conn: Connection,
    plan: GroupPlan,
    requests: Sequence[PlaceRequest],
    actor: str | None,
    held: Mapping[tuple[str, str], Sequence[int]] | None = None,
) -> bool | Busy:
    """Claim every member of the plan in the caller's savepoint: True, a Busy to wait for, or False (stale).

    `requests`: each member's request (its replica id, and the plan's fabric
    for a spread). `held`: the GPUs each (role, node) held before (scaleGroup).
    """
    node_ids = sorted({n for m in plan.members for n, _ in m.plan.nodes})
    got = {r.id for r in await conn.execute(LOCK_OR_SKIP, {"ids": node_ids})}
    if len(got) < len(node_ids):
        return Busy(set(node_ids) - got)
    roles = [m.role for m in plan.members]
    kin: dict[tuple[str, str], list[int]] = {k: list(v) for k, v in (held or {}).items()}
    # Per node, each member's shards there.
    assigned: dict[tuple[int, str], list[tuple[int, ...]]] = {}
    packed = [s for s in plan.shares if not s.rail]
    reads: dict[tuple[str, str], list[NodeShare]] = {}
    for share in packed:
        request = requests[share.takes[0][0]]
        offer = (request.gpu_class, tolerations_json(request.tolerations))
        reads.setdefault(offer, []).append(share)
    for (cls, tolerations), shares in reads.items():
        tolerating = tolerations != "[]"
        ids = sorted({s.node_id for s in shares})
        params: dict[str, object] = {"ids": ids, "cls": cls}
        if tolerating:
            params["tolerations"] = tolerations
        rows = await conn.execute(_offered(tolerating), params)
        gpus: dict[str, list[_Gpu]] = {}
        for r in rows:
            gpus.setdefault(r.node_id, []).append(
                _Gpu(r.idx, r.nvlink_group, r.numa_node, bool(r.last_resort))
            )
        for share in shares:
            given = _assign(share, gpus.get(share.node_id, []), roles, kin)
            if given is None:
                return False
            for index, gpu_lists in given.items():
                assigned[(index, share.node_id)] = gpu_lists
    for k, member in enumerate(plan.members):
        request = requests[k]
        if request.rail_aligned:
            # Its shards take its own GPUs' fit order (the HCA decides), alone
            # on its nodes' GPUs of its class (board.py).
            outcome = await claim_plan(conn, request, member.plan, actor)
            if isinstance(outcome, Busy):
                return outcome
            if outcome is None:
                return False
            for shard in outcome.shards:
                kin.setdefault((member.role, shard.node_id), []).extend(shard.gpu_indices)
            continue
        names = iter(shard_ids(request))
        shards = [
            ShardRequest(next(names), node_id, indices)
            for node_id, _ in member.plan.nodes
            for indices in assigned[(k, node_id)]
        ]
        # Charged as the group (the member's request carries its charge); a
        # refusal (ChargeRefused) goes up to placeGroup, which answers it.
        result = await allocate_or_refuse(
            conn,
            AllocationRequest(
                request.replica_id,
                tuple(shards),
                weights=request.weights,
                tolerations=request.tolerations,
                charge=request.charge,
            ),
            actor,
            fabric=member.plan.fabric,
        )
        if isinstance(result, Rejection):
            return False
    return True


def claimed_together(members: Sequence[tuple[PlaceRequest, Plan]]) -> bool:
    """Whether claim_members can claim these members in one round: see there."""
    classes = {request.gpu_class for request, _ in members}
    return len(classes) == 1 and all(
        len(plan.nodes) == 1 and not request.needs_topology and not request.tolerating
        for request, plan in members
    )


async def claim_members(
    conn: Connection,
    members: Sequence[tuple[PlaceRequest, Plan, str]],
    actor: str | None,
    held: Mapping[tuple[str, str], Sequence[int]] | None = None,
) -> list[Allocated] | Busy | None:
    """Several replicas' plans claimed as claims.claim_plan claims one, in one round: every node locked, then one store.

    For members that claimed_together: each on one node, of one GPU class,
    without topology or tolerations. Their nodes are locked without waiting
    (a Busy names those another transaction holds; nothing is waited for),
    found schedulable under the lock, their offered GPUs read once, and each
    member given its shards from its node's GPUs in the order claims.claim_plan gives
    them (spread over NUMA nodes away from those its kin hold there, those
    a PREFER_NO_SCHEDULE taint sends last still last:
    members of one `kin`, a role say, and `held`, per (kin, node)), the members taking
    GPUs one after the other; then all are held by one store statement
    (allocations.allocate_on_locked_nodes). None when the plan no longer
    holds (a node left service, or a GPU or shard id was taken meanwhile):
    the caller, which runs this in its savepoint, rolls it back and plans
    again. Answers in the order given.
    """
    node_ids = sorted({node_id for _, plan, _ in members for node_id, _ in plan.nodes})
    request = members[0][0]
    # One round trip: the nodes locked, with their GPUs and NUMA nodes
    # (statements.LOCK_WITH_GPUS_OR_SKIP, which says why reading them on the
    # lock's snapshot is safe).
    rows = list(
        await conn.execute(LOCK_WITH_GPUS_OR_SKIP, {"ids": node_ids, "cls": request.gpu_class})
    )
    if len(rows) < len(node_ids):
        return Busy(set(node_ids) - {r.id for r in rows})
    if not all(r.schedulable for r in rows):
        return None
    free = {r.id: list(r.indices) for r in rows}
    last = {r.id: set(r.last_indices) for r in rows}
    numa: dict[tuple[str, int], int | None] = {}
    for r in rows:
        numa |= numa_of(r.id, r)
    taken: dict[tuple[str, str], list[int]] = {k: list(v) for k, v in (held or {}).items()}
    kin_nodes = [(kin, plan.nodes[0][0]) for _, plan, kin in members]
    spread = {n for k, n in kin_nodes if taken.get((k, n)) or kin_nodes.count((k, n)) > 1}
    wanted: list[AllocationRequest] = []
    for request, plan, kin in members:
        ((node_id, count),) = plan.nodes
        left = free.get(node_id, [])
        if node_id in spread and taken.get((kin, node_id)):
            left = spread_order(node_id, left, taken[(kin, node_id)], numa, last[node_id])
        per = request.gpus_per_shard
        if len(left) < count * per:
            return None
        names = iter(shard_ids(request))
        shards = [
            ShardRequest(next(names), node_id, tuple(left[k * per : (k + 1) * per]))
            for k in range(count)
        ]
        used = {i for shard in shards for i in shard.gpu_indices}
        free[node_id] = [i for i in free.get(node_id, []) if i not in used]
        taken.setdefault((kin, node_id), []).extend(sorted(used))
        wanted.append(
            AllocationRequest(
                request.replica_id, tuple(shards), weights=request.weights, charge=request.charge
            )
        )
    outcomes = await allocate_on_locked_nodes(conn, wanted, actor)
    allocated = [o for o in outcomes if isinstance(o, Allocated)]
    return allocated if len(allocated) == len(members) else None
