"""allocate(): hold the GPUs a scheduler named, once its nodes, GPUs and fabric pass under the locks."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Row

from service.database.connections import Connection
from service.node_states import shown_reason, state_phrase
from service.scheduling.allocations.fabrics import FabricChoice, fabric_for
from service.scheduling.allocations.records import (
    SHARD_COLUMNS,
    Allocated,
    ShardRecord,
    shard_from_row,
)
from service.scheduling.allocations.requests import AllocationRequest, validate_request
from service.scheduling.allocations.storing import (
    NotStored,
    Refused,
    Rows,
    Stored,
    Tombstoned,
    Wanted,
    store,
    store_calls,
    store_statement,
)
from service.scheduling.availability import (
    ADMITS_ASKED,
    gpu_admitted,
    gpu_health_reasons,
    gpu_tolerated,
    gpu_usable,
    is_schedulable,
)
from service.scheduling.generations import current_generation
from service.scheduling.maintenance_rule import maintenance_json, maintenance_on
from service.scheduling.rejections import (
    Rejection,
    RejectionCode,
    in_maintenance,
    index_ranges,
    refused_for_charge,
    shown,
)
from service.scheduling.taints import (
    first_taint,
    label,
    stored_tolerations,
    tolerations_json,
    withholding,
)
from service.scheduling.tenancy.charges import CHARGE_FIELDS, ChargeRefused

_LOCK_NODES = text(
    """
    SELECT id, state, admin_reason, liveness_reason FROM nodes
    WHERE id = ANY(CAST(:ids AS text[]))
    ORDER BY id
    FOR NO KEY UPDATE
    """
)


async def lock_nodes(conn: Connection, node_ids: Sequence[str]) -> dict[str, Row[Any]]:
    """Row-lock nodes in id order, waiting for whoever holds them; missing ids are simply absent."""
    rows = await conn.execute(_LOCK_NODES, {"ids": sorted(set(node_ids))})
    return {r.id: r for r in rows}


_GPUS_ASKED = text(
    f"""
    SELECT r.node_id, r.idx, g.idx IS NOT NULL AS present, {gpu_usable("g")} AS usable,
           {gpu_health_reasons("g")} AS health_reasons, g.cordon_reason, a.shard_id AS held_by,
           CASE WHEN g.withheld THEN {first_taint("g.node_id", "g.idx", withholding("t", True))}
           END AS taint, g.reservation, {gpu_admitted("g", ADMITS_ASKED)} AS admitted,
           {maintenance_json("r.node_id")} AS maintenance
    FROM jsonb_to_recordset(CAST(:pairs AS jsonb)) AS r(node_id text, idx int)
    LEFT JOIN gpus g ON g.node_id = r.node_id AND g.idx = r.idx
    LEFT JOIN allocated_gpus a ON a.node_id = r.node_id AND a.gpu_index = r.idx
    """
)

_GPU_INDICES = text(
    "SELECT array_agg(idx ORDER BY idx) AS indices FROM gpus WHERE node_id = :node_id"
)

# The nodes asked for and every node the replica already has shards on (its
# fabric must match theirs), locked in one statement, in id order.
_LOCK_FOR_REPLICA = text(
    """
    SELECT id, state, admin_reason, liveness_reason FROM nodes
    WHERE id IN (SELECT unnest(CAST(:ids AS text[]))
                 UNION SELECT node_id FROM shards WHERE replica_id = :replica_id)
    ORDER BY id
    FOR NO KEY UPDATE
    """
)

# The shards asked for (a retry, or a clash) and the replica's other shards.
_SHARDS_OF_REQUEST = text(
    f"SELECT {SHARD_COLUMNS} FROM shards s"
    " WHERE s.shard_id = ANY(CAST(:ids AS text[])) OR s.replica_id = :replica_id"
)


def _one_node_checks(call: str, replica_id: str) -> str:
    """SQL: allocate()'s checks of the call `call`'s shards and GPUs (want_shards, want_gpus).

    The checks a plain one-node allocation needs, made in the store
    statement on its snapshot (started under the node's lock): none of the
    shard ids is stored (a retry or a clash, which _duplicate words), the
    replica (`replica_id`) has no shard on another node (it would need a
    fabric), and every GPU exists and is free (availability.gpu_offered:
    usable, not held, probed as below, and not withheld by a taint the
    request (:tolerations) does not tolerate), and no maintenance window in
    force keeps the replica (its :until) off the node (maintenance_rule, as
    place judges it: one probe of the window's nodes per shard).
    """
    return f"""(
            NOT EXISTS (SELECT 1 FROM shards s WHERE s.shard_id IN (
                SELECT w.shard_id FROM want_shards w WHERE w.call = {call}))
            AND NOT EXISTS (SELECT 1 FROM want_shards w
                            WHERE w.call = {call} AND {maintenance_on("w.node_id")})
            AND NOT EXISTS (SELECT 1 FROM shards s
                            WHERE s.replica_id = {replica_id}
                              AND s.node_id NOT IN (
                                  SELECT w.node_id FROM want_shards w WHERE w.call = {call}))
            AND NOT EXISTS (
                SELECT 1 FROM want_gpus w
                LEFT JOIN gpus g ON g.node_id = w.node_id AND g.idx = w.idx
                -- A probe of pk_allocated_gpus per GPU asked for. Written as
                -- `OR EXISTS (...)`, the planner (which guesses 100 rows for
                -- jsonb_to_recordset) hashed the whole of allocated_gpus
                -- instead: a sequential scan per allocation, growing with
                -- the cluster. LIMIT keeps the lateral from being turned
                -- into such a join.
                LEFT JOIN LATERAL (
                    SELECT true AS taken FROM allocated_gpus a
                    WHERE a.node_id = w.node_id AND a.gpu_index = w.idx
                    LIMIT 1
                ) held_now ON true
                WHERE w.call = {call}
                  AND (g.idx IS NULL OR NOT {gpu_usable("g")} OR held_now.taken
                       OR NOT {gpu_tolerated("g")} OR NOT {gpu_admitted("g", ADMITS_ASKED)})))"""


# allocate()'s shards, as named by the request. With :check, the checks a
# plain one-node allocation needs (_one_node_checks). When one fails nothing
# is written and allocate() reads the facts again to say which, so the
# wording stays in one place (_check_gpus).
# The fields of a shard and of a GPU as allocate() sends them (:shards, :gpus).
_SHARD_FIELDS = {
    "shard_id": "text", "node_id": "text", "gpu_indices": "int[]", "fabric": "text",
    "hcas": "text[]",
}  # fmt: skip
_GPU_FIELDS = {"node_id": "text", "idx": "int", "shard_id": "text"}

_SHARDS, _SHARDS_FROM = Rows.of_json(":shards", _SHARD_FIELDS)
_GPUS, _GPUS_FROM = Rows.of_json(":gpus", _GPU_FIELDS)
_STORE = store_statement(
    Wanted(
        shards=Rows(
            {
                "call": "0",
                "replica_id": "CAST(:replica_id AS text)",
                "actor": "CAST(:actor AS text)",
                **_SHARDS,
                "weights": "CAST(:weights AS text)",
                "tolerations": stored_tolerations(),
                "until": "CAST(:until AS timestamptz)",
                "reservation": "CAST(:reservation AS text)",
                "tenant": "CAST(:tenant AS text)",
                "priority": "CAST(:priority AS int)",
                "deployment": "CAST(:deployment AS text)",
            },
            _SHARDS_FROM,
        ),
        gpus=Rows({"call": "0", **_GPUS}, _GPUS_FROM),
        go=Rows(
            {
                "call": "0",
                "ok": "NOT CAST(:check AS boolean) OR "
                + _one_node_checks("0", "CAST(:replica_id AS text)"),
            }
        ),
    )
)

# allocate()'s common case for several replicas in one statement (calls
# numbered in the order given): each on one node, none tolerating a taint
# (:tolerations is empty), each checked by _one_node_checks.
# Each row also names its call, and a shard its replica, weights and charge.
_CALLS_SHARDS, _CALLS_SHARDS_FROM = Rows.of_json(
    ":shards",
    {"call": "int", "replica_id": "text", **_SHARD_FIELDS, "weights": "text", **CHARGE_FIELDS},
)
_CALLS_GPUS, _CALLS_GPUS_FROM = Rows.of_json(":gpus", {"call": "int", **_GPU_FIELDS})
_STORE_SEVERAL = store_statement(
    Wanted(
        shards=Rows(
            {
                **_CALLS_SHARDS,
                "actor": "CAST(:actor AS text)",
                "tolerations": stored_tolerations(),
            },
            _CALLS_SHARDS_FROM,
        ),
        gpus=Rows(_CALLS_GPUS, _CALLS_GPUS_FROM),
        go=Rows(
            {"call": "c.call", "ok": _one_node_checks("c.call", "c.replica_id")},
            "FROM (SELECT DISTINCT w.call, w.replica_id FROM want_shards w) c",
        ),
    )
)


async def allocate_on_locked_nodes(
    conn: Connection, requests: Sequence[AllocationRequest], actor: str | None = None
) -> list[Allocated | NotStored | Rejection]:
    """allocate()'s common case for several replicas at once, in one store statement.

    For a caller that holds the row locks of every node named and found them
    schedulable (placement groups' claim: groups.claiming.claim_members):
    each replica on one node, none tolerating a taint, none stored yet. Each
    is checked as allocate() checks its common case (_one_node_checks) and
    held, or answered NotStored when a check failed or a concurrent commit
    took its GPUs or shard ids (the caller plans again), or a Rejection when
    it is no allocation at all (validate_request). Answers in the order given.
    Raises ReplicaReleased, as allocate() does, for a replica id released
    while it held nothing.
    """
    answers: list[Allocated | NotStored | Rejection | None] = [None] * len(requests)
    shards: list[dict[str, Any]] = []
    gpus: list[dict[str, Any]] = []
    for call, request in enumerate(requests):
        problem = validate_request(request)
        if problem is not None:
            answers[call] = problem
            continue
        assert len({s.node_id for s in request.shards}) == 1 and not request.tolerations
        for s in request.shards:
            shards.append(
                {
                    "call": call,
                    "replica_id": request.replica_id,
                    "shard_id": s.shard_id,
                    "node_id": s.node_id,
                    "gpu_indices": sorted(s.gpu_indices),
                    "fabric": None,
                    "hcas": [],
                    "weights": request.weights,
                    "tenant": request.charge.tenant_id,
                    "priority": request.charge.priority,
                    "deployment": request.charge.deployment,
                }
            )
            gpus.extend(
                {"call": call, "node_id": s.node_id, "idx": i, "shard_id": s.shard_id}
                for i in s.gpu_indices
            )
    if shards:
        stored = await store_calls(
            conn,
            _STORE_SEVERAL,
            {
                "actor": actor,
                "shards": json.dumps(shards),
                "gpus": json.dumps(gpus),
                "tolerations": tolerations_json(()),
                "until": None,
                "at": None,
                "reservation": None,
            },
        )
        for call, outcome in stored.items():
            if isinstance(outcome, Tombstoned):
                # As allocate(): a member id released while it held nothing
                # refuses the claim (CONFLICT naming it); the caller's
                # savepoint takes back what the other calls stored.
                raise outcome.refusal()
            if isinstance(outcome, Refused):
                # Charged as a group (tenancy.quota_claims.charge_group) before
                # its members are claimed, a member is refused only by a
                # tenant that went away: the caller answers it.
                outcome.raise_it()
            answers[call] = outcome
    return [NotStored(checked=False) if a is None else a for a in answers]


_SET_FABRIC = text(
    """
    UPDATE shards s SET fabric = r.fabric, hcas = r.hcas
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(shard_id text, fabric text, hcas text[])
    WHERE s.shard_id = r.shard_id
    """
)


async def _shards_of_request(
    conn: Connection, request: AllocationRequest
) -> tuple[dict[str, ShardRecord], list[ShardRecord]]:
    """(stored shards with the ids asked for, the replica's other shards)."""
    asked = {s.shard_id for s in request.shards}
    rows = await conn.execute(
        _SHARDS_OF_REQUEST, {"ids": sorted(asked), "replica_id": request.replica_id}
    )
    found: dict[str, ShardRecord] = {}
    earlier: list[ShardRecord] = []
    for record in (shard_from_row(r) for r in rows):
        if record.shard_id in asked:
            found[record.shard_id] = record
        else:
            earlier.append(record)
    return found, earlier


def _duplicate(request: AllocationRequest, found: dict[str, ShardRecord]) -> Rejection | Allocated:
    """Exactly the stored shards again is a retry (answer what is stored); anything else is a clash."""
    mine = [found[s.shard_id] for s in request.shards if s.shard_id in found]
    for asked in request.shards:
        stored = found.get(asked.shard_id)
        if stored is None:
            continue
        same = (
            stored.replica_id == request.replica_id
            and stored.node_id == asked.node_id
            and stored.gpu_indices == tuple(sorted(asked.gpu_indices))
        )
        if not same:
            return Rejection(
                RejectionCode.DUPLICATE_SHARD,
                f"shard {shown(asked.shard_id)} is already allocated to replica "
                f"{shown(stored.replica_id)} on node {shown(stored.node_id)}, GPUs "
                f"{index_ranges(stored.gpu_indices)}; release it first or use a new shard id",
                node_id=stored.node_id,
                held_by=stored.shard_id,
            )
    if len(mine) == len(request.shards):
        return Allocated(tuple(sorted(mine, key=lambda s: s.shard_id)))
    first = mine[0]
    return Rejection(
        RejectionCode.DUPLICATE_SHARD,
        f"shard {shown(first.shard_id)} is already allocated, but not the rest of this "
        "request; to retry, send exactly the original shards, otherwise use new shard ids",
        node_id=first.node_id,
        held_by=first.shard_id,
    )


async def _check_generation(
    conn: Connection, request: AllocationRequest
) -> Rejection | Allocated | None:
    """None when the generation named is the replica's current one (read under its nodes' locks).

    A retry of a request that was stored (its generation moved with it) is
    answered what is stored, as any retry is.
    """
    current = await current_generation(conn, request.replica_id)
    if current == request.generation:
        return None
    found, _ = await _shards_of_request(conn, request)
    if found:
        return _duplicate(request, found)
    now = "holds no shards" if current is None else f"is at generation {current}"
    return Rejection(
        RejectionCode.GENERATION_CONFLICT,
        f"replica {shown(request.replica_id)} {now}, not {request.generation}: it changed "
        "since it was read (a release, a loss); read it again",
    )


def _check_nodes(request: AllocationRequest, locked: dict[str, Row[Any]]) -> Rejection | None:
    for shard in request.shards:
        node = locked.get(shard.node_id)
        if node is None:
            return Rejection(
                RejectionCode.NO_SUCH_NODE,
                f"node {shown(shard.node_id)} is not registered",
                node_id=shard.node_id,
            )
        if not is_schedulable(node.state):
            reason, _ = shown_reason(node.state, node.admin_reason, None, node.liveness_reason)
            phrase = state_phrase(node.state, reason)
            return Rejection(
                RejectionCode.NODE_NOT_SCHEDULABLE,
                f"node {shown(shard.node_id)} is {phrase}; it takes no new allocations",
                node_id=shard.node_id,
            )
    return None


async def _check_gpus(conn: Connection, request: AllocationRequest) -> Rejection | None:
    pairs = [(s.node_id, i) for s in request.shards for i in s.gpu_indices]
    rows = await conn.execute(
        _GPUS_ASKED,
        {
            "pairs": json.dumps([{"node_id": n, "idx": i} for n, i in pairs]),
            "tolerations": tolerations_json(request.tolerations),
            "until": request.until,
            "at": None,  # maintenance_rule.AT: now
            "reservation": request.reservation,
        },
    )
    facts = {(r.node_id, r.idx): r for r in rows}
    # A node a window in force keeps the replica off first (maintenance_rule.py).
    windows = ((n, facts[(n, i)].maintenance) for n, i in pairs)
    for node_id, window in windows:
        if window is not None:
            return in_maintenance(node_id, window)
    for node_id, index in pairs:
        gpu = facts[(node_id, index)]
        where = f"GPU {index} on node {shown(node_id)}"
        if not gpu.present:
            have = (await conn.execute(_GPU_INDICES, {"node_id": node_id})).scalar_one()
            return Rejection(
                RejectionCode.NO_SUCH_GPU,
                f"node {shown(node_id)} has no GPU {index}; its GPUs are "
                f"{index_ranges(have or ())}",
                node_id=node_id,
                gpu_index=index,
            )
        if gpu.held_by is not None:
            return Rejection(
                RejectionCode.GPU_TAKEN,
                f"{where} is held by shard {shown(gpu.held_by)}",
                node_id=node_id,
                gpu_index=index,
                held_by=gpu.held_by,
            )
        if gpu.present and not gpu.admitted:
            aside = "is" if gpu.reservation is not None else "is not"
            named = gpu.reservation or request.reservation or ""
            why = f"{where} {aside} set aside for reservation {shown(named)}"
            return Rejection(RejectionCode.GPU_TAKEN, why, node_id=node_id, gpu_index=index)
        if not gpu.usable and gpu.cordon_reason is not None:
            return Rejection(
                RejectionCode.GPU_CORDONED,
                f"{where} is cordoned ({gpu.cordon_reason})",
                node_id=node_id,
                gpu_index=index,
            )
        if not gpu.usable:
            reasons = ", ".join(gpu.health_reasons) or "unhealthy"
            return Rejection(
                RejectionCode.GPU_UNHEALTHY,
                f"{where} is unhealthy ({reasons})",
                node_id=node_id,
                gpu_index=index,
            )
        if gpu.taint is not None:
            t = gpu.taint
            on = "its node has" if t["gpu"] is None else "it has"
            return Rejection(
                RejectionCode.GPU_TAINTED,
                f"{where}: {on} the taint {label(t['key'], t['value'], t['effect'])} "
                f"({t['source']}: {shown(t['reason'], 120)}), which the request does not tolerate",
                node_id=node_id,
                gpu_index=index,
            )
    return None


async def allocate(
    conn: Connection,
    request: AllocationRequest,
    actor: str | None = None,
    *,
    fabric: str | None = None,
) -> Allocated | Rejection:
    """Hold every shard's GPUs, or none: a rejection leaves nothing written.

    Raises ReplicaReleased for a replica id released while it held nothing
    (its tombstone: allocations/storing.py), nothing written. A claim its
    charge refuses (the tenant's limit, no such tenant) is the Rejection
    rejections.refused_for_charge words.

    `fabric` pins the fabric (place() passes the one it planned on); otherwise
    a multi-node replica gets the one its nodes share (see allocations/fabrics.py).
    Runs in the caller's transaction; safe to call with the nodes already
    locked by it.
    """
    try:
        return await allocate_or_refuse(conn, request, actor, fabric=fabric)
    except ChargeRefused as refused:
        return refused_for_charge(refused.refusal)


async def allocate_or_refuse(
    conn: Connection,
    request: AllocationRequest,
    actor: str | None = None,
    *,
    fabric: str | None = None,
) -> Allocated | Rejection:
    """allocate(), raising ChargeRefused for a claim its charge refuses: for callers that answer it themselves (place)."""
    problem = validate_request(request)
    if problem is not None:
        return problem
    asked_nodes = {s.node_id for s in request.shards}
    params = {"ids": sorted(asked_nodes), "replica_id": request.replica_id}
    locked = {r.id: r for r in await conn.execute(_LOCK_FOR_REPLICA, params)}
    if request.generation is not None:
        conflict = await _check_generation(conn, request)
        if conflict is not None:
            return conflict
    if len(asked_nodes) == 1 and set(locked) == asked_nodes and not _check_nodes(request, locked):
        # The common case, every shard on one ready node and no other node
        # in the replica: no fabric to choose, and the checks are made in the
        # store statement itself. Two round trips in all: the lock, the store.
        outcome = await _store(conn, request, FabricChoice(None, {}), (), actor, check=True)
        if isinstance(outcome, Allocated):
            return outcome
        if isinstance(outcome, Tombstoned):
            raise outcome.refusal()
        if isinstance(outcome, Refused):
            outcome.raise_it()
        # A check failed (or a concurrent commit won): the passes below read
        # the facts again, in the order they are reported, and say which.
    # Two attempts: a conflict means a transaction that did not hold our lock
    # (a shard id reused on another node) committed first; the second pass
    # of checks sees it and names it.
    for _ in range(2):
        found, earlier = await _shards_of_request(conn, request)
        if found:
            return _duplicate(request, found)
        problem = _check_nodes(request, locked) or await _check_gpus(conn, request)
        if problem is not None:
            return problem
        choice = await fabric_for(conn, request, earlier, fabric)
        if isinstance(choice, Rejection):
            return choice
        outcome = await _store(conn, request, choice, earlier, actor, check=False)
        if isinstance(outcome, Allocated):
            return outcome
        if isinstance(outcome, Tombstoned):
            raise outcome.refusal()
        if isinstance(outcome, Refused):
            outcome.raise_it()
    first = request.shards[0]
    return Rejection(
        RejectionCode.GPU_TAKEN,
        f"another allocation took these GPUs or shard ids at the same moment (node "
        f"{shown(first.node_id)}); read allocations and retry",
        node_id=first.node_id,
    )


async def _store(
    conn: Connection,
    request: AllocationRequest,
    choice: FabricChoice,
    earlier: Sequence[ShardRecord],
    actor: str | None,
    *,
    check: bool,
) -> Stored:
    shards = [
        {
            "shard_id": s.shard_id,
            "node_id": s.node_id,
            "gpu_indices": sorted(s.gpu_indices),
            "fabric": choice.fabric,
            "hcas": list(
                choice.hcas.get(s.node_id, ())
                if s.hcas is None or choice.fabric is None
                else s.hcas
            ),
        }
        for s in request.shards
    ]
    gpus = [
        {"node_id": s.node_id, "idx": i, "shard_id": s.shard_id}
        for s in request.shards
        for i in s.gpu_indices
    ]
    outcome = await store(
        conn,
        _STORE,
        {
            "replica_id": request.replica_id,
            "actor": actor,
            "shards": json.dumps(shards),
            "gpus": json.dumps(gpus),
            "check": check,
            "at": None,  # maintenance_rule.AT: now
            "weights": request.weights,
            "tolerations": tolerations_json(request.tolerations),
            "until": request.until,
            "reservation": request.reservation,
            "tenant": request.charge.tenant_id,
            "priority": request.charge.priority,
            "deployment": request.charge.deployment,
        },
    )
    # A replica that grew onto a second node now needs a fabric for its
    # earlier shards too: they are handed the same fabric's adapters.
    stale = [s for s in earlier if s.fabric != choice.fabric and choice.fabric is not None]
    if isinstance(outcome, Allocated) and stale:
        fix = [
            {"shard_id": s.shard_id, "fabric": choice.fabric, "hcas": list(choice.hcas[s.node_id])}
            for s in stale
        ]
        await conn.execute(_SET_FABRIC, {"rows": json.dumps(fix)})
    return outcome
