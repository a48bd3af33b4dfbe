"""Several places of one shape claimed together: one pick and one claim for a batch's calls.

For the calls a shared transaction carries (service/scheduling/place_batches.py)
that differ only in replica id and charge (placement.plan.same_shape).
"""

from __future__ import annotations

from collections.abc import Sequence

from service.database.connections import Connection, cached_text
from service.scheduling.allocations import Allocated, Refused, Stored, Tombstoned
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement.claims import claim_calls, place_without_waiting
from service.scheduling.placement.plan import same_shape, without_topology
from service.scheduling.placement.statements import (
    WINDOW,
    facts_of,
    pick_several_sql,
    request_params,
    scan_size,
)
from service.scheduling.rejections import Rejection
from service.scheduling.verdicts import judge


async def place_several_without_waiting(
    conn: Connection, calls: Sequence[tuple[PlaceRequest, str | None]]
) -> tuple[list[Allocated | Rejection | None], list[str | None]]:
    """place_without_waiting for several calls of one shape (same_shape): one pick and one claim for all.

    One statement locks up to one node per call (best first, SKIP LOCKED);
    one claim statement (claim_statement) then counts those nodes' free GPUs afresh
    under the locks and holds the calls' GPUs, the calls filling the nodes
    in rank order as many as each has room for, as the calls made one by
    one would (see topology_fit.claim_wanted). A call whose replica id has
    stored shards or came earlier in the group, whose shard ids a concurrent
    call took, or for which the locked nodes had no room left, is made by
    place_without_waiting (its own pick), in the same transaction, after
    the group's claim; each is counted in GROUP_CLAIMS by why. Answers in
    the order of `calls`.
    """
    shape = same_shape(calls[0][0])
    assert shape is not None and all(same_shape(r) == shape for r, _ in calls)
    params = {
        **request_params(shape),
        "need": shape.gpus,
        "limit": WINDOW,
        "scan": scan_size(shape, WINDOW, drawn_first=shape.needs_topology),
        "skip": [],
        "k": len(calls),
        "replica_ids": [r.replica_id for r, _ in calls],
    }
    rows = list(await conn.execute(cached_text(pick_several_sql(shape)), params))
    stored = set(rows[0].stored_ids)
    # (node id, how many claims its snapshot says it takes), best first.
    # Topology is left to the claim, as in _try_one_node: the count is an
    # upper bound then, and the claim takes what the node has.
    untopological = without_topology(shape)
    room = [
        (r.node_id, r.free // shape.gpus)
        for r in rows
        if r.node_id is not None and judge(facts_of(r), untopological).fits
    ]
    together: list[int] = []
    apart: dict[int, str] = {}
    seen: set[str] = set()
    for i, (request, _) in enumerate(calls):
        if request.replica_id in stored:
            apart[i] = "stored"
        elif request.replica_id in seen:
            apart[i] = "repeated"
        else:
            seen.add(request.replica_id)
            together.append(i)
    claimed: dict[int, Stored] = {}
    if together and room:
        claimed = await claim_calls(conn, shape, [calls[i] for i in together], room, wait=False)
    answers: list[Allocated | Rejection | None] = []
    why: list[str | None] = []
    for i, (request, actor) in enumerate(calls):
        if i in apart:
            why.append(apart[i])
        elif isinstance(claim := claimed.get(together.index(i)), Allocated):
            answers.append(claim)
            why.append(None)
            continue
        elif isinstance(claim, Tombstoned):
            # Released while it held nothing: place() alone refuses it.
            why.append("released")
            answers.append(None)
            continue
        elif isinstance(claim, Refused):
            # Its charge: the tenant's limit (counted with the group's calls
            # before it), a quota another transaction holds, or no such
            # tenant. place() alone, waiting for the quota, says which.
            why.append("charge")
            answers.append(None)
            continue
        else:
            # Not answered: no room left on the locked nodes; NotStored: its
            # shard ids or a GPU were taken meanwhile (the one-call path reads whose).
            why.append("no_room" if claim is None else "conflict")
        answers.append(await place_without_waiting(conn, request, actor))
    return answers, why
