"""place(): the service picks the GPUs for a replica and holds them in the same transaction.

How it packs: a replica goes on one node when one node has room for all its
shards, choosing the node that will be left with the fewest free GPUs (small
holes get filled, large holes stay open for large replicas). Otherwise its
shards spread over nodes of one fabric, smallest holes first, never splitting
a shard. Nodes that already hold the weights come before all others; among
equally good nodes the choice is random, so a crowd of schedulers asking for
the same class does not all queue on the same first node.

How it stays correct under concurrency: candidates are read from gpu_pools
(indexed by class; every check is in the SQL, so a one-node placement reads
a small window of the best nodes however large the cluster). The common case,
every shard on one node, is two statements: one checks the replica id, reads
the window and locks its best node that nobody else holds (FOR NO KEY UPDATE
SKIP LOCKED, LIMIT 1); the next, started under that lock, recounts the node's
free GPUs and holds them with the pools and events (allocations.
store_statement). A multi-node placement locks its planned nodes with SKIP
LOCKED and goes through allocate()'s checks. Both run inside a savepoint, so
a node found full or busy is let go at once.
"Unplaceable" is only said after a plan fails on committed data with no
candidate skipped: when candidates were busy, place() waits for their holders
to finish and looks again, so N concurrent calls on room for K replicas
place exactly K.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from sqlalchemy import TextClause, text

from service.database.connections import Connection, cached_text
from service.database.transactions import TransactionConflict
from service.fleet.reports import MAX_ID_LENGTH, MAX_PATH_LENGTH, MAX_TEXT_LENGTH
from service.scheduling.allocations import (
    MAX_GPUS_PER_SHARD,
    MAX_SHARDS,
    Allocated,
    AllocationRequest,
    NotStored,
    ShardRecord,
    ShardRequest,
    allocate,
    lock_nodes,
    shard_from_row,
    store_calls,
    store_statement,
)
from service.scheduling.availability import gpu_free, node_schedulable, pool_offers
from service.scheduling.rejections import Rejection, RejectionCode, invalid, shown
from service.scheduling.topology_fit import candidate_filters, claim_wanted, facts_column, fit_order
from service.scheduling.verdicts import NodeFacts, PlaceRequest, TopologyFacts, Verdict, judge

# Verdicts are listed for at most this many nodes (by id); the answer says
# how many more were considered, so it stays readable on a 10,000-node cluster.
MAX_VERDICTS = 100
# Each round either places, finds no room on committed data, or waited for
# another transaction to finish with a busy node; this bounds a pathological run.
MAX_ROUNDS = 64
SHARD_SUFFIX = "-s{}"
MAX_REPLICA_ID_LENGTH = MAX_ID_LENGTH - len(SHARD_SUFFIX.format(MAX_SHARDS))


@dataclass(frozen=True)
class Plan:
    fabric: str | None
    # (node id, number of shards on it), in the order shards are numbered.
    nodes: tuple[tuple[str, int], ...]
    # sameNvlinkDomain: the NVLink domain every shard is in.
    domain: str | None = None


@dataclass(frozen=True)
class Unplaceable:
    message: str
    verdicts: tuple[Verdict, ...]
    omitted: int


@dataclass(frozen=True)
class Explanation:
    placeable: bool
    message: str
    verdicts: tuple[Verdict, ...]
    omitted: int
    plan: Plan | None
    shard_ids: tuple[str, ...]


def shard_ids(request: PlaceRequest) -> list[str]:
    return [request.replica_id + SHARD_SUFFIX.format(i) for i in range(request.shards)]


def validate_place(request: PlaceRequest) -> Rejection | None:
    texts = [request.replica_id, request.gpu_class, request.fabric, request.weights]
    texts += list(request.label or ())
    if any(t is not None and "\x00" in t for t in texts):
        # PostgreSQL text cannot hold it; refuse it here rather than as a database error.
        return invalid("a text field contains a NUL character")
    if not request.replica_id:
        return invalid("replicaId is empty")
    if len(request.replica_id) > MAX_REPLICA_ID_LENGTH:
        return invalid(
            f"replicaId {shown(request.replica_id)!r} is longer than {MAX_REPLICA_ID_LENGTH} "
            "characters (its shard ids add a suffix)"
        )
    if not request.gpu_class or len(request.gpu_class) > MAX_TEXT_LENGTH:
        return invalid(f"gpuClass {shown(request.gpu_class)!r} is not a GPU class")
    if not 1 <= request.shards <= MAX_SHARDS:
        return invalid(f"shards={request.shards}: a replica has 1 to {MAX_SHARDS} shards")
    if not 1 <= request.gpus_per_shard <= MAX_GPUS_PER_SHARD:
        return invalid(
            f"gpusPerShard={request.gpus_per_shard}: a shard has 1 to {MAX_GPUS_PER_SHARD} GPUs"
        )
    if request.fabric is not None and not 1 <= len(request.fabric) <= MAX_ID_LENGTH:
        return invalid(f"fabric {shown(request.fabric)!r} is not a fabric name")
    if request.weights is not None and not 1 <= len(request.weights) <= MAX_PATH_LENGTH:
        return invalid(f"weights {shown(request.weights)!r} is not a path")
    if request.min_local_disk_free is not None and request.min_local_disk_free < 0:
        return invalid(f"minLocalDiskFree={request.min_local_disk_free} is negative")
    if request.label is not None and not request.label[0]:
        return invalid("label has an empty key")
    if request.rail_aligned and request.fabric is None:
        return invalid("railAligned needs fabric: the HCAs a shard is handed are on one fabric")
    return None


def _facts_sql(request: PlaceRequest) -> str:
    return f"""
    SELECT p.node_id, p.free, n.state,
           CASE WHEN n.state IN ('unreachable', 'lost') THEN n.liveness_reason
                ELSE n.admin_reason END AS state_reason,
           n.local_disk_free, n.local_disk_total, n.knows_its_weights,
           (CAST(:weights AS text) IS NOT NULL AND EXISTS (
               SELECT 1 FROM weights w WHERE w.node_id = p.node_id AND w.path = :weights
           )) AS holds_weights,
           ARRAY(SELECT fa.fabric FROM fabric_attachments fa
                 WHERE fa.node_id = p.node_id ORDER BY fa.fabric) AS fabrics,
           n.labels ->> CAST(:label_key AS text) AS label_value,
           {facts_column(request, "p.node_id")} AS topology
    FROM gpu_pools p JOIN nodes n ON n.id = p.node_id
