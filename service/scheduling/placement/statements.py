"""The SQL place() and explain() send: the candidate windows, the picks that lock, the claim, the survey.

Also the reads that run the candidate windows (candidates, spread_plan),
which both place() and explain() plan from.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import TextClause, text

from service.database.connections import Connection, cached_text
from service.database.plan_shapes import key_row, leading_key_is, ordered_walk
from service.node_states import state_reason_sql
from service.scheduling.allocations import (
    shard_columns,
    store_statement,
)
from service.scheduling.availability import (
    ADMITS_INTO,
    ADMITS_NONE,
    PoolOffer,
    gpu_last_resort,
    gpu_offered,
    node_schedulable,
    pool_offers,
    pool_reserves,
    pool_withholds,
)
from service.scheduling.freshness import gpu_facts_age, gpu_facts_fresh
from service.scheduling.gpu_pools import attached_fabrics, node_attachments
from service.scheduling.maintenance_rule import maintenance_json, maintenance_on
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import weights
from service.scheduling.placement.numa import numa_columns
from service.scheduling.placement.plan import Plan, plan_placement
from service.scheduling.ranking import flexibility_sql, order_sql
from service.scheduling.taints import last_resort_term_sql, tolerations_json
from service.scheduling.topology_fit import candidate_filters, claim_wanted, facts_column
from service.scheduling.verdicts import (
    MaintenanceFact,
    NodeFacts,
    TopologyFacts,
    WeightsCopy,
    WithholdingTaint,
    judge,
)


def fabrics_sql(node_id: str, prefix: str = "") -> str:
    """The node's fabrics by name and each one's link rate, in that order (NodeFacts.fabrics, fabric_rates)."""
    return attached_fabrics(node_attachments(node_id), prefix)


def node_facts(n: str) -> dict[str, str]:
    """The facts judge() reads of the node row `n` (of `nodes`), as SQL by column name.

    The one list every statement that reads candidates selects (NodeFacts;
    facts_of reads them back by these names), and where fit's survey takes
    those it reads (placement/fit.py).
    """
    return {
        "state": f"{n}.state",
        "state_reason": state_reason_sql(n),
        "local_disk_free": f"{n}.local_disk_free",
        "local_disk_total": f"{n}.local_disk_total",
        "knows_its_weights": f"{n}.knows_its_weights",
        "label_value": f"{n}.labels ->> CAST(:label_key AS text)",
        "gpus_facts_age": gpu_facts_age(n),
        "maintenance": maintenance_json(f"{n}.id"),
    }


def disk_fits(n: str) -> str:
    """SQL: the node row `n` has :min_disk bytes of local disk free, or does not say.

    Unknown disk is not a full disk (judge()'s DISK check says the same).
    """
    return f"({n}.local_disk_free IS NULL OR {n}.local_disk_free >= :min_disk)"


# The names node_facts gives, in its order.
NODE_FACTS = tuple(node_facts("n"))


def node_facts_sql(n: str) -> str:
    """SQL select list: node_facts of the node row `n`, each under its name."""
    return ", ".join(
        sql if sql == f"{n}.{name}" else f"{sql} AS {name}" for name, sql in node_facts(n).items()
    )


def _facts_sql(request: PlaceRequest, source: str) -> str:
    """The facts judge() reads of each pool `p` (with its node `n`) that `source` gives.

    `source` ends with the pool's FROM item, so the offer's LATERAL
    (availability.PoolOffer) can follow it.
    """
    offer = PoolOffer("p", request.tolerating, request.admitting)
    return f"""
    SELECT p.node_id, {offer.free} AS free, {offer.withheld} AS withheld,
           {offer.last_resort} AS last_resort, {offer.taint} AS taint,
           {offer.reserved} AS reserved, {node_facts_sql("n")},
           {weights.holds("p.node_id")} AS holds_weights,
           {weights.copy_of("p.node_id")} AS weights_copy,
           {fabrics_sql("p.node_id")},
           {facts_column(request, "p.node_id")} AS topology
    {source}{offer.join}
"""


def _facts_of_ranked(request: PlaceRequest) -> str:
    # Each ranked node's row by its key (service/database/plan_shapes.py): a
    # window of sixteen joined to nodes had every node hashed.
    return f"""
    SELECT c.node_id, c.free, c.withheld, c.last_resort, CAST(NULL AS json) AS taint,
           {node_facts_sql("n")}, c.holds_weights, c.weights_copy,
           {fabrics_sql("c.node_id")},
           {facts_column(request, "c.node_id")} AS topology
    FROM ranked c {key_row("nodes", "n", {"id": "c.node_id"})}
    ORDER BY {order_sql("c")}
"""


def _ranked_sql(request: PlaceRequest, drawn_first: bool = False) -> str:
    """The window: only nodes that pass every check, best first, at most :limit of them.

    Best: in service/scheduling/ranking.py's order (nodes that can take the
    replica without GPUs a PREFER_NO_SCHEDULE taint sends last, weight
    holders, the fewest free GPUs, the least flexible), then random among
    equals so concurrent callers spread out instead of queueing on one node.
    The best fit is read from ix_gpu_pools_fit (class, free, node id) in
    index order and stops after :scan rows that pass, so the cost follows the
    window, not the cluster; the random order is taken among those rows. The
    pools whose fit needs their last-resort GPUs come from
    ix_gpu_pools_last_resort in the same order, a branch of their own, so a
    node that does not need them is never crowded out of the window by one
    that does. Holders are found through the weights index. A node's own row
    is joined only for the constraints asked for and for the rows returned.
    judge() re-checks each row, so these filters and the verdicts cannot
    drift apart.

    With tolerations, a pool counts what it offers the request
    (availability.PoolOffer): pools without taints are read as above, and
    the pools a toleration could change are counted one by one: those with
    last-resort GPUs in best-fit order (ix_gpu_pools_last_resort), those
    with withheld GPUs in node order (ix_gpu_pools_withheld_class), :scan
    of each, ranked with the others in the window.

    Topology (service.scheduling.topology_fit) costs a look at a node's GPUs per node
    it checks. `drawn_first`: the window is drawn from the best :scan nodes
    as if there were no topology, and the check runs on them in the window's
    order until :limit pass, usually :limit checks instead of :scan. A
    window that comes back empty then proves nothing (the :scan nodes may
    all have failed the check), so the caller asks again without it.
    """
    topology = [] if drawn_first else candidate_filters(request)
    common = [
        "p.gpu_class = :cls",
        "p.node_id <> ALL(CAST(:skip AS text[]))",
        # judge() names the window (MAINTENANCE) where a survey reads the node.
        f"NOT {maintenance_on('p.node_id')}",
    ]
    if request.fabric is not None:
        common.append(
            "EXISTS (SELECT 1 FROM fabric_attachments fa"
            " WHERE fa.node_id = p.node_id AND fa.fabric = :fabric)"
        )
    node_checks = []
    if request.label is not None:
        node_checks.append(f"{node_facts('n')['label_value']} = :label_value")
    if request.min_local_disk_free is not None:
        node_checks.append(disk_fits("n"))
    if request.max_age is not None:
        node_checks.append(gpu_facts_fresh("n"))

    def node_row(checks: list[str]) -> list[str]:
        # One primary-key probe per row read, only when a node column is asked about.
        if not checks:
            return []
        return [f"EXISTS (SELECT 1 FROM nodes n WHERE n.id = p.node_id AND {' AND '.join(checks)})"]

    def pools(
        offers: str, offer: PoolOffer, source: str, where: list[str], columns: str, order: str
    ) -> str:
        """One branch: the pools `source` gives that pass, best first, at most :scan of them."""
        term = last_resort_term_sql(offer.free, offer.last_resort)
        # Topology last: evaluated only on rows that pass the cheap checks.
        conditions = [offers, *where, f"{offer.free} >= :need", *topology]
        return f"""
            SELECT p.node_id, {offer.free} AS free, {offer.withheld} AS withheld,
                   {offer.last_resort} AS last_resort, {term} AS last_resort_term, {columns}
            FROM {source}{offer.join}
            WHERE {" AND ".join(conditions)}
            {f"ORDER BY {order} " if order else ""}LIMIT :scan"""

    plain = PoolOffer("p", False)
    counted = PoolOffer("p", request.tolerating, request.admitting)
    by_fit = "p.free, p.node_id"
    by_rank = "last_resort_term, free, p.node_id"
    # (offers, offer, where, order) per branch of the nodes that hold no
    # weights. The pools that can take the request without their last-resort
    # GPUs, best fit first (a toleration can only add to them: the term is 0
    # either way); those that need them, from their own index; and, with
    # tolerations, the pools a taint withholds GPUs of, counted for the
    # request (every one of the class: what a toleration adds is known only
    # once counted).
    last = ["p.last_resort > 0", "p.free - p.last_resort < :need"]
    others: list[tuple[str, PoolOffer, list[str], str]]
    # The pools with withheld GPUs of the class, walked in node order on
    # ix_gpu_pools_withheld_class, a descent per pool (plan_shapes.ordered_walk):
    # a scan in best-fit order was the planner's to choose, and after ANALYZE
    # it read every pool of the class. Unsorted, the walk stops at :scan.
    walked = f"{pool_withholds('t')} AND {leading_key_is('t.gpu_class', ':cls')}"
    walk = ordered_walk("withheld_walk", "gpu_pools", "node_id", walked, "''", leading="gpu_class")
    withheld_pools = (
        f"(WITH RECURSIVE {walk} SELECT w.node_id FROM withheld_walk w"
        " WHERE w.node_id IS NOT NULL) wp"
        f" {key_row('gpu_pools', 'p', {'node_id': 'wp.node_id', 'gpu_class': ':cls'})}"
    )
    if request.admitting:
        # A request a reservation admits: every pool that may offer it a GPU,
        # counted one by one (PoolOffer), best fit first. Into a reservation,
        # only its nodes; with `until`, the pools with free, reserved or (with
        # tolerations) withheld GPUs.
        reach = [pool_offers("p"), pool_reserves("p")]
        if request.tolerating:
            reach.append(pool_withholds("p"))
        offers_any = f"({' OR '.join(reach)})"
        others = [(offers_any, counted, [], "free, p.node_id")]
    elif request.tolerating:
        others = [
            (
                pool_offers("p"),
                plain,
                ["p.withheld = 0", "p.free - p.last_resort >= :need"],
                by_fit,
            ),
            (pool_offers("p"), counted, ["p.withheld = 0", *last], by_fit),
            # In node order (walked: see withheld_pools), what a toleration
            # adds counted per pool read: usually :scan of them, however many
            # the class has. Ranked with the others in the window.
            (pool_withholds("p"), counted, [], ""),
        ]
        offers_any = f"({pool_offers('p')} OR {pool_withholds('p')})"
    else:
        others = [
            (pool_offers("p"), plain, ["p.free - p.last_resort >= :need"], by_fit),
            (pool_offers("p"), plain, last, by_fit),
        ]
        offers_any = pool_offers("p")

    branches = []
    other_checks = list(node_checks)
    if request.weights is not None:
        holders = [*common, weights.holder_filter(request), *node_row(node_checks)]
        branches.append(
            pools(
                offers_any,
                counted,
                "weights w JOIN gpu_pools p ON p.node_id = w.node_id AND w.path = :weights",
                holders,
                f"true AS holds_weights, {weights.copy_columns('w')}",
                by_rank,
            )
        )
        # The others: nodes that were not asked to look (and so hold no
        # weights at all), which constrain nothing. A node that looked and
        # lacks these weights is out.
        other_checks.append("NOT n.knows_its_weights")
    if request.weights is None or weights.others_allowed(request):
        rest = [*common, *node_row(other_checks)]
        columns = f"false AS holds_weights, {weights.NO_COPY}"
        for offers, offer, where, order in others:
            source = "gpu_pools p" if order else withheld_pools
            if request.admitting == ADMITS_INTO:
                source = (
                    "(SELECT DISTINCT r.node_id FROM gpus r"
                    " WHERE r.reservation = CAST(:reservation AS text)) rn"
                    f" {key_row('gpu_pools', 'p', {'node_id': 'rn.node_id', 'gpu_class': ':cls'})}"
                )
            branches.append(pools(offers, offer, source, [*where, *rest], columns, order))
    ranked = f"""
        SELECT r.* FROM (
            SELECT b.node_id, b.free, b.withheld, b.last_resort, b.last_resort_term,
                   b.holds_weights, b.weights_rank, b.weights_copy,
                   {flexibility_sql("b.node_id")} AS flexibility, random() AS tiebreak
            FROM ({" UNION ALL ".join(f"({branch})" for branch in branches)}) b) r
        ORDER BY {order_sql("r")}"""
    if drawn_first and candidate_filters(request):
        # OFFSET 0 keeps the check above the sort, where LIMIT stops it.
        checks = " AND ".join(candidate_filters(request, "d.node_id"))
        return f"SELECT d.* FROM ({ranked} OFFSET 0) d WHERE {checks} LIMIT :limit"
    return ranked + " LIMIT :limit"


def candidates_sql(request: PlaceRequest) -> str:
    """The window of candidates place() and explain() plan from: _ranked_sql's nodes with their facts.

    The SQL generated below looks like this: docs/internals/sql/scheduling.placement.statements/candidates_sql.plain.sql
    (every shape beside it).
    """
    return f"WITH ranked AS ({_ranked_sql(request)}) {_facts_of_ranked(request)}"


def pick_sql(request: PlaceRequest, drawn_first: bool) -> str:
    """The first statement of a one-node placement: its window, and its best free node locked.

    Also returns the replica's stored shards, so a retry is answered from
    the same statement; then nothing is locked. The best-ranked node of the
    window that no one else holds is locked (SKIP LOCKED with LIMIT 1 locks
    one row, trying them in rank order) and the others are left alone. The
    window comes back whole, so that when every node in it was held by
    someone else the caller knows which ones to wait for.

    This statement counts nothing: its snapshot was taken before the lock,
    and a claim on the node may have committed in between (see
    _REPLACE_REPORT in service/fleet/node_writes.py). The free GPUs are counted by the
    next statement, the claim (claim_statement).

    The SQL generated below looks like this: docs/internals/sql/scheduling.placement.statements/pick_sql.plain.sql
    (every shape beside it).
    """
    return f"""
    WITH stored AS (
        SELECT {shard_columns("s")}
        FROM shards s WHERE s.replica_id = :replica_id
    ), ranked AS ({_ranked_sql(request, drawn_first)}
    ), picked AS MATERIALIZED (
        SELECT n.id, c.free, c.withheld, c.last_resort, c.holds_weights, c.weights_rank,
               c.weights_copy, {node_facts_sql("n")}
        FROM ranked c JOIN nodes n ON n.id = c.node_id
        -- Re-checked on the row as locked: a node cordoned since the
        -- snapshot is passed over (and stays locked until commit). A taint
        -- since the snapshot is the claim's to see: it counts the node's
        -- GPUs afresh under the lock (availability.gpu_offered).
        WHERE {node_schedulable("n")} AND NOT EXISTS (SELECT 1 FROM stored)
        ORDER BY {order_sql("c")}
        LIMIT 1
        FOR NO KEY UPDATE OF n SKIP LOCKED
    )
    -- The window is read whole only when nothing was picked: picked's LIMIT 1
    -- reads ranked a row at a time, so a topology check (see _ranked_sql)
    -- usually runs on one node.
    SELECT CASE WHEN k.id IS NULL THEN
               (SELECT array_agg(c.node_id ORDER BY {order_sql("c")})
                FROM ranked c) END AS window_ids,
           k.id AS picked_node_id, k.free AS picked_free, k.withheld AS picked_withheld,
           k.last_resort AS picked_last_resort, CAST(NULL AS json) AS picked_taint,
           k.holds_weights AS picked_holds_weights,
           k.weights_copy AS picked_weights_copy,
           {", ".join(f"k.{name} AS picked_{name}" for name in NODE_FACTS)},
           CAST(NULL AS json) AS picked_topology,
           {fabrics_sql("k.id", "picked_")},
           st.shard_id, st.replica_id, st.node_id, st.gpu_indices, st.fabric, st.hcas,
           st.created_at, st.fence, st.generation, st.held_since, st.tenant, st.priority,
           st.deployment, st.borrowed
    FROM (SELECT 1) AS one
    LEFT JOIN picked k ON true
    LEFT JOIN stored st ON true
    ORDER BY st.shard_id
    """


def pick_several_sql(request: PlaceRequest) -> str:
    """pick_sql for several calls of one shape at once: up to :k of the window's best free nodes locked.

    For a batch of calls that differ only in replica id
    (service/scheduling/place_batches.py): one statement locks the nodes
    their claims go to, best first, SKIP LOCKED as pick_sql does, instead of
    one per call. Returns one row per locked node (in rank order; none when
    nothing was free) and, on every row, the replica ids among :replica_ids
    that have stored shards (those calls are answered by the one-call path).
    Like pick_sql it counts nothing: the claim (claim_statement) counts the
    nodes' free GPUs afresh under the lock, and with topology its fit order
    too (the window is drawn before the topology check, as pick_sql draws
    it).

    The SQL generated below looks like this: docs/internals/sql/scheduling.placement.statements/pick_several_sql.plain.sql
    (every shape beside it).
    """
    return f"""
    WITH ranked AS ({_ranked_sql(request, drawn_first=request.needs_topology)}
    ), picked AS MATERIALIZED (
        SELECT n.id, c.free, c.withheld, c.last_resort, c.last_resort_term, c.holds_weights,
               c.weights_rank, c.weights_copy, c.flexibility, c.tiebreak, {node_facts_sql("n")}
        FROM ranked c JOIN nodes n ON n.id = c.node_id
        WHERE {node_schedulable("n")}
        ORDER BY {order_sql("c")}
        LIMIT :k
        FOR NO KEY UPDATE OF n SKIP LOCKED
    )
    SELECT ARRAY(SELECT DISTINCT s.replica_id FROM shards s
                 WHERE s.replica_id = ANY(CAST(:replica_ids AS text[]))) AS stored_ids,
           k.id AS node_id, k.free, k.withheld, k.last_resort, CAST(NULL AS json) AS taint,
           k.holds_weights, k.weights_copy, {", ".join(f"k.{name}" for name in NODE_FACTS)},
           CAST(NULL AS json) AS topology, {fabrics_sql("k.id")}
    FROM (SELECT 1) AS one
    LEFT JOIN picked k ON true
    ORDER BY {order_sql("k")}
    """


def survey_sql(request: PlaceRequest) -> str:
    """The first :limit nodes of the class by id, with their facts (explainPlacement's verdicts).

    Walked in node order on the primary key, a descent per node, and each
    node's pool and row looked up by key (service/database/plan_shapes.py):
    as a join, before ANALYZE the planner guessed a handful of pools, sorted
    every pool of the class and looked each one's node up, for a page of a
    hundred.

    The SQL generated below looks like this: docs/internals/sql/scheduling.placement.statements/survey_sql.plain.sql
    (every shape beside it).
    """
    walk = ordered_walk("walk", "gpu_pools", "node_id", "t.gpu_class = :cls", "''")
    pool = key_row("gpu_pools", "p", {"node_id": "page.node_id", "gpu_class": ":cls"})
    node = key_row("nodes", "n", {"id": "page.node_id"})
    page = "(SELECT w.node_id FROM walk w WHERE w.node_id IS NOT NULL LIMIT :limit) page"
    return (
        f"WITH RECURSIVE {walk} "
        + _facts_sql(request, f"FROM {page} {pool} {node}")
        + " ORDER BY p.node_id"
    )


@lru_cache(maxsize=32)
def _cached_claim(
    nvlink_shards: bool,
    rail_aligned: bool,
    domain: bool,
    several: bool,
    tolerating: bool,
    admitting: str,
) -> TextClause:
    return store_statement(
        claim_wanted(nvlink_shards, rail_aligned, domain, several, tolerating, admitting)
    )


def claim_statement(request: PlaceRequest, several: bool) -> TextClause:
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

    The SQL generated below looks like this: docs/internals/sql/scheduling.placement.statements/claim_statement.plain.sql
    (every shape beside it).
    """
    return _cached_claim(
        request.nvlink_shards,
        request.rail_aligned,
        request.same_nvlink_domain,
        several,
        request.tolerating,
        request.admitting,
    )


SURVEY_COUNT = text("SELECT count(*) FROM gpu_pools WHERE gpu_class = :cls")
CLASSES = text("SELECT DISTINCT gpu_class FROM gpu_pools ORDER BY gpu_class LIMIT 20")

LOCK_OR_SKIP = text(
    """
    SELECT id FROM nodes WHERE id = ANY(CAST(:ids AS text[]))
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
    """
)


@lru_cache(maxsize=16)
def offered_indices_sql(tolerating: bool, node: str, admitting: str = ADMITS_NONE) -> str:
    """SQL: the GPUs of class :cls node `node` offers the request, in the order a claim takes them.

    Last-resort GPUs (a PREFER_NO_SCHEDULE taint the request does not
    tolerate) after the others, then by index: a shard takes them only when
    the rest do not suffice.
    """
    return f"""ARRAY(
        SELECT g.idx FROM gpus g
        WHERE g.node_id = {node} AND g.gpu_class = :cls
          AND {gpu_offered("g", tolerating, admitting)}
        ORDER BY {gpu_last_resort("g", tolerating)}, g.idx)"""


@lru_cache(maxsize=8)
def free_indices(tolerating: bool, admitting: str = ADMITS_NONE) -> TextClause:
    """Per node of :ids, offered_indices_sql: read on nodes this transaction has locked.

    The SQL generated below looks like this: docs/internals/sql/scheduling.placement.statements/free_indices.plain.sql
    (every shape beside it).
    """
    return text(
        f"""
        SELECT i.node_id, {offered_indices_sql(tolerating, "i.node_id", admitting)} AS indices
        FROM unnest(CAST(:ids AS text[])) AS i(node_id)
        """
    )


# The nodes of :ids no other transaction holds, locked, in one round trip with
# what a claim on them reads: whether each takes placement now (checked on
# the row as locked), the GPUs of class :cls it offers a request without
# tolerations (offered_indices_sql), those of them used last, and each GPU's NUMA node
# (numa.numa_columns). For placement groups' one-round claim
# (groups/claiming.claim_members): one round trip where there were three. The
# GPUs are read on the statement's snapshot, taken before the locks, so a
# claim on a node that committed in between is not seen: the store statement
# that follows checks every GPU afresh under the locks (a GPU held meanwhile
# writes nothing, and the caller plans again).
LOCK_WITH_GPUS_OR_SKIP = text(
    f"""
    WITH locked AS MATERIALIZED (
        SELECT n.id, {node_schedulable("n")} AS schedulable FROM nodes n
        WHERE n.id = ANY(CAST(:ids AS text[]))
        ORDER BY n.id
        FOR NO KEY UPDATE SKIP LOCKED
    )
    SELECT l.id, l.schedulable, {offered_indices_sql(False, "l.id")} AS indices,
           ARRAY(SELECT g.idx FROM gpus g
                 WHERE g.node_id = l.id AND g.gpu_class = :cls AND {gpu_offered("g")}
                   AND {gpu_last_resort("g")}) AS last_indices,
           {numa_columns("l.id")}
    FROM locked l
    """
)


REPLICA = text(
    f"SELECT {shard_columns('s')} FROM shards s WHERE s.replica_id = :replica_id"
    " ORDER BY s.shard_id"
)


# How many of the best candidates one statement returns for a one-node
# placement: enough that a crowd of concurrent callers finds an unlocked one.
WINDOW = 16
# A multi-node placement plans over the best nodes with room for a shard; only
# when those cannot hold it does it read every candidate, so that "no room"
# is never said because of the window.
SPREAD_WINDOW = 512
NO_LIMIT = 1_000_000


def scan_size(request: PlaceRequest, limit: int, drawn_first: bool = False) -> int:
    """How many of the best nodes a window of `limit` is drawn from.

    A one-node window is drawn at random from the best few times its size,
    so that concurrent callers spread out. With topology checked on every
    node read (service.scheduling.topology_fit.candidate_filters), from the best
    `limit` only; drawn before the check (see _ranked_sql), as usual.
    """
    if limit != WINDOW or (request.needs_topology and not drawn_first):
        return limit
    return limit * 4


def request_params(request: PlaceRequest) -> dict[str, Any]:
    return {
        "cls": request.gpu_class,
        "weights": request.weights,
        "label_key": request.label[0] if request.label else None,
        "label_value": request.label[1] if request.label else None,
        "fabric": request.fabric,
        "min_disk": request.min_local_disk_free,
        "per": request.gpus_per_shard,
        "max_age": request.max_age,
        "tolerations": tolerations_json(request.tolerations),
        "until": request.until,
        "reservation": request.reservation,
        "at": request.at,
    }


def facts_of(row: Any, prefix: str = "") -> NodeFacts:
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
        weights_copy=WeightsCopy.of(column("weights_copy")),
        fabrics=tuple(column("fabrics")),
        fabric_rates=tuple(column("fabric_rates")),
        label_value=column("label_value"),
        topology=TopologyFacts.of(column("topology")),
        gpus_facts_age=column("gpus_facts_age"),
        withheld=column("withheld"),
        taint=WithholdingTaint.of(column("taint")),
        last_resort=column("last_resort"),
        maintenance=MaintenanceFact.of(column("maintenance")),
        # Read by the survey (_facts_sql) only: a verdict's RESERVED.
        reserved=getattr(row, prefix + "reserved", 0),
    )


