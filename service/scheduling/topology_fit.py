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

from functools import lru_cache

from service.scheduling.availability import gpu_free
from service.scheduling.verdicts import PlaceRequest


def _usable(request: PlaceRequest, nodes: str, domain: bool) -> str:
    """Free GPUs of :cls on the nodes `nodes` selects (a condition on g.node_id) that the request may use.

    Columns: node_id, idx, grp (the NVLink group, or 0), hcas (the GPU's
    near HCAs on :fabric, for railAligned; empty otherwise).
    """
    join = ""
    where = [nodes, "g.gpu_class = :cls", gpu_free("g")]
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
    return (
        f"SELECT g.node_id, g.idx, {grp} AS grp, {hcas} AS hcas FROM gpus g {join}"
        f" WHERE {' AND '.join(where)}"
    )


def fit_order(request: PlaceRequest, nodes: str, *, domain: bool = False) -> str:
    """The usable GPUs in best-fit order, whole shards only: rows (node_id, idx, hcas, k).

    k counts from 0 per node; GPUs k*per .. k*per+per-1 form one shard and
    lie in one group. Parameters: :cls, :per, and :fabric for railAligned,
    :domain when `domain` (only GPUs of that NVLink domain).
    """
    return f"""
    SELECT f.node_id, f.idx, f.hcas,
           row_number() OVER (PARTITION BY f.node_id ORDER BY f.n, f.grp, f.idx) - 1 AS k
    FROM (SELECT u.node_id, u.idx, u.grp, u.hcas,
                 row_number() OVER (PARTITION BY u.node_id, u.grp ORDER BY u.idx) - 1 AS r,
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
    return f"""(SELECT CASE WHEN count(*) = count(g.nvlink_domain)
                             AND count(DISTINCT g.nvlink_domain) = 1
                        THEN min(g.nvlink_domain) END
                FROM gpus g WHERE g.node_id = {node} AND g.gpu_class = :cls)"""


def candidate_filters(request: PlaceRequest, node: str = "p.node_id") -> list[str]:
    """Conditions that the topology of the node `node` names can take :need GPUs."""
    if not request.needs_topology:
        return []
    filters = [f"{room(request, node)} * :per >= :need"]
    if request.same_nvlink_domain:
        filters.append(f"{node_domain(node)} IS NOT NULL")
    return filters


def facts_column(request: PlaceRequest, node: str) -> str:
    """The node's topology facts as one JSON value (service.scheduling.verdicts.TopologyFacts.of), or NULL.

    NULL when the request needs no topology: those statements pay nothing.
    """
    if not request.needs_topology:
        return "CAST(NULL AS json)"
    known = ["true"]
    if request.nvlink_shards:
        known.append("g.nvlink_peers IS NOT NULL")
    if request.rail_aligned:
        known.append("g.near_hcas IS NOT NULL")
    free = f"g.node_id = {node} AND g.gpu_class = :cls AND {gpu_free('g')}"
    groups = (
        f"""ARRAY(SELECT count(*) FROM gpus g WHERE {free} AND g.nvlink_group IS NOT NULL
                  GROUP BY g.nvlink_group ORDER BY 1 DESC)"""
        if request.nvlink_shards
        else "CAST('{}' AS bigint[])"
    )
    unaligned = (
        f"""ARRAY(SELECT g.idx FROM gpus g
                  LEFT JOIN fabric_attachments fa ON fa.node_id = g.node_id AND fa.fabric = :fabric
                  WHERE {free} AND NOT coalesce(g.near_hcas && fa.hcas, false) ORDER BY g.idx)"""
        if request.rail_aligned
        else "CAST('{}' AS int[])"
    )
    domain = node_domain(node) if request.same_nvlink_domain else "CAST(NULL AS text)"
    return f"""json_build_object(
        'known', EXISTS (SELECT 1 FROM gpus g WHERE g.node_id = {node} AND g.gpu_class = :cls
                         AND {" AND ".join(known)}),
        'groups', {groups},
        'usable', {room(request, node)} * :per,
        'unaligned', {unaligned},
        'domain', {domain})"""


@lru_cache(maxsize=16)
def claim_wanted(nvlink_shards: bool, rail_aligned: bool, same_domain: bool) -> str:
    """The CTEs a topology claim gives allocations.store_statement, for one locked node.

    The first :need GPUs of the node's fit order, counted afresh under the
    node's lock; shard k takes positions k*per and on, and, railAligned, is
    handed exactly its GPUs' near HCAs on :fabric. Fewer than :need, or
    (sameNvlinkDomain) a node in no single domain, writes nothing.
    """
    request = PlaceRequest("", "", 1, nvlink_shards=nvlink_shards, rail_aligned=rail_aligned)
    order = fit_order(request, "g.node_id = CAST(:node_id AS text)")
    fabric = "CAST(:fabric AS text)" if rail_aligned else "CAST(NULL AS text)"
    domain = f"AND {node_domain('CAST(:node_id AS text)')} IS NOT NULL" if same_domain else ""
    return f"""
    free AS (
        SELECT o.idx, o.hcas, o.k FROM ({order}) o WHERE o.k < :need
    ), want_gpus AS (
        SELECT CAST(:node_id AS text) AS node_id, f.idx, f.hcas,
               (CAST(:names AS text[]))[f.k / :per + 1] AS shard_id
        FROM free f
    ), want_shards AS (
        SELECT w.shard_id, w.node_id, array_agg(w.idx ORDER BY w.idx) AS gpu_indices,
               {fabric} AS fabric,
               ARRAY(SELECT DISTINCT h FROM want_gpus v, unnest(v.hcas) h
                     WHERE v.shard_id = w.shard_id ORDER BY h) AS hcas
        FROM want_gpus w GROUP BY w.shard_id, w.node_id
    ), go AS (
        SELECT count(*) = :need {domain} AS ok FROM free
    )"""