"""


def _facts_of_ranked(request: PlaceRequest) -> str:
    return f"""
    SELECT c.node_id, c.free, n.state,
           CASE WHEN n.state IN ('unreachable', 'lost') THEN n.liveness_reason
                ELSE n.admin_reason END AS state_reason,
           n.local_disk_free, n.local_disk_total, n.knows_its_weights, c.holds_weights,
           ARRAY(SELECT fa.fabric FROM fabric_attachments fa
                 WHERE fa.node_id = c.node_id ORDER BY fa.fabric) AS fabrics,
           n.labels ->> CAST(:label_key AS text) AS label_value,
           {facts_column(request, "c.node_id")} AS topology
    FROM ranked c JOIN nodes n ON n.id = c.node_id
    ORDER BY c.holds_weights DESC, c.free, c.tiebreak
"""


def _ranked_sql(request: PlaceRequest, drawn_first: bool = False) -> str:
    """The window: only nodes that pass every check, best first, at most :limit of them.

    Best: weight holders, then the fewest free GPUs (packing), then random
    among equals so concurrent callers spread out instead of queueing on one
    node. The best fit is read from ix_gpu_pools_fit (class, free, node id) in
    index order and stops after :scan rows that pass, so the cost follows the
    window, not the cluster; the random order is taken among those rows.
    Holders are found through the weights index. A node's own row is joined
    only for the constraints asked for and for the rows returned. judge()
    re-checks each row, so these filters and the verdicts cannot drift apart.

    Topology (service.scheduling.topology_fit) costs a look at a node's GPUs per node
    it checks. `drawn_first`: the window is drawn from the best :scan nodes
    as if there were no topology, and the check runs on them in the window's
    order until :limit pass, usually :limit checks instead of :scan. A
    window that comes back empty then proves nothing (the :scan nodes may
    all have failed the check), so the caller asks again without it.
    """
    topology = candidate_filters(request)
    where = [
        "p.gpu_class = :cls",
        pool_offers("p"),
        "p.free >= :need",
        "p.node_id <> ALL(CAST(:skip AS text[]))",
        # Topology last: evaluated only on rows that pass the cheap checks.
        *([] if drawn_first else topology),
    ]
    if request.fabric is not None:
        where.append(
            "EXISTS (SELECT 1 FROM fabric_attachments fa"
            " WHERE fa.node_id = p.node_id AND fa.fabric = :fabric)"
        )
    node_checks = []
    if request.label is not None:
        node_checks.append("n.labels ->> CAST(:label_key AS text) = :label_value")
    if request.min_local_disk_free is not None:
        # Unknown disk is not a full disk.
        node_checks.append("(n.local_disk_free IS NULL OR n.local_disk_free >= :min_disk)")

    def node_row(checks: list[str]) -> list[str]:
        # One primary-key probe per row read, only when a node column is asked about.
        if not checks:
            return []
        return [f"EXISTS (SELECT 1 FROM nodes n WHERE n.id = p.node_id AND {' AND '.join(checks)})"]

    branches = []
    other_checks = list(node_checks)
    if request.weights is not None:
        holders = " AND ".join(where + node_row(node_checks))
        branches.append(
            f"""
            SELECT h.node_id, h.free, true AS holds_weights FROM (
                SELECT p.node_id, p.free
                FROM weights w JOIN gpu_pools p ON p.node_id = w.node_id
                WHERE w.path = :weights AND {holders}
                ORDER BY p.free, p.node_id LIMIT :scan) h"""
        )
        # The others: nodes that were not asked to look (and so hold no
        # weights at all), which constrain nothing. A node that looked and
        # lacks these weights is out.
        other_checks.append("NOT n.knows_its_weights")
    rest = " AND ".join(where + node_row(other_checks))
    branches.append(
        f"""
        SELECT o.node_id, o.free, false AS holds_weights FROM (
            SELECT p.node_id, p.free FROM gpu_pools p
            WHERE {rest}
            ORDER BY p.free, p.node_id LIMIT :scan) o"""
    )
    ranked = f"""
        SELECT b.node_id, b.free, b.holds_weights, random() AS tiebreak
        FROM ({" UNION ALL ".join(branches)}) b
        ORDER BY b.holds_weights DESC, b.free, tiebreak"""
    if drawn_first and topology:
        # OFFSET 0 keeps the check above the sort, where LIMIT stops it.
        checks = " AND ".join(candidate_filters(request, "d.node_id"))
        return f"SELECT d.* FROM ({ranked} OFFSET 0) d WHERE {checks} LIMIT :limit"
    return ranked + " LIMIT :limit"


def _candidates_sql(request: PlaceRequest) -> str:
    return f"WITH ranked AS ({_ranked_sql(request)}) {_facts_of_ranked(request)}"


def _pick_sql(request: PlaceRequest, drawn_first: bool) -> str:
    """The first statement of a one-node placement: its window, and its best free node locked.

    Also returns the replica's stored shards, so a retry is answered from
    the same statement; then nothing is locked. The best-ranked node of the
    window that no one else holds is locked (SKIP LOCKED with LIMIT 1 locks
    one row, trying them in rank order) and the others are left alone. The
    window comes back whole, so that when every node in it was held by
    someone else the caller knows which ones to wait for.

    This statement counts nothing: its snapshot was taken before the lock,
    and a claim on the node may have committed in between (see
    _REPLACE_REPORT in service/fleet/nodes.py). The free GPUs are counted by the
    next statement, the claim (_claim).
    """
    return f"""
    WITH stored AS (
        SELECT s.shard_id, s.replica_id, s.node_id, s.gpu_indices, s.fabric, s.hcas,
               s.created_at
        FROM shards s WHERE s.replica_id = :replica_id
    ), ranked AS ({_ranked_sql(request, drawn_first)}
    ), picked AS MATERIALIZED (
        SELECT n.id, c.free, c.holds_weights, n.state,
               CASE WHEN n.state IN ('unreachable', 'lost') THEN n.liveness_reason
                    ELSE n.admin_reason END AS state_reason,
               n.local_disk_free, n.local_disk_total, n.knows_its_weights,
               n.labels ->> CAST(:label_key AS text) AS label_value
        FROM ranked c JOIN nodes n ON n.id = c.node_id
        -- Re-checked on the row as locked: a node cordoned since the
        -- snapshot is passed over (and stays locked until commit).
        WHERE {node_schedulable("n")} AND NOT EXISTS (SELECT 1 FROM stored)
        ORDER BY c.holds_weights DESC, c.free, c.tiebreak
        LIMIT 1
        FOR NO KEY UPDATE OF n SKIP LOCKED
    )
    -- The window is read whole only when nothing was picked: picked's LIMIT 1
    -- reads ranked a row at a time, so a topology check (see _ranked_sql)
    -- usually runs on one node.
    SELECT CASE WHEN k.id IS NULL THEN
               (SELECT array_agg(c.node_id ORDER BY c.holds_weights DESC, c.free, c.tiebreak)
                FROM ranked c) END AS window_ids,
           k.id AS picked_node_id, k.free AS picked_free, k.holds_weights AS picked_holds_weights,
           k.state AS picked_state, k.state_reason AS picked_state_reason,
           k.local_disk_free AS picked_local_disk_free,
           k.local_disk_total AS picked_local_disk_total,
           k.knows_its_weights AS picked_knows_its_weights,
           k.label_value AS picked_label_value, CAST(NULL AS json) AS picked_topology,
           ARRAY(SELECT fa.fabric FROM fabric_attachments fa
                 WHERE fa.node_id = k.id ORDER BY fa.fabric) AS picked_fabrics,
           st.shard_id, st.replica_id, st.node_id, st.gpu_indices, st.fabric, st.hcas,
           st.created_at
    FROM (SELECT 1) AS one
    LEFT JOIN picked k ON true
    LEFT JOIN stored st ON true
    ORDER BY st.shard_id
    """


def _pick_several_sql(request: PlaceRequest) -> str:
    """_pick_sql for several calls of one shape at once: up to :k of the window's best free nodes locked.

    For a batch of calls that differ only in replica id (service/
    place_batches.py): one statement locks the nodes their claims go to,
    best first, SKIP LOCKED as _pick_sql does, instead of one per call.
    Returns one row per locked node (in rank order; none when nothing was
    free) and, on every row, the replica ids among :replica_ids that have
    stored shards (those calls are answered by the one-call path). Like
    _pick_sql it counts nothing: the claim (_claim) counts the nodes' free
    GPUs afresh under the lock, and with topology its fit order too (the
    window is drawn before the topology check, as _pick_sql draws it).
    """
    return f"""
    WITH ranked AS ({_ranked_sql(request, drawn_first=request.needs_topology)}
    ), picked AS MATERIALIZED (
        SELECT n.id, c.free, c.holds_weights, c.tiebreak, n.state,
               CASE WHEN n.state IN ('unreachable', 'lost') THEN n.liveness_reason
                    ELSE n.admin_reason END AS state_reason,
               n.local_disk_free, n.local_disk_total, n.knows_its_weights,
               n.labels ->> CAST(:label_key AS text) AS label_value
        FROM ranked c JOIN nodes n ON n.id = c.node_id
        WHERE {node_schedulable("n")}
        ORDER BY c.holds_weights DESC, c.free, c.tiebreak
        LIMIT :k
        FOR NO KEY UPDATE OF n SKIP LOCKED
    )
    SELECT ARRAY(SELECT DISTINCT s.replica_id FROM shards s
                 WHERE s.replica_id = ANY(CAST(:replica_ids AS text[]))) AS stored_ids,
           k.id AS node_id, k.free, k.holds_weights, k.state, k.state_reason,
           k.local_disk_free, k.local_disk_total, k.knows_its_weights, k.label_value,
           CAST(NULL AS json) AS topology,
           ARRAY(SELECT fa.fabric FROM fabric_attachments fa
                 WHERE fa.node_id = k.id ORDER BY fa.fabric) AS fabrics
    FROM (SELECT 1) AS one
    LEFT JOIN picked k ON true
    ORDER BY k.holds_weights DESC, k.free, k.tiebreak
    """


def _survey_sql(request: PlaceRequest) -> str:
    return _facts_sql(request) + " WHERE p.gpu_class = :cls ORDER BY p.node_id LIMIT :limit"


@lru_cache(maxsize=16)
def _claim_statement(
    nvlink_shards: bool, rail_aligned: bool, domain: bool, several: bool
) -> TextClause:
    return store_statement(claim_wanted(nvlink_shards, rail_aligned, domain, several))


def _claim(request: PlaceRequest, several: bool) -> TextClause:
    """The claim of one call on a locked node, or of `several` calls of the request's shape on locked nodes.

    topology_fit.claim_wanted: the second statement of a one-node
    placement, on the node the first one locked, and the one statement of a
    group's claims. The nodes' free GPUs of the class (in fit order, with
    topology), counted afresh (this statement started after the locks, so
    it sees every claim committed on the nodes, and none can commit until
    we do), handed out to the calls and their shards, and held with the
    pools and events in the same round trip. A call the nodes have no room
    for (a claim committed between the pick's snapshot and its lock)
    writes nothing.
    """
    return _claim_statement(
        request.nvlink_shards, request.rail_aligned, request.same_nvlink_domain, several
    )


_SURVEY_COUNT = text("SELECT count(*) FROM gpu_pools WHERE gpu_class = :cls")
_CLASSES = text("SELECT DISTINCT gpu_class FROM gpu_pools ORDER BY gpu_class LIMIT 20")

_LOCK_OR_SKIP = text(
    """
    SELECT id FROM nodes WHERE id = ANY(CAST(:ids AS text[]))
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
    """
)

_FREE_INDICES = text(
    f"""
    SELECT g.node_id, array_agg(g.idx ORDER BY g.idx) AS indices
    FROM gpus g
    WHERE g.node_id = ANY(CAST(:ids AS text[])) AND g.gpu_class = :cls AND {gpu_free("g")}
    GROUP BY g.node_id
    """
)

_REPLICA = text(
    "SELECT s.shard_id, s.replica_id, s.node_id, s.gpu_indices, s.fabric, s.hcas, s.created_at"
    " FROM shards s WHERE s.replica_id = :replica_id ORDER BY s.shard_id"
)


# How many of the best candidates one statement returns for a one-node
# placement: enough that a crowd of concurrent callers finds an unlocked one.
WINDOW = 16
# A multi-node placement plans over the best nodes with room for a shard; only
# when those cannot hold it does it read every candidate, so that "no room"
# is never said because of the window.
SPREAD_WINDOW = 512
NO_LIMIT = 1_000_000


def _scan(request: PlaceRequest, limit: int, drawn_first: bool = False) -> int:
    """How many of the best nodes a window of `limit` is drawn from.

    A one-node window is drawn at random from the best few times its size,
    so that concurrent callers spread out. With topology checked on every
    node read (service.scheduling.topology_fit.candidate_filters), from the best
    `limit` only; drawn before the check (see _ranked_sql), as usual.
    """
    if limit != WINDOW or (request.needs_topology and not drawn_first):
        return limit
    return limit * 4


def _params(request: PlaceRequest) -> dict[str, Any]:
    return {
        "cls": request.gpu_class,
        "weights": request.weights,
        "label_key": request.label[0] if request.label else None,
        "label_value": request.label[1] if request.label else None,
        "fabric": request.fabric,
        "min_disk": request.min_local_disk_free,
        "per": request.gpus_per_shard,
    }


def _facts(row: Any, prefix: str = "") -> NodeFacts:
    """A candidate's facts from a row; `prefix` names them in a row that holds other columns too."""

    def column(name: str) -> Any:
        return getattr(row, prefix + name)

    return NodeFacts(
        node_id=column("node_id"),
        state=column("state"),
        state_reason=column("state_reason"),
        free=column("free"),
        local_disk_free=column("local_disk_free"),
        local_disk_total=column("local_disk_total"),
        knows_its_weights=column("knows_its_weights"),
        holds_weights=column("holds_weights"),
        fabrics=tuple(column("fabrics")),
        label_value=column("label_value"),
        topology=TopologyFacts.of(column("topology")),
    )


async def _fetch(
    conn: Connection, request: PlaceRequest, need: int, limit: int, skip: set[str]
) -> tuple[list[NodeFacts], bool]:
    """(the nodes that pass every check, best first; whether the limit cut the list)."""
    scan = _scan(request, limit)
    params = {**_params(request), "need": need, "limit": limit, "scan": scan, "skip": sorted(skip)}
    rows = list(await conn.execute(cached_text(_candidates_sql(request)), params))
    facts = [f for f in (_facts(r) for r in rows) if judge(f, request).fits]
    return facts, len(rows) >= limit


async def candidates(
    conn: Connection, request: PlaceRequest, skip: set[str] | None = None
) -> list[NodeFacts]:
    """A window of the best nodes that can take the whole replica; nodes in `skip` left out."""
    facts, _ = await _fetch(conn, request, request.gpus, WINDOW, skip or set())
    return facts


async def spread_plan(
    conn: Connection, request: PlaceRequest, rng: random.Random, skip: set[str] | None = None
) -> tuple[list[NodeFacts], Plan | None]:
    """A plan over nodes with room for one shard each, and the nodes it was made from."""
    facts: list[NodeFacts] = []
    for limit in (SPREAD_WINDOW, NO_LIMIT):
        facts, cut = await _fetch(conn, request, request.gpus_per_shard, limit, skip or set())
        plan = plan_placement(facts, request, rng)
        if plan is not None or not cut:
            return facts, plan
    return facts, None


def plan_placement(
    facts: Sequence[NodeFacts], request: PlaceRequest, rng: random.Random
) -> Plan | None:
    """Where the shards would go on these nodes, or None when they do not fit."""
    fitting = [f for f in facts if judge(f, request).fits]
    wants_weights = request.weights is not None
    per_shard = request.gpus_per_shard

    def rank(f: NodeFacts) -> tuple[bool, int, float]:
        return (wants_weights and not f.holds_weights, f.free, rng.random())

    whole = [f for f in fitting if f.room(request) >= request.shards]
    if whole:
        best = min(whole, key=rank)
        return Plan(None, ((best.node_id, request.shards),), _domain_of(best, request))
    if request.shards == 1:
        return None
    # Spread over one fabric (and, sameNvlinkDomain, one NVLink domain).
    # Among those that can take the replica: the most shards on weight
    # holders, then the fewest nodes, then the least left over on the nodes
    # used, then the fabric's name and the domain's.
    fabrics = (
        [request.fabric] if request.fabric else sorted({x for f in fitting for x in f.fabrics})
    )
    domains: list[str | None] = [None]
    if request.same_nvlink_domain:
        domains = [*sorted({d for f in fitting if (d := _domain_of(f, request)) is not None})]
    best_plan: Plan | None = None
    best_key: tuple[int, int, int, str, str] | None = None
    for fabric, domain in ((f, d) for d in domains for f in fabrics):
        left = request.shards
        taken: list[tuple[str, int]] = []
        on_holders = leftover = 0
        members = (
            f
            for f in fitting
            if fabric in f.fabrics and (domain is None or _domain_of(f, request) == domain)
        )
        for f in sorted(members, key=rank):
            k = min(f.room(request), left)
            taken.append((f.node_id, k))
            left -= k
            leftover += f.free - k * per_shard
            on_holders += k if f.holds_weights else 0
            if left == 0:
                break
        if left:
            continue
        key = (-on_holders, len(taken), leftover, fabric, domain or "")
        if best_key is None or key < best_key:
            best_key, best_plan = key, Plan(fabric, tuple(taken), domain)
    return best_plan


def _domain_of(f: NodeFacts, request: PlaceRequest) -> str | None:
    return f.topology.domain if request.same_nvlink_domain and f.topology else None


async def _same_replica(conn: Connection, request: PlaceRequest) -> Allocated | Rejection | None:
    stored = [
        shard_from_row(r) for r in await conn.execute(_REPLICA, {"replica_id": request.replica_id})
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


class _Busy:
    def __init__(self, node_ids: set[str]) -> None:
        self.node_ids = node_ids


async def _try(
    conn: Connection, request: PlaceRequest, plan: Plan, actor: str | None
) -> Allocated | _Busy | None:
    """Lock the plan's nodes without waiting and allocate on them; None when the plan went stale."""
    node_ids = sorted({node_id for node_id, _ in plan.nodes})
    savepoint = await conn.begin_nested()
    try:
        got = {r.id for r in await conn.execute(_LOCK_OR_SKIP, {"ids": node_ids})}
        if len(got) < len(node_ids):
            # Rolling back the savepoint lets go of the nodes we did get.
            await savepoint.rollback()
            return _Busy(set(node_ids) - got)
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
        result = await allocate(
            conn, AllocationRequest(request.replica_id, tuple(shards)), actor, fabric=plan.fabric
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
    if not request.needs_topology:
        rows = await conn.execute(_FREE_INDICES, {"ids": node_ids, "cls": request.gpu_class})
        return {r.node_id: list(r.indices) for r in rows}, {}
    order = fit_order(
        request, "g.node_id = ANY(CAST(:ids AS text[]))", domain=plan.domain is not None
    )
    params = {
        "ids": node_ids,
        "cls": request.gpu_class,
        "per": request.gpus_per_shard,
        "fabric": plan.fabric,
        "domain": plan.domain,
    }
    free: dict[str, list[int]] = {}
    near: dict[tuple[str, int], list[str]] = {}
    for r in await conn.execute(cached_text(f"{order} ORDER BY 1, 4"), params):
        free.setdefault(r.node_id, []).append(r.idx)
        near[(r.node_id, r.idx)] = list(r.hcas)
    return free, near


async def _wait_for(conn: Connection, node_ids: set[str]) -> None:
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
    rng: random.Random | None = None,
) -> Allocated | Unplaceable | Rejection:
    """Pick GPUs for the replica and hold them, in the caller's transaction.

    Answers Allocated (also for a retry of a place that already succeeded),
    Unplaceable with per-node verdicts when there is no room on committed
    data, or a Rejection for bad input or a replica id already in use.
    """
    problem = validate_place(request)
    if problem is not None:
        return problem
    rng = rng or random.Random()
    for _ in range(MAX_ROUNDS):
        busy: set[str] = set()
        # Every round starts with the one-node look, which checks the replica
        # id first: a concurrent place of the same replica may have committed
        # while this one waited.
        outcome = await _place_on_one_node(conn, request, actor, busy)
        if outcome is None and request.shards > 1:
            outcome = await _spread(conn, request, actor, rng, busy)
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
            if request.shards > 1:
                facts, _ = await spread_plan(conn, request, rng)
            else:
                facts = await candidates(conn, request)
            return await unplaceable(conn, request, facts)
        await _wait_for(conn, busy)
    raise TransactionConflict(MAX_ROUNDS)


async def place_without_waiting(
    conn: Connection, request: PlaceRequest, actor: str | None = None
) -> Allocated | Rejection | None:
    """place()'s one-node look, in the caller's transaction, never waiting for another's lock.

    For a transaction that holds claims of other callers (service/
    place_batches.py): it may lock nodes but must not wait for a lock while
    holding them, so whatever place() would wait or plan further for (every
    node of the window held by others, no room on one node, a conflict) is
    None, and the caller runs place() in a transaction of its own. Answers
    Allocated, or a Rejection (bad input, or the replica id holding other
    shards) exactly as place() would.

    Without savepoints (two round trips fewer per claim): a node locked and
    then found full stays locked until the batch commits, which is safe
    because this never waits (see _place_on_one_node). An exception leaves
    the transaction unusable: the caller must roll it back whole.
    """
    problem = validate_place(request)
    if problem is not None:
        return problem
    outcome = await _place_on_one_node(conn, request, actor, set(), savepoints=False)
    if isinstance(outcome, Allocated | Rejection):
        return outcome
    return None


def same_shape(request: PlaceRequest) -> PlaceRequest | None:
    """What calls placed together by place_several_without_waiting share: all but the replica id.

    None for a request that goes one by one: invalid input.
    """
    if validate_place(request) is not None:
        return None
    return replace(request, replica_id="")


async def place_several_without_waiting(
    conn: Connection, calls: Sequence[tuple[PlaceRequest, str | None]]
) -> tuple[list[Allocated | Rejection | None], list[str | None]]:
    """place_without_waiting for several calls of one shape (same_shape): one pick and one claim for all.

    One statement locks up to one node per call (best first, SKIP LOCKED);
    one claim statement (_claim) then counts those nodes' free GPUs afresh
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
        **_params(shape),
        "need": shape.gpus,
        "limit": WINDOW,
        "scan": _scan(shape, WINDOW, drawn_first=shape.needs_topology),
        "skip": [],
        "k": len(calls),
        "replica_ids": [r.replica_id for r, _ in calls],
    }
    rows = list(await conn.execute(cached_text(_pick_several_sql(shape)), params))
    stored = set(rows[0].stored_ids)
    # (node id, how many claims its snapshot says it takes), best first.
    # Topology is left to the claim, as in _try_one_node: the count is an
    # upper bound then, and the claim takes what the node has.
    untopological = _without_topology(shape)
    room = [
        (r.node_id, r.free // shape.gpus)
        for r in rows
        if r.node_id is not None and judge(_facts(r), untopological).fits
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
    claimed: dict[int, Allocated | NotStored] = {}
    if together and room:
        claimed = await claim_calls(conn, shape, [calls[i] for i in together], room)
    answers: list[Allocated | Rejection | None] = []
    why: list[str | None] = []
    for i, (request, actor) in enumerate(calls):
        if i in apart:
            why.append(apart[i])
        elif isinstance(claim := claimed.get(together.index(i)), Allocated):
            answers.append(claim)
            why.append(None)
            continue
        else:
            # Not answered: no room left on the locked nodes; NotStored: its
            # shard ids or a GPU were taken meanwhile (the one-call path reads whose).
            why.append("no_room" if claim is None else "conflict")
        answers.append(await place_without_waiting(conn, request, actor))
    return answers, why


async def claim_calls(
    conn: Connection,
    shape: PlaceRequest,
    calls: Sequence[tuple[PlaceRequest, str | None]],
    room: Sequence[tuple[str, int]],
) -> dict[int, Allocated | NotStored]:
    """One claim (_claim) for calls of `shape` on nodes this transaction has locked, best first.

    `room`: (node id, at most how many calls it takes). Answers by the
    call's position in `calls`; a call the nodes had no room for is absent.
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
        }
    else:
        params = {
            "node_ids": [node_id for node_id, _ in room],
            "caps": [cap for _, cap in room],
            "replica_ids": [r.replica_id for r, _ in calls],
            "actors": [actor for _, actor in calls],
            "names": [name for r, _ in calls for name in shard_ids(r)],
            "shards": shape.shards,
        }
    several = "node_ids" in params
    params |= {"cls": shape.gpu_class, "need": shape.gpus, "per": shape.gpus_per_shard, **topology}
    answers = await store_calls(conn, _claim(shape, several), params)
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
    _pick_sql's snapshot and its lock) or lose its shard ids to a concurrent
    retry; only rolling back to a savepoint taken before the lock lets go of
    that node. Kept until commit instead, it would be held while place()
    waits for busy nodes (see _wait_for), and two schedulers each keeping a
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
            outcome = await _try_one_node(conn, request, actor, busy | full, drawn_first)
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
        outcome = await _try_one_node(conn, request, actor, skip, drawn_first)
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
    conn: Connection, request: PlaceRequest, actor: str | None, skip: set[str], drawn_first: bool
) -> Allocated | Rejection | _Window | _NoUse | _Conflict:
    params = {
        **_params(request),
        "replica_id": request.replica_id,
        "need": request.gpus,
        "limit": WINDOW,
        "scan": _scan(request, WINDOW, drawn_first),
        "skip": sorted(skip),
    }
    rows = list(await conn.execute(cached_text(_pick_sql(request, drawn_first)), params))
    head = rows[0]
    if head.shard_id is not None:
        answer = _answer_stored(request, [shard_from_row(r) for r in rows])
        assert answer is not None
        return answer
    if head.picked_node_id is None:
        return _Window(tuple(head.window_ids or ()))
    facts = _facts(head, prefix="picked_")
    # judge() re-checks the row, so the SQL filters and the verdicts cannot
    # drift apart into a placement the verdicts would call unfit. Topology
    # is left to the claim, which counts the node's fit order (and its
    # domain) under the lock and holds nothing when it falls short.
    if not judge(facts, _without_topology(request)).fits:
        return _NoUse(head.picked_node_id)
    outcome = await _claim_on(conn, request, actor, head.picked_node_id)
    if isinstance(outcome, Allocated):
        return outcome
    if not outcome.checked:
        return _NoUse(head.picked_node_id)
    return _CONFLICT