async def _fetch(
    conn: Connection, request: PlaceRequest, need: int, limit: int, skip: set[str]
) -> tuple[list[NodeFacts], bool]:
    """(the nodes that pass every check, best first; whether the limit cut the list)."""
    scan = scan_size(request, limit)
    params = {
        **request_params(request),
        "need": need,
        "limit": limit,
        "scan": scan,
        "skip": sorted(skip),
    }
    rows = list(await conn.execute(cached_text(candidates_sql(request)), params))
    facts = [f for f in (facts_of(r) for r in rows) if judge(f, request).fits]
    return facts, len(rows) >= limit


async def candidates(
    conn: Connection, request: PlaceRequest, skip: set[str] | None = None
) -> list[NodeFacts]:
    """A window of the best nodes that can take the whole replica; nodes in `skip` left out."""
    facts, _ = await _fetch(conn, request, request.gpus, WINDOW, skip or set())
    return facts


async def spread_plan(
    conn: Connection, request: PlaceRequest, skip: set[str] | None = None
) -> tuple[list[NodeFacts], Plan | None]:
    """A plan over nodes with room for one shard each, and the nodes it was made from."""
    facts: list[NodeFacts] = []
    for limit in (SPREAD_WINDOW, NO_LIMIT):
        facts, cut = await _fetch(conn, request, request.gpus_per_shard, limit, skip or set())
        plan = plan_placement(facts, request)
        if plan is not None or not cut:
            return facts, plan
    return facts, None


async def plan_now(conn: Connection, request: PlaceRequest) -> tuple[list[NodeFacts], Plan | None]:
    """Where place would put the replica on the fleet as it is now, and the nodes it planned from.

    One node if one takes it whole, else spread over one fabric (several
    shards). explain() answers from it, and preemption's trials ask it with
    their victims' shards gone (placement/preemption.py), so "it fits" means
    the same in both.
    """
    facts = await candidates(conn, request)
    plan = plan_placement(facts, request)
    if plan is None and request.shards > 1:
        facts, plan = await spread_plan(conn, request)
    return facts, plan
