"""A placement group's members claimed in one round: every node locked at once, then one store.

placeGroup's common case (service/scheduling/groups/placing.py): members on
one node each, of one GPU class, without topology or tolerations. The
single-replica claim (claims.py) serves every other member.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from service.database.connections import Connection
from service.scheduling.allocations import (
    Allocated,
    AllocationRequest,
    ShardRequest,
    allocate_on_locked_nodes,
)
from service.scheduling.placement.claims import Busy
from service.scheduling.placement.numa import numa_of, spread_order
from service.scheduling.placement.plan import Plan, shard_ids
from service.scheduling.placement.statements import LOCK_WITH_GPUS_OR_SKIP
from service.scheduling.verdicts import PlaceRequest


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
        wanted.append(AllocationRequest(request.replica_id, tuple(shards), weights=request.weights))
    outcomes = await allocate_on_locked_nodes(conn, wanted, actor)
    allocated = [o for o in outcomes if isinstance(o, Allocated)]
    return allocated if len(allocated) == len(members) else None