def _without_topology(request: PlaceRequest) -> PlaceRequest:
    """The request as judge() checks a picked node: its topology is the claim's to check."""
    return replace(request, nvlink_shards=False, same_nvlink_domain=False, rail_aligned=False)


async def _claim_on(
    conn: Connection, request: PlaceRequest, actor: str | None, node_id: str
) -> Allocated | NotStored:
    """The claim (_claim) of every shard on one node this transaction has locked."""
    outcome = (await claim_calls(conn, request, [(request, actor)], [(node_id, 1)])).get(0)
    return NotStored(checked=False) if outcome is None else outcome


async def _spread(
    conn: Connection,
    request: PlaceRequest,
    actor: str | None,
    rng: random.Random,
    busy: set[str],
) -> Allocated | _Conflict | None:
    """Shards over several nodes of one fabric; None when they do not fit (see `busy`)."""
    while True:
        _, plan = await spread_plan(conn, request, rng, skip=busy)
        if plan is None:
            return None
        outcome = await _try(conn, request, plan, actor)
        if isinstance(outcome, Allocated):
            return outcome
        if outcome is None:
            # What we read changed before we locked (or the replica id was
            # taken meanwhile): start the round over, which checks both.
            return _CONFLICT
        busy |= outcome.node_ids


async def _verdicts(conn: Connection, request: PlaceRequest) -> tuple[tuple[Verdict, ...], int]:
    rows = await conn.execute(
        cached_text(_survey_sql(request)), {**_params(request), "limit": MAX_VERDICTS}
    )
    verdicts = tuple(judge(_facts(r), request) for r in rows)
    total = (await conn.execute(_SURVEY_COUNT, {"cls": request.gpu_class})).scalar_one()
    return verdicts, max(0, int(total) - len(verdicts))


