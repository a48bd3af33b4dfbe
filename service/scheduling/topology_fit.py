"""Which GPUs a topology-constrained shard may take, written once as SQL for every statement of place().

One ordering answers every question place() asks about a node's topology:
the node's free GPUs that the request may use (nvlinkShards: with a known
NVLink group; railAligned: with a near HCA on the fabric), in best-fit order.
Groups with fewer usable GPUs than a shard are left out, and so are the
GPUs of a group beyond its last whole shard; the rest are ordered by their
group's size, smallest first (best fit: a 2-GPU shard takes a free pair
before it breaks into an 8-GPU NVSwitch board), then by group and index.
So consecutive runs of gpusPerShard GPUs each lie in one group:

- the candidate filter asks whether the node has `need` of them (room(),
  which counts them without ordering),
- the claim holds the first `need`, shard k taking positions k*per...,
- the multi-node path reads them per node and cuts them the same way,
- the facts behind the verdicts count them (service.scheduling.verdicts.TopologyFacts).

Without nvlinkShards every usable GPU is in one group (0), which leaves the
order by index: placement as before, restricted to rail-aligned GPUs.

sameNvlinkDomain is a fact of the node: the one domain its GPUs of the class
report (a GB200 tray is in one clique), NULL when they report none or
disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from functools import lru_cache

from service.scheduling.allocations.storing import Rows, Wanted
from service.scheduling.availability import (
    ADMITS_INTO,
    ADMITS_NONE,
    ADMITS_UNTIL,
    gpu_last_resort,
    gpu_offered,
    shared_nvlink_domain,
)
from service.scheduling.place_request import PlaceRequest
from service.scheduling.taints import Toleration, stored_tolerations
from service.scheduling.tenancy.charges import CHARGE_FIELDS

# Stands for "the request has tolerations" where only that shapes the SQL
# (the tolerations themselves are the :tolerations parameter).
TOLERATING = (Toleration("any"),)
# (until, reservation) of a stand-in request that admits as `admitting` does
# (PlaceRequest.admitting): the SQL reads :until and :reservation, not these.
ADMITTING: dict[str, tuple[datetime | None, str | None]] = {
    ADMITS_NONE: (None, None),
    ADMITS_UNTIL: (datetime.max.replace(tzinfo=UTC), None),
    ADMITS_INTO: (None, "any"),
}


def _usable(request: PlaceRequest, nodes: str, domain: bool) -> str:
    """Free GPUs of :cls on the nodes `nodes` selects (a condition on g.node_id) that the request may use.

    Columns: node_id, idx, grp (the NVLink group, or 0), hcas (the GPU's
    near HCAs on :fabric, for railAligned; empty otherwise), lr (used last:
    availability.gpu_last_resort). Offered as availability.gpu_offered says
    (with the request's :tolerations when it has some).
    """
    join = ""
    where = [nodes, "g.gpu_class = :cls", gpu_offered("g", request.tolerating, request.admitting)]
    hcas = "CAST('{}' AS text[])"
    if request.nvlink_shards:
        where.append("g.nvlink_group IS NOT NULL")
    if request.rail_aligned:
        join = "JOIN fabric_attachments fa ON fa.node_id = g.node_id AND fa.fabric = :fabric"
        where.append("g.near_hcas && fa.hcas")
        hcas = "ARRAY(SELECT h FROM unnest(g.near_hcas) h WHERE h = ANY(fa.hcas) ORDER BY h)"
    if domain:
        where.append("g.nvlink_domain = CAST(:domain AS text)")
    grp = "g.nvlink_group" if request.nvlink_shards else "0"
    last = gpu_last_resort("g", request.tolerating)
    return (
        f"SELECT g.node_id, g.idx, {grp} AS grp, {hcas} AS hcas, {last} AS lr FROM gpus g {join}"
        f" WHERE {' AND '.join(where)}"
    )


def fit_order(request: PlaceRequest, nodes: str, *, domain: bool = False) -> str:
    """The usable GPUs in best-fit order, whole shards only: rows (node_id, idx, hcas, k).

    k counts from 0 per node; GPUs k*per .. k*per+per-1 form one shard and
    lie in one group. Within a group, last-resort GPUs come after the others
    (and are the ones left out past its last whole shard). Parameters: :cls,
    :per, and :fabric for railAligned, :domain when `domain` (only GPUs of
    that NVLink domain), :tolerations for a request with tolerations.
    """
    return f"""
    SELECT f.node_id, f.idx, f.hcas,
           row_number() OVER (PARTITION BY f.node_id ORDER BY f.n, f.grp, f.lr, f.idx) - 1 AS k
    FROM (SELECT u.node_id, u.idx, u.grp, u.hcas, u.lr,
                 row_number() OVER (PARTITION BY u.node_id, u.grp ORDER BY u.lr, u.idx) - 1 AS r,
                 count(*) OVER (PARTITION BY u.node_id, u.grp) AS n
          FROM ({_usable(request, nodes, domain)}) u) f
    WHERE f.r < f.n / :per * :per"""


def room(request: PlaceRequest, node: str) -> str:
    """How many whole shards the node's usable GPUs make: the fit order's length over :per.

    Counted without ordering anything (one aggregate over the node's few
    GPUs): the candidate filter runs it for every node it reads.
    """
    return f"""(SELECT coalesce(sum(c.n / :per), 0) FROM (
        SELECT count(*) AS n FROM ({_usable(request, f"g.node_id = {node}", False)}) u
        GROUP BY u.grp) c)"""


def node_domain(node: str) -> str:
    """The node's NVLink domain for GPUs of :cls: the one they all report, else NULL."""
    return (
        f"(SELECT {shared_nvlink_domain('g')}"
        f" FROM gpus g WHERE g.node_id = {node} AND g.gpu_class = :cls)"
    )


def candidate_filters(request: PlaceRequest, node: str = "p.node_id") -> list[str]:
    """Conditions that the topology of the node `node` names can take :need GPUs."""
    if not request.needs_topology:
        return []
    filters = [f"{room(request, node)} * :per >= :need"]
    if request.same_nvlink_domain:
        filters.append(f"{node_domain(node)} IS NOT NULL")
    return filters


def facts_column(request: PlaceRequest, node: str, pool: str | None = None) -> str:
    """The node's topology facts as one JSON value (service.scheduling.verdicts.TopologyFacts.of), or NULL.

    NULL when the request needs no topology: those statements pay nothing.
    `pool`: the alias of the node's gpu_pools row for :cls, when the statement
    reads it; nvlinkShards alone then reads the free NVLink groups from its
    summary (free_groups, nvlink_known: availability.pool_counts) instead of
    the node's GPUs, so fit walks pools (issue 39: fit with nvlinkShards read
    every candidate's GPUs, 1.5 s at 100k nodes).
    """
    if not request.needs_topology:
        return "CAST(NULL AS json)"
    if pool is not None and pooled(request):
        return pool_facts(f"{pool}.free_groups", f"{pool}.nvlink_known")
    known = ["true"]
    if request.nvlink_shards:
        known.append("g.nvlink_peers IS NOT NULL")
    if request.rail_aligned:
        known.append("g.near_hcas IS NOT NULL")
    offered = gpu_offered("g", request.tolerating, request.admitting)
    free = f"g.node_id = {node} AND g.gpu_class = :cls AND {offered}"
    groups = "CAST('{}' AS bigint[])"
    usable = f"{room(request, node)} * :per"
    if request.nvlink_shards:
        # The free GPUs of each NVLink group: the rows _usable gives for
        # nvlinkShards, before any rail condition.
        grouped = _usable(replace(request, rail_aligned=False), f"g.node_id = {node}", False)
        groups = f"ARRAY(SELECT count(*) FROM ({grouped}) u GROUP BY u.grp ORDER BY 1 DESC)"
        if not request.rail_aligned:
            # Then the usable GPUs are exactly the grouped ones, so room() is
            # the groups' whole shards: counted from the array instead of a
            # second read of the node's GPUs (fit reads every node of the class).
            usable = "(SELECT coalesce(sum(x / :per), 0) FROM unnest(t.groups) x) * :per"
    unaligned = (
        f"""ARRAY(SELECT g.idx FROM gpus g
                  LEFT JOIN fabric_attachments fa ON fa.node_id = g.node_id AND fa.fabric = :fabric
                  WHERE {free} AND NOT coalesce(g.near_hcas && fa.hcas, false) ORDER BY g.idx)"""
        if request.rail_aligned
        else "CAST('{}' AS int[])"
    )
    domain = node_domain(node) if request.same_nvlink_domain else "CAST(NULL AS text)"
    # OFFSET 0 keeps t a subquery of its own: pulled up, t.groups would be
    # written out, and so read, once per use.
    return f"""(SELECT json_build_object(
        'known', EXISTS (SELECT 1 FROM gpus g WHERE g.node_id = {node} AND g.gpu_class = :cls
                         AND {" AND ".join(known)}),
        'groups', t.groups,
        'usable', {usable},
        'unaligned', {unaligned},
        'domain', {domain})
      FROM (SELECT {groups} AS groups OFFSET 0) t)"""


def pooled(request: PlaceRequest) -> bool:
    """Whether a pool's summary (free_groups, nvlink_known) holds the request's topology facts."""
    # A request with tolerations is offered withheld GPUs too, which the
    # summary (of the free ones) leaves out: it reads the GPUs.
    return (
        request.nvlink_shards
        and not request.rail_aligned
        and not request.same_nvlink_domain
        and not request.tolerating
        and not request.admitting
    )


def pool_facts(free_groups: str, known: str) -> str:
    """facts_column for nvlinkShards alone, from a pool's summary: the same JSON, no GPU read.

    `free_groups` and `known`: the pool's free_groups and nvlink_known (or
    columns holding them). The grouped GPUs are _usable's for nvlinkShards
    (free, in an NVLink group), counted per group; room is their whole shards.
    """
    return f"""(SELECT json_build_object(
        'known', {known},
        'groups', t.groups,
        'usable', (SELECT coalesce(sum(x / :per), 0) FROM unnest(t.groups) x) * :per,
        'unaligned', CAST('{{}}' AS int[]),
        'domain', CAST(NULL AS text))
      FROM (SELECT ARRAY(SELECT count(*) FROM unnest({free_groups}) x WHERE x IS NOT NULL
                         GROUP BY x ORDER BY 1 DESC) AS groups OFFSET 0) t)"""


def claim_order(
    nvlink_shards: bool, rail_aligned: bool, nodes: str, tolerating: bool, admitting: str = ""
) -> str:
    """The order a claim takes the offered GPUs of the nodes `nodes` selects: rows (node_id, idx, hcas, k).

    The fit order (fit_order) with topology; without, the offered GPUs
    (availability.gpu_offered) with the last-resort ones last, then by
    index, which is the fit order of one group (whole shards only changes
    nothing there: a claim takes whole shards from the front).
    `tolerating`: the :tolerations parameter is the request's; `admitting`:
    the reserved GPUs it may use (availability.gpu_admitted: :until,
    :reservation).
    """
    request = PlaceRequest(
        "",
        "",
        1,
        nvlink_shards=nvlink_shards,
        rail_aligned=rail_aligned,
        tolerations=TOLERATING if tolerating else (),
        until=ADMITTING[admitting][0],
        reservation=ADMITTING[admitting][1],
    )
    if request.needs_topology:
        return fit_order(request, nodes)
    return f"""
        SELECT g.node_id, g.idx, CAST('{{}}' AS text[]) AS hcas,
               row_number() OVER (
                   PARTITION BY g.node_id ORDER BY {gpu_last_resort("g", tolerating)}, g.idx
               ) - 1 AS k
        FROM gpus g WHERE {nodes} AND g.gpu_class = :cls
          AND {gpu_offered("g", tolerating, admitting)}"""


def _claimed_shards(
    replica_id: str, actor: str, source: str, rail_aligned: bool, charge: Mapping[str, str]
) -> Rows:
    """want_shards of a claim: its GPUs (want_gpus) grouped by shard, for the caller's replica,
    actor and charge (tenancy.charges.CHARGE_FIELDS' columns)."""
    hcas = (
        """ARRAY(SELECT DISTINCT h FROM want_gpus v, unnest(v.hcas) h
                     WHERE v.shard_id = w.shard_id ORDER BY h)"""
        if rail_aligned
        else "CAST('{}' AS text[])"
    )
    return Rows(
        {
            "call": "w.call",
            "replica_id": replica_id,
            "actor": actor,
            "shard_id": "w.shard_id",
            "node_id": "w.node_id",
            "gpu_indices": "array_agg(w.idx ORDER BY w.idx)",
            "fabric": "CAST(:fabric AS text)" if rail_aligned else "CAST(NULL AS text)",
            "hcas": hcas,
            "weights": "CAST(:weights AS text)",
            "tolerations": stored_tolerations(),
            "until": "CAST(:until AS timestamptz)",
            "reservation": "CAST(:reservation AS text)",
            **charge,
        },
        source,
    )


@lru_cache(maxsize=32)
def claim_wanted(
    nvlink_shards: bool,
    rail_aligned: bool,
    same_domain: bool,
    several: bool,
    tolerating: bool,
    admitting: str = "",
) -> Wanted:
    """What a claim gives allocations.store_statement: calls of one shape, on locked nodes.

    One call on one node (`several` false): parameters :node_id,
    :replica_id, :actor, :names (its shard ids), :tenant, :priority and
    :deployment (its charge), :need, :per, :cls, and :fabric for railAligned. The call holds the first :need GPUs of the
    node's claim order (below), or nothing when there are fewer (go is
    false). Its call number is 1.

    Several (`several`), parameters: :node_ids, the nodes this transaction has locked for the
    calls, best first, and :caps, per node at most how many calls it takes
    (what the pick's snapshot counted); :replica_ids, :actors, :tenants,
    :priorities and :deployments, one per call, in the order calls are served; :names, the calls' shard ids,
    :shards of them per call, one call after another; :need, :per, :cls,
    and :fabric for railAligned.

    Per node, its free GPUs in claim order (the fit order, or without
    topology their index order, which is the fit order of one group),
    counted afresh under the lock. A node takes min(cap, GPUs // :need)
    calls (none, sameNvlinkDomain, when its GPUs are in no single domain);
    the calls fill the nodes in rank order, and the i-th call on a node
    holds positions i*:need and on (shard k of it: k*:per and on) and,
    railAligned, exactly its GPUs' near HCAs on :fabric. A call beyond the
    nodes' room gets no rows (no go row: the statement does not answer it).

    Why this is what the calls would hold made one by one, each counting
    afresh after the ones before: a call takes the first :need positions,
    whole shards, and the order of what is left is the rest of the order.
    Without topology that is plain; with it, the positions taken empty the
    smallest groups first and leave the last one touched smaller still, so
    it stays first, with its higher indices in the same order.
    tests/scheduling/test_group_claims.py checks it against one-by-one claims.

    The statement these CTEs make looks like this: docs/internals/sql/scheduling.placement.statements/claim_statement.plain.sql
    (every shape beside it).
    """
    if not several:
        # A call alone (most calls, when schedulers are few) pays for none
        # of the slots below: the statement plans only what one call needs.
        order = claim_order(
            nvlink_shards, rail_aligned, "g.node_id = CAST(:node_id AS text)", tolerating, admitting
        )
        domain = f"AND {node_domain('CAST(:node_id AS text)')} IS NOT NULL" if same_domain else ""
        return Wanted(
            steps=(("free", f"SELECT o.idx, o.hcas, o.k FROM ({order}) o WHERE o.k < :need"),),
            gpus=Rows(
                {
                    "call": "1",
                    "node_id": "CAST(:node_id AS text)",
                    "idx": "f.idx",
                    "hcas": "f.hcas",
                    "shard_id": "(CAST(:names AS text[]))[f.k / :per + 1]",
                },
                "FROM free f",
            ),
            shards=_claimed_shards(
                "CAST(:replica_id AS text)",
                "CAST(:actor AS text)",
                "FROM want_gpus w GROUP BY w.call, w.shard_id, w.node_id",
                rail_aligned,
                {c: f"CAST(:{c} AS {kind})" for c, kind in CHARGE_FIELDS.items()},
            ),
            go=Rows({"call": "1", "ok": f"count(*) = :need {domain}"}, "FROM free"),
        )
    order = claim_order(
        nvlink_shards,
        rail_aligned,
        "g.node_id = ANY(CAST(:node_ids AS text[]))",
        tolerating,
        admitting,
    )
    # Integer division throughout: the parameters are cast, or asyncpg may
    # bind them as numeric and a shard's positions stop dividing evenly.
    takes = (
        "least(n.cap, (SELECT count(*) FROM free f WHERE f.node_id = n.node_id)"
        " / CAST(:need AS int))"
    )
    if same_domain:
        takes = f"CASE WHEN {node_domain('n.node_id')} IS NULL THEN 0 ELSE {takes} END"
    return Wanted(
        steps=(
            (
                "nodes",
                """SELECT n.node_id, n.cap, n.rank
        FROM unnest(CAST(:node_ids AS text[]), CAST(:caps AS int[]))
            WITH ORDINALITY AS n(node_id, cap, rank)""",
            ),
            ("free", order),
            (
                "slots",
                f"""SELECT r.node_id, r.takes,
               CAST(sum(r.takes) OVER (ORDER BY r.rank) AS bigint) - r.takes AS before
        FROM (SELECT n.node_id, n.rank, {takes} AS takes FROM nodes n) r""",
            ),
            (
                "calls",
                """SELECT c.call, c.replica_id, c.actor, c.tenant, c.priority, c.deployment,
               s.node_id, c.call - 1 - s.before AS pos
        FROM unnest(CAST(:replica_ids AS text[]), CAST(:actors AS text[]),
                    CAST(:tenants AS text[]), CAST(:priorities AS int[]),
                    CAST(:deployments AS text[]))
            WITH ORDINALITY AS c(replica_id, actor, tenant, priority, deployment, call)
        JOIN slots s ON c.call > s.before AND c.call <= s.before + s.takes""",
            ),
        ),
        gpus=Rows(
            {
                "call": "c.call",
                "node_id": "f.node_id",
                "idx": "f.idx",
                "hcas": "f.hcas",
                "shard_id": """(CAST(:names AS text[]))[(c.call - 1) * CAST(:shards AS int)
                                        + (f.k - c.pos * CAST(:need AS int)) / CAST(:per AS int)
                                        + 1]""",
            },
            "FROM calls c JOIN free f ON f.node_id = c.node_id AND f.k / CAST(:need AS int) = c.pos",
        ),
        shards=_claimed_shards(
            "c.replica_id",
            "c.actor",
            "FROM want_gpus w JOIN calls c ON c.call = w.call"
            " GROUP BY w.call, c.replica_id, c.actor, c.tenant, c.priority, c.deployment,"
            " w.shard_id, w.node_id",
            rail_aligned,
            {c: f"c.{c}" for c in CHARGE_FIELDS},
        ),
        go=Rows({"call": "c.call", "ok": "true"}, "FROM calls c"),
    )
