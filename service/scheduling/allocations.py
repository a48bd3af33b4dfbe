"""Who holds which GPUs: shards of replicas placed on nodes, and recording new ones.

store_statement() is the one write path for holding GPUs: allocate() checks
the GPUs it was given, place() picks free ones, and both hold them through it,
under the same locks, in one round trip that also keeps the pools and writes
the events.

Concurrency, in one paragraph: every writer that changes a node's GPUs,
allocations or state first takes that node's row lock (FOR NO KEY UPDATE: it
conflicts with cordon, removal and re-registration, which update or delete
the row, but not with the foreign-key checks of rows that merely reference
the node). Locks are taken in node-id order, so two allocations spanning the
same nodes queue instead of deadlocking. Under the lock, each check reads
what is committed now (READ COMMITTED takes a fresh snapshot per statement),
and the primary key of allocated_gpus stays the final guard: a claim that
runs into it (a writer that skipped the lock) writes nothing, and reading
again turns it into the rejection that explains it, never a 500.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.engine import Row

from service.database.connections import Connection, cached_text
from service.event_log.events import note_recorded, record_event
from service.fleet.reports import MAX_GPUS, MAX_ID_LENGTH
from service.scheduling.availability import gpu_health_reasons, gpu_usable, is_schedulable
from service.scheduling.gpu_pools import move_to_allocated, refresh_pools
from service.scheduling.rejections import Rejection, RejectionCode, index_ranges, invalid, shown


@dataclass(frozen=True)
class ShardRecord:
    shard_id: str
    replica_id: str
    node_id: str
    gpu_indices: tuple[int, ...]
    fabric: str | None
    hcas: tuple[str, ...]
    created_at: datetime


_COLUMNS = "s.shard_id, s.replica_id, s.node_id, s.gpu_indices, s.fabric, s.hcas, s.created_at"


def shard_from_row(row: Row[Any]) -> ShardRecord:
    return ShardRecord(
        shard_id=row.shard_id,
        replica_id=row.replica_id,
        node_id=row.node_id,
        gpu_indices=tuple(sorted(row.gpu_indices)),
        fabric=row.fabric,
        hcas=tuple(row.hcas),
        created_at=row.created_at,
    )


async def shards_by_id(conn: Connection, shard_ids: Sequence[str]) -> dict[str, ShardRecord]:
    rows = await conn.execute(
        cached_text(
            f"SELECT {_COLUMNS} FROM shards s WHERE s.shard_id = ANY(CAST(:ids AS text[]))"
        ),
        {"ids": list(shard_ids)},
    )
    return {r.shard_id: shard_from_row(r) for r in rows}


async def shards_on_nodes(
    conn: Connection, node_ids: Sequence[str]
) -> dict[str, list[ShardRecord]]:
    out: dict[str, list[ShardRecord]] = defaultdict(list)
    rows = await conn.execute(
        text(
            f"SELECT {_COLUMNS} FROM shards s WHERE s.node_id = ANY(CAST(:ids AS text[]))"
            " ORDER BY s.node_id, s.shard_id"
        ),
        {"ids": list(node_ids)},
    )
    for r in rows:
        out[r.node_id].append(shard_from_row(r))
    return out


async def list_allocations(
    conn: Connection,
    *,
    node_id: str | None,
    replica_id: str | None,
    first: int,
    after: str | None = None,
) -> list[ShardRecord]:
    """A page of shards sorted by shard id; `after` is the last shard id of the previous page."""
    where: list[str] = []
    params: dict[str, Any] = {"first": first}
    if node_id is not None:
        where.append("s.node_id = :node_id")
        params["node_id"] = node_id
    if replica_id is not None:
        where.append("s.replica_id = :replica_id")
        params["replica_id"] = replica_id
    if after is not None:
        where.append("s.shard_id > :after")
        params["after"] = after
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = await conn.execute(
        cached_text(f"SELECT {_COLUMNS} FROM shards s {clause} ORDER BY s.shard_id LIMIT :first"),
        params,
    )
    return [shard_from_row(r) for r in rows]


# A replica is at most this many shards: far above any real tensor/pipeline
# split, low enough that one request cannot make a statement of unbounded size.
MAX_SHARDS = 64
MAX_GPUS_PER_SHARD = MAX_GPUS


@dataclass(frozen=True)
class ShardRequest:
    shard_id: str
    node_id: str
    gpu_indices: tuple[int, ...]
    # The adapters this shard is handed, when place() chose them (railAligned:
    # exactly its GPUs' near HCAs); None: every adapter of the node on the fabric.
    hcas: tuple[str, ...] | None = None


@dataclass(frozen=True)
class AllocationRequest:
    replica_id: str
    shards: tuple[ShardRequest, ...]
    # The weights path the replica was placed with (place's `weights`): its
    # shards pin it on their nodes (service/fleet/weights_lifecycle.pinned_by).
    weights: str | None = None


@dataclass(frozen=True)
class Allocated:
    shards: tuple[ShardRecord, ...]


def _check_id(what: str, value: str) -> Rejection | None:
    if not value:
        return invalid(f"{what} is empty")
    if len(value) > MAX_ID_LENGTH:
        return invalid(f"{what} {shown(value)!r} is longer than {MAX_ID_LENGTH} characters")
    if "\x00" in value:
        # PostgreSQL text cannot hold it; refuse it here rather than as a database error.
        return invalid(f"{what} {shown(value)!r} contains a NUL character")
    return None


def validate_request(request: AllocationRequest) -> Rejection | None:
    """What can be refused without reading the database: nothing is locked or written for it."""
    problem = _check_id("replicaId", request.replica_id)
    if problem:
        return problem
    if not request.shards:
        return invalid("shards is empty: a replica needs at least one shard")
    if len(request.shards) > MAX_SHARDS:
        return invalid(
            f"{len(request.shards)} shards asked for; a replica has at most {MAX_SHARDS}"
        )
    seen_shards: set[str] = set()
    holder_of: dict[tuple[str, int], str] = {}
    for shard in request.shards:
        problem = _check_id("shardId", shard.shard_id) or _check_id(
            f"nodeId of shard {shown(shard.shard_id)}", shard.node_id
        )
        if problem:
            return problem
        sid = shown(shard.shard_id)
        if shard.shard_id in seen_shards:
            return invalid(f"shard {sid} appears twice in this request")
        seen_shards.add(shard.shard_id)
        if not shard.gpu_indices:
            return invalid(f"shard {sid} lists no GPUs (gpuIndices is empty)", shard.node_id)
        if len(shard.gpu_indices) > MAX_GPUS_PER_SHARD:
            return invalid(
                f"shard {sid} lists {len(shard.gpu_indices)} GPUs; a shard has at most "
                f"{MAX_GPUS_PER_SHARD}",
                shard.node_id,
            )
        seen_indices: set[int] = set()
        for index in shard.gpu_indices:
            if index < 0:
                return invalid(
                    f"shard {sid} asks for GPU {index}; GPU indices start at 0",
                    shard.node_id,
                    index,
                )
            if index in seen_indices:
                return invalid(f"shard {sid} lists GPU {index} twice", shard.node_id, index)
            seen_indices.add(index)
            other = holder_of.get((shard.node_id, index))
            if other is not None:
                return invalid(
                    f"GPU {index} on node {shown(shard.node_id)} is asked for by both shard "
                    f"{shown(other)} and shard {sid}",
                    shard.node_id,
                    index,
                )
            holder_of[(shard.node_id, index)] = shard.shard_id
    return None


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


def state_phrase(state: str, admin_reason: str | None, liveness_reason: str | None) -> str:
    """'cordoned: kernel upgrade', 'unreachable': the state and, if known, why."""
    reason = liveness_reason if state in ("unreachable", "lost") else admin_reason
    return f"{state}: {reason}" if reason else state


_GPUS_ASKED = text(
    f"""
    SELECT r.node_id, r.idx, g.idx IS NOT NULL AS present, {gpu_usable("g")} AS usable,
           {gpu_health_reasons("g")} AS health_reasons, g.cordon_reason, a.shard_id AS held_by
    FROM jsonb_to_recordset(CAST(:pairs AS jsonb)) AS r(node_id text, idx int)
    LEFT JOIN gpus g ON g.node_id = r.node_id AND g.idx = r.idx
    LEFT JOIN allocated_gpus a ON a.node_id = r.node_id AND a.gpu_index = r.idx
    """
)

_GPU_INDICES = text(
    "SELECT array_agg(idx ORDER BY idx) AS indices FROM gpus WHERE node_id = :node_id"
)

_FABRICS = text(
    """
    SELECT node_id, fabric, hcas, rate_gbps FROM fabric_attachments
    WHERE node_id = ANY(CAST(:ids AS text[]))
    ORDER BY node_id, fabric
    """
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
    f"SELECT {_COLUMNS} FROM shards s"
    " WHERE s.shard_id = ANY(CAST(:ids AS text[])) OR s.replica_id = :replica_id"
)


def store_statement(wanted: str) -> TextClause:
    """One round trip that holds GPUs for one or more calls: the shards, their GPUs, the pools and the events.

    `wanted` defines three CTEs, each keyed by `call` (an integer the caller
    chooses, one per replica being placed; allocate() has one call, 0):
    want_shards (call, replica_id, actor, shard_id, node_id, gpu_indices
    sorted, fabric, hcas, weights: the path the shard pins, or NULL), want_gpus (call, node_id, idx, shard_id) and go
    (one row per call: call, `ok`, whether the caller's checks, made in SQL,
    passed; nothing of that call is written otherwise). A call without a go
    row is not answered.

    Each call stands alone: its pools and events are written only when every
    one of its rows went in (`done`), whatever happened to the other calls of
    the statement, and store_calls() takes back what an incomplete call
    wrote. So several schedulers' claims can share one statement (service/
    scheduling/place_batches.py) and each is answered as if it had been made
    by itself.

    Run it only while holding the nodes' row locks, in a statement started
    after they were taken (see gpu_pools.move_to_allocated). A separate
    SAVEPOINT per claim would cost two more round trips, so a shard id or GPU
    that a concurrent commit took is not an error here: both inserts say ON
    CONFLICT DO NOTHING (an insert that meets an uncommitted row still waits
    for it, so the primary key of allocated_gpus stays the final guard).
    Shard ids must differ between the calls of one statement.
    """
    return text(
        f"""
        WITH {wanted}, s AS (
            INSERT INTO shards (shard_id, replica_id, node_id, gpu_indices, fabric, hcas, weights)
            SELECT w.shard_id, w.replica_id, w.node_id, w.gpu_indices, w.fabric, w.hcas, w.weights
            FROM want_shards w JOIN go ON go.call = w.call AND go.ok
            ORDER BY w.call, w.shard_id
            ON CONFLICT (shard_id) DO NOTHING
            RETURNING shard_id, replica_id, node_id, gpu_indices, fabric, hcas, created_at
        ), placed AS (
            SELECT w.call, w.actor, s.* FROM s JOIN want_shards w ON w.shard_id = s.shard_id
        ), held AS (
            INSERT INTO allocated_gpus (node_id, gpu_index, shard_id)
            SELECT w.node_id, w.idx, w.shard_id
            FROM want_gpus w JOIN s ON s.shard_id = w.shard_id
            ORDER BY w.node_id, w.idx
            ON CONFLICT (node_id, gpu_index) DO NOTHING
            RETURNING node_id, gpu_index, shard_id
        ), whole AS (
            SELECT go.call, go.ok AS checked,
                   go.ok
                   AND (SELECT count(*) FROM placed p WHERE p.call = go.call)
                       = (SELECT count(*) FROM want_shards w WHERE w.call = go.call)
                   AND (SELECT count(*) FROM held h JOIN placed p ON p.shard_id = h.shard_id
                        WHERE p.call = go.call)
                       = (SELECT count(*) FROM want_gpus w WHERE w.call = go.call) AS done
            FROM go
        ), kept AS (
            SELECT h.node_id, h.gpu_index
            FROM held h JOIN placed p ON p.shard_id = h.shard_id
            JOIN whole d ON d.call = p.call AND d.done
        ), {move_to_allocated("kept", "true")}, logged AS (
            -- The rows service.event_log.events.record_event writes, one per shard, in shard order.
            INSERT INTO events (kind, node_id, replica_id, shard_id, actor, detail)
            SELECT 'allocated', p.node_id, p.replica_id, p.shard_id, p.actor,
                   jsonb_build_object('gpuIndices', to_jsonb(p.gpu_indices), 'fabric', p.fabric,
                                      'hcas', to_jsonb(p.hcas))
            FROM placed p JOIN whole d ON d.call = p.call AND d.done
            ORDER BY p.call, p.shard_id
            RETURNING id, shard_id
        )
        SELECT d.call, d.checked, d.done,
               ARRAY(SELECT l.id FROM logged l JOIN placed q ON q.shard_id = l.shard_id
                     WHERE q.call = d.call ORDER BY l.id) AS event_ids,
               p.shard_id, p.replica_id, p.node_id, p.gpu_indices, p.fabric, p.hcas, p.created_at
        FROM whole d LEFT JOIN placed p ON p.call = d.call
        ORDER BY d.call, p.shard_id
        """
    )


# allocate()'s shards, as named by the request. With :check, the checks a
# plain one-node allocation needs are made here, on the snapshot of this
# statement (started under the node's lock): none of the shard ids is stored
# (a retry or a clash, which _duplicate words), the replica has no shard on
# another node (it would need a fabric), and every GPU exists and is free
# (availability.gpu_free: usable, and not held, probed as below). When one fails nothing is written and allocate() reads the facts
# again to say which, so the wording stays in one place (_check_gpus).
_STORE = store_statement(
    f"""
    want_shards AS (
        SELECT 0 AS call, CAST(:replica_id AS text) AS replica_id, CAST(:actor AS text) AS actor,
               r.*, CAST(:weights AS text) AS weights
        FROM jsonb_to_recordset(CAST(:shards AS jsonb))
            AS r(shard_id text, node_id text, gpu_indices int[], fabric text, hcas text[])
    ), want_gpus AS (
        SELECT 0 AS call, r.* FROM jsonb_to_recordset(CAST(:gpus AS jsonb))
            AS r(node_id text, idx int, shard_id text)
    ), go AS (
        SELECT 0 AS call, NOT CAST(:check AS boolean) OR (
            NOT EXISTS (SELECT 1 FROM shards s
                        WHERE s.shard_id IN (SELECT shard_id FROM want_shards))
            AND NOT EXISTS (SELECT 1 FROM shards s
                            WHERE s.replica_id = CAST(:replica_id AS text)
                              AND s.node_id NOT IN (SELECT node_id FROM want_shards))
            AND NOT EXISTS (
                SELECT 1 FROM want_gpus w
                LEFT JOIN gpus g ON g.node_id = w.node_id AND g.idx = w.idx
                -- A probe of pk_allocated_gpus per GPU asked for. Written as
                -- `OR EXISTS (...)`, the planner (which guesses 100 rows for
                -- jsonb_to_recordset) hashed the whole of allocated_gpus
                -- instead: a sequential scan per allocation, 4.4 ms of
                -- PostgreSQL's CPU at 10k nodes, which held allocate to a
                -- tenth of the raw baseline. LIMIT keeps the lateral from
                -- being turned into such a join.
                LEFT JOIN LATERAL (
                    SELECT true AS taken FROM allocated_gpus a
                    WHERE a.node_id = w.node_id AND a.gpu_index = w.idx
                    LIMIT 1
                ) held_now ON true
                WHERE g.idx IS NULL OR NOT {gpu_usable("g")} OR held_now.taken)
        ) AS ok
    )"""
)

# What an incomplete claim wrote, taken back: the ids come from the claim's
# own RETURNING, so only this transaction's rows go (their held GPUs with
# them, by the foreign key's cascade).
_UNDO = text("DELETE FROM shards WHERE shard_id = ANY(CAST(:ids AS text[]))")


@dataclass(frozen=True)
class NotStored:
    """A claim that wrote nothing.

    `checked` is False when the statement's own checks failed, True when a
    concurrent commit took one of its shard ids or GPUs first: reading again
    says whose.
    """

    checked: bool


async def store(
    conn: Connection, statement: TextClause, params: dict[str, Any]
) -> Allocated | NotStored:
    """Run a store_statement() of one call: every shard held, pools and events written, or nothing left."""
    return (await store_calls(conn, statement, params))[0]


async def store_calls(
    conn: Connection, statement: TextClause, params: dict[str, Any]
) -> dict[int, Allocated | NotStored]:
    """Run a store_statement(): per call answered (its go row), Allocated or NotStored.

    An incomplete call's rows are taken back (one statement for all such
    calls), so a call either holds every shard, with its pools and events,
    or nothing.
    """
    by_call: dict[int, list[Row[Any]]] = defaultdict(list)
    for row in await conn.execute(statement, params):
        by_call[row.call].append(row)
    answers: dict[int, Allocated | NotStored] = {}
    partial: list[str] = []
    for call, mine in by_call.items():
        head = mine[0]
        if head.done:
            note_recorded(list(head.event_ids))
            answers[call] = Allocated(tuple(shard_from_row(r) for r in mine))
        else:
            partial += [r.shard_id for r in mine if r.shard_id is not None]
            answers[call] = NotStored(bool(head.checked))
    if partial:
        await conn.execute(_UNDO, {"ids": partial})
    return answers


_SET_FABRIC = text(
    """
    UPDATE shards s SET fabric = r.fabric, hcas = r.hcas
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(shard_id text, fabric text, hcas text[])
    WHERE s.shard_id = r.shard_id
    """
)


@dataclass(frozen=True)
class _Attachment:
    hcas: tuple[str, ...]
    rate_gbps: int


@dataclass(frozen=True)
class _FabricChoice:
    fabric: str | None
    hcas: dict[str, tuple[str, ...]]


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
            phrase = state_phrase(node.state, node.admin_reason, node.liveness_reason)
            return Rejection(
                RejectionCode.NODE_NOT_SCHEDULABLE,
                f"node {shown(shard.node_id)} is {phrase}; it takes no new allocations",
                node_id=shard.node_id,
            )
    return None


async def _check_gpus(conn: Connection, request: AllocationRequest) -> Rejection | None:
    pairs = [(s.node_id, i) for s in request.shards for i in s.gpu_indices]
    rows = await conn.execute(
        _GPUS_ASKED, {"pairs": json.dumps([{"node_id": n, "idx": i} for n, i in pairs])}
    )
    facts = {(r.node_id, r.idx): r for r in rows}
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
    return None


def _fabric_rule(
    attachments: dict[str, dict[str, _Attachment]], node_ids: Sequence[str]
) -> str | None:
    """The fabric a multi-node replica runs on, when its nodes share several.

    The one whose slowest attachment among these nodes is fastest (a
    collective runs at the speed of its slowest link); ties go to the name
    that sorts first, so the same nodes always get the same fabric.
    """
    common = set.intersection(*(set(attachments.get(n, {})) for n in node_ids))
    if not common:
        return None
    return min(
        common,
        key=lambda f: (-min(attachments[n][f].rate_gbps for n in node_ids), f),
    )


async def _choose_fabric(
    conn: Connection,
    request: AllocationRequest,
    earlier: Sequence[ShardRecord],
    wanted: str | None,
) -> Rejection | _FabricChoice:
    node_ids = sorted({s.node_id for s in request.shards} | {s.node_id for s in earlier})
    if len(node_ids) == 1:
        # One node talks to no peer: no fabric to agree on, no adapters to hand out.
        return _FabricChoice(None, {})
    rows = await conn.execute(_FABRICS, {"ids": node_ids})
    attachments: dict[str, dict[str, _Attachment]] = defaultdict(dict)
    for r in rows:
        attachments[r.node_id][r.fabric] = _Attachment(tuple(r.hcas), r.rate_gbps)
    recorded = {s.fabric for s in earlier if s.fabric is not None}
    wanted = wanted or (min(recorded) if recorded else None)
    if wanted is not None:
        for node_id in node_ids:
            if wanted not in attachments.get(node_id, {}):
                return Rejection(
                    RejectionCode.FABRIC_MISMATCH,
                    f"node {shown(node_id)} is not on fabric {shown(wanted)}, which replica "
                    f"{shown(request.replica_id)} needs",
                    node_id=node_id,
                )
        fabric: str | None = wanted
    else:
        fabric = _fabric_rule(attachments, node_ids)
    if fabric is None:
        on = "; ".join(
            f"{shown(n)}: {', '.join(sorted(attachments.get(n, {}))) or 'none'}"
            for n in node_ids[:8]
        )
        more = f" and {len(node_ids) - 8} more" if len(node_ids) > 8 else ""
        return Rejection(
            RejectionCode.FABRIC_MISMATCH,
            f"the nodes of replica {shown(request.replica_id)} share no fabric ({on}{more}); "
            "a multi-node replica must sit on one fabric",
            node_id=node_ids[0],
        )
    return _FabricChoice(fabric, {n: attachments[n][fabric].hcas for n in node_ids})


async def allocate(
    conn: Connection,
    request: AllocationRequest,
    actor: str | None = None,
    *,
    fabric: str | None = None,
) -> Allocated | Rejection:
    """Hold every shard's GPUs, or none: a rejection leaves nothing written.

    `fabric` pins the fabric (place() passes the one it planned on); otherwise
    a multi-node replica gets the one its nodes share (see _fabric_rule).
    Runs in the caller's transaction; safe to call with the nodes already
    locked by it.
    """
    problem = validate_request(request)
    if problem is not None:
        return problem
    asked_nodes = {s.node_id for s in request.shards}
    params = {"ids": sorted(asked_nodes), "replica_id": request.replica_id}
    locked = {r.id: r for r in await conn.execute(_LOCK_FOR_REPLICA, params)}
    if len(asked_nodes) == 1 and set(locked) == asked_nodes and not _check_nodes(request, locked):
        # The common case, every shard on one ready node and no other node
        # in the replica: no fabric to choose, and the checks are made in the
        # store statement itself. Two round trips in all: the lock, the store.
        outcome = await _store(conn, request, _FabricChoice(None, {}), (), actor, check=True)
        if isinstance(outcome, Allocated):
            return outcome
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
        choice = await _choose_fabric(conn, request, earlier, fabric)
        if isinstance(choice, Rejection):
            return choice
        outcome = await _store(conn, request, choice, earlier, actor, check=False)
        if isinstance(outcome, Allocated):
            return outcome
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
    choice: _FabricChoice,
    earlier: Sequence[ShardRecord],
    actor: str | None,
    *,
    check: bool,
) -> Allocated | NotStored:
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
            "weights": request.weights,
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
    RETURNING shard_id, replica_id, node_id, gpu_indices
    """
)
_RELEASE_REPLICA = text(
    """
    DELETE FROM shards WHERE replica_id = :replica_id AND node_id = ANY(CAST(:nodes AS text[]))
    RETURNING shard_id, replica_id, node_id, gpu_indices
    """
)