def _shape(request: PlaceRequest) -> str:
    shards = "1 shard" if request.shards == 1 else f"{request.shards} shards"
    return f"{shards} of {request.gpus_per_shard} {request.gpu_class}"


async def _why_not(
    conn: Connection,
    request: PlaceRequest,
    facts: Sequence[NodeFacts],
    considered: int,
) -> str:
    if considered == 0:
        classes = [r.gpu_class for r in await conn.execute(_CLASSES)]
        known = f"; classes here: {', '.join(classes)}" if classes else "; no GPUs are registered"
        return f"no node has {shown(request.gpu_class)} GPUs{known}"
    fitting = [f for f in facts if judge(f, request).fits]
    nodes = "node" if considered == 1 else "nodes"
    if request.shards == 1 or not fitting:
        return (
            f"no node has room for a shard of {request.gpus_per_shard} {request.gpu_class} "
            f"that meets every constraint ({considered} {nodes} with {request.gpu_class} considered)"
        )
    by_fabric = {
        fabric: sum(f.room(request) for f in fitting if fabric in f.fabrics)
        for fabric in sorted({x for f in fitting for x in f.fabrics})
        if request.fabric is None or fabric == request.fabric
    }
    if by_fabric:
        fabric, most = min(by_fabric.items(), key=lambda item: (-item[1], item[0]))
        best = f"at most {most} fit on fabric {fabric}"
    else:
        best = "the nodes with room share no fabric"
    return (
        f"{_shape(request)} fit on no single node, and no fabric has room for all of them: {best}"
    )


async def unplaceable(
    conn: Connection,
    request: PlaceRequest,
    facts: Sequence[NodeFacts],
) -> Unplaceable:
    verdicts, omitted = await _verdicts(conn, request)
    message = await _why_not(conn, request, facts, len(verdicts) + omitted)
    if omitted:
        message += f" (verdicts for the first {len(verdicts)} nodes by id; {omitted} more)"
    return Unplaceable(message, verdicts, omitted)


async def explain(
    conn: Connection, request: PlaceRequest, rng: random.Random | None = None
) -> Explanation | Rejection:
    """What place() would answer now, without locking or writing anything."""
    problem = validate_place(request)
    if problem is not None:
        return problem
    rng = rng or random.Random()
    facts = await candidates(conn, request)
    plan = plan_placement(facts, request, rng)
    if plan is None and request.shards > 1:
        facts, plan = await spread_plan(conn, request, rng)
    if plan is None:
        why = await unplaceable(conn, request, facts)
        return Explanation(False, why.message, why.verdicts, why.omitted, None, ())
    verdicts, omitted = await _verdicts(conn, request)
    where = ", ".join(f"{n} ({k})" if k > 1 else n for n, k in plan.nodes)
    on = f" on fabric {plan.fabric}" if plan.fabric else ""
    if plan.domain is not None:
        on += f" in NVLink domain {plan.domain}"
    message = f"would place {_shape(request)} on {where}{on}"
    return Explanation(True, message, verdicts, omitted, plan, tuple(shard_ids(request)))