async def _release(
    conn: Connection,
    lock_holders: Any,
    delete: Any,
    params: dict[str, Any],
    actor: str | None,
    reason: str | None,
) -> int:
    freed = 0
    # Lock first, then delete only on the locked nodes: the recount in
    # refresh_pools is exact only while no one else writes to the node. A
    # shard that appeared on another node meanwhile is found by the next pass.
    for _ in range(MAX_SHARDS + 1):
        node_ids = [r.id for r in await conn.execute(lock_holders, params)]
        if not node_ids:
            break
        released = list(await conn.execute(delete, {**params, "nodes": sorted(node_ids)}))
        await refresh_pools(conn, node_ids)
        for r in released:
            freed += len(r.gpu_indices)
            await record_event(
                conn,
                "released",
                node_id=r.node_id,
                replica_id=r.replica_id,
                shard_id=r.shard_id,
                actor=actor,
                reason=reason,
                detail={"gpuIndices": sorted(r.gpu_indices)},
            )
    return freed


async def release_shard(
    conn: Connection, shard_id: str, actor: str | None = None, reason: str | None = None
) -> int:
    """Free one shard's GPUs; how many were freed (0 when it was not allocated: not an error)."""
    return await _release(
        conn, _LOCK_SHARD_NODES, _RELEASE_SHARD, {"shard_id": shard_id}, actor, reason
    )


async def release_replica(
    conn: Connection, replica_id: str, actor: str | None = None, reason: str | None = None
) -> int:
    """Free every shard of a replica: replicas fail whole, so they are freed whole."""
    return await _release(
        conn, _LOCK_REPLICA_NODES, _RELEASE_REPLICA, {"replica_id": replica_id}, actor, reason
    )
