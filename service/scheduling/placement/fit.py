"""fit: how many more replicas of one shape fit now, by place()'s own planner, writing nothing.

The autoscaler's question before it scales. The answer must be exact against
place: placing `replicas` of the shape one by one right after succeeds, and
one more is Unplaceable. So nothing here decides where a shard may go: the
nodes are read by the statement explainPlacement reads (survey_sql, every
node of the class), each is judged by verdicts.judge (the check place
re-runs on every candidate), and the replicas are planned by
plan.plan_placement, each plan applied to the facts before the next, as
place's own calls would leave the nodes.

Two counts are taken without calling plan_placement once per replica, each
because the planner provably gives the same number:

- Whole replicas (every shard on one node): plan_placement's first branch
  takes any node with room for all the shards, and a node's room is the only
  thing that decides how many it takes, whichever order the planner picks
  them in: floor(room / shards) each (FitCount._take_whole).
- Spread replicas, when every node with room left is on one fabric (and,
  sameNvlinkDomain, one NVLink domain): the planner fills a replica's shards
  from one such group, taking min(room, shards left) per node, so each group
  holds floor(its room / shards) whatever the order (FitCount._spread_by_group).
  When the groups overlap (a node on two fabrics), the planner's choice of
  fabric matters, and plan_placement is called for every replica.

tests/scheduling/test_fit.py checks the counts against plan_placement called
replica by replica and against place itself.

Topology: a shard placed on a node takes `gpusPerShard` of its usable GPUs
(the fit order's whole shards: topology_fit), so its room drops by one shard
and its free GPUs by gpusPerShard; with nvlinkShards the shard comes from the
smallest NVLink group that holds it (best fit, as the claim takes it).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import text

from service.database.connections import Connection, cached_text
from service.scheduling.availability import (
    SCHEDULABLE_STATE,
    PoolOffer,
    pool_withholding_taint,
)
from service.scheduling.freshness import gpu_facts_fresh
from service.scheduling.maintenance_rule import ANY_IN_FORCE, maintenance_json
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import weights
from service.scheduling.placement.plan import plan_placement, validate_place
from service.scheduling.placement.statements import (
    disk_fits,
    facts_of,
    node_facts,
    request_params,
)
from service.scheduling.pool_census import DECLINED, MOST_KINDS, census_sql
from service.scheduling.ranking import node_rank
from service.scheduling.rejections import Rejection, refused_for_charge
from service.scheduling.taints import judged_taint
from service.scheduling.tenancy.charges import UnknownTenant
from service.scheduling.tenancy.headroom import headroom
from service.scheduling.topology_fit import facts_column, pool_facts, pooled
from service.scheduling.verdicts import NodeFacts, VerdictCode, judge

# fit names no replica; place's checks of the shape want some id.
SHAPE_ID = "fit"


@dataclass(frozen=True)
class FitNode:
    node_id: str
    # Shards of the counted replicas this node would take.
    shards: int


@dataclass(frozen=True)
class Fit:
    replicas: int
    # By node id, at most `first` of them.
    nodes: tuple[FitNode, ...]
    nodes_omitted: int
    # Per verdict, how many nodes of the class fail it once the counted
    # replicas are placed (FITS left out); most nodes first.
    limited_by: tuple[tuple[VerdictCode, int], ...]


def shape_of(request: PlaceRequest) -> PlaceRequest:
    """The request as fit checks it: a shape, under a stand-in replica id."""
    return replace(request, replica_id=request.replica_id or SHAPE_ID)


def groups_after(groups: tuple[int, ...], per: int, shards: int) -> tuple[int, ...]:
    """Free GPUs per NVLink group after `shards` shards, each from the smallest group that holds it."""
    left = sorted(groups)
    for _ in range(shards):
        for i, size in enumerate(left):
            if size >= per:
                left[i] = size - per
                break
        left.sort()
    return tuple(sorted(left, reverse=True))


def after(f: NodeFacts, request: PlaceRequest, shards: int) -> NodeFacts:
    """The node's facts once it holds `shards` more shards of the request."""
    gpus = shards * request.gpus_per_shard
    topology = f.topology
    if topology is not None:
        groups = topology.groups
        if request.nvlink_shards:
            groups = groups_after(groups, request.gpus_per_shard, shards)
        topology = replace(topology, usable=topology.usable - gpus, groups=groups)
    # A claim takes the GPUs that are not last resort first (topology_fit.claim_order).
    clean = f.free - f.last_resort
    last_resort = f.last_resort - max(0, gpus - clean)
    return replace(f, free=f.free - gpus, topology=topology, last_resort=last_resort)


def _pool_state(schedulable: str, node_id: str) -> str:
    """SQL: the state judge() reads of a pool's node, its row looked up only for a node that takes no placement.

    `schedulable`: the pool's (or the kind of pool's) column, which every
    write keeps equal to availability.node_schedulable (gpu_pools.py), so a
    schedulable node's state is known without its row; the others are read
    for the state their verdict names.
    """
    return (
        f"CASE WHEN {schedulable} THEN '{SCHEDULABLE_STATE}'"
        f" ELSE (SELECT n.state FROM nodes n WHERE n.id = {node_id}) END"
    )


def survey_groups_sql(
    request: PlaceRequest,
    *,
    all_fabrics: bool = False,
    extra: Mapping[str, str] | None = None,
    only: bool = False,
) -> str:
    """Every node of the class, grouped by the facts judge() reads for this request.

    explainPlacement's survey (statements.survey_sql), with two changes that
    keep it one pass over the class's pools at any size: a fact the request
    does not ask about is not read (its column is the constant judge ignores
    then), and nodes whose facts judge() cannot tell apart come back as one
    row with their ids (members) and a representative's facts. Within
    a group a number judge() compares is carried as the group's extreme on
    the side of its comparison (the least disk free, the oldest GPU facts),
    so the representative fails or passes each check as every member does.

    `all_fabrics`: read every node's fabrics whatever the request (groups rank
    and judge locality by them). `extra`: more columns (name: SQL over the
    pool `p` and, when the request reads it, the node `n`) that split the
    groups too: placement groups' NVLink domain and locality label.

    The SQL generated below looks like this: docs/internals/sql/scheduling.placement.fit/survey_groups_sql.plain.sql
    (every shape beside it).
    """
    extra = dict(extra or {})
    wants_fabrics = all_fabrics or request.fabric is not None or request.shards > 1
    # Every pool carries its node's fabrics (gpu_pools.attached_fabrics).
    fabrics = (
        "p.fabrics, p.fabric_rates"
        if wants_fabrics
        else "CAST('{}' AS text[]) AS fabrics, CAST('{}' AS int[]) AS fabric_rates"
    )
    # Each fact of the node's row as statements.node_facts reads it, where the request reads it.
    node = node_facts("n")
    holds = weights.holds("p.node_id") if request.weights is not None else "false"
    knows = node["knows_its_weights"] if request.weights is not None else "false"
    # The node's copy of the weights, as place ranks and judges it (placement/weights.py).
    copy = (
        f"CAST({weights.copy_of('p.node_id')} AS jsonb)"
        if request.weights is not None
        else "CAST(NULL AS jsonb)"
    )
    label_ok = (
        f"({node['label_value']}) IS NOT DISTINCT FROM CAST(:label_value AS text)"
        if request.label is not None
        else "true"
    )
    label = node["label_value"] if request.label is not None else "NULL"
    disk_ok = disk_fits("n") if request.min_local_disk_free is not None else "true"
    fresh, age = (
        (gpu_facts_fresh("n"), node["gpus_facts_age"])
        if request.max_age is not None
        else ("true", "CAST(NULL AS float8)")
    )
    # The node's row only for what the request asks of it. Its state alone
    # comes from the pool row, whose `schedulable` every write keeps equal to
    # availability.node_schedulable (gpu_pools.py); only the nodes that do not
    # take placement are looked up, for the state judge() names.
    reads_node = request.weights is not None or request.label is not None
    reads_node = reads_node or request.min_local_disk_free is not None
    reads_node = reads_node or request.max_age is not None
    if reads_node:
        state, source = node["state"], "gpu_pools p JOIN nodes n ON n.id = p.node_id"
    else:
        state = _pool_state("p.schedulable", "p.node_id")
        source = "gpu_pools p"
    disk = (
        f"{node['local_disk_free']} AS local_disk_free, {node['local_disk_total']} AS local_disk_total"
        if request.min_local_disk_free is not None
        else "CAST(NULL AS bigint) AS local_disk_free, CAST(NULL AS bigint) AS local_disk_total"
    )
    # nvlinkShards alone: the pools' summaries are grouped as they are and the
    # facts built once per group (a JSON value per pool cost 40-70 ms of CPU
    # at 4,000 pools, where the rest of the statement costs 4).
    if pooled(request):
        topology_in = "p.free_groups, p.nvlink_known"
        topology_key = "f.free_groups, f.nvlink_known"
        topology_out = f"CAST({pool_facts('f.free_groups', 'f.nvlink_known')} AS jsonb)"
    else:
        topology_in = f"CAST({facts_column(request, 'p.node_id')} AS jsonb) AS topology"
        topology_key = topology_out = "f.topology"
    # The members unordered: an ordered aggregate made PostgreSQL sort every
    # row of the class, most of the statement's time; FitCount.used picks the
    # first ids of the groups it lists.
    offer = PoolOffer("p", request.tolerating, request.admitting)
    return f"""
    SELECT min(f.node_id) AS node_id, f.state, CAST(NULL AS text) AS state_reason, f.free,
           f.withheld, f.last_resort, CAST(f.taint AS json) AS taint,
           min(f.local_disk_free) AS local_disk_free, min(f.local_disk_total) AS local_disk_total,
           f.knows_its_weights, f.holds_weights, f.weights_copy, f.fabrics,
           f.fabric_rates, min(f.label_value) AS label_value,
           {topology_out} AS topology, max(f.gpus_facts_age) AS gpus_facts_age,
           CAST(f.maintenance AS json) AS maintenance,
           array_agg(f.node_id) AS members{"".join(f", f.{name}" for name in extra)}
    FROM (
        SELECT p.node_id, {offer.free} AS free, {offer.withheld} AS withheld,
               {offer.last_resort} AS last_resort,
               {judged_taint(f"CAST({offer.taint} AS jsonb)")} AS taint,
               {state} AS state,{"".join(f" {sql} AS {name}," for name, sql in extra.items())}
               {disk}, {disk_ok} AS disk_ok,
               {knows} AS knows_its_weights, {holds} AS holds_weights, {copy} AS weights_copy,
               {fabrics},
               {label} AS label_value, {label_ok} AS label_ok,
               {topology_in},
               {age} AS gpus_facts_age, {fresh} AS fresh,
               CAST({maintenance_json("p.node_id")} AS jsonb) AS maintenance
        FROM {source}{offer.join}
        WHERE p.gpu_class = :cls{" AND p.node_id = ANY(CAST(:only AS text[]))" if only else ""}
    ) f
    GROUP BY f.state, f.free, f.withheld, f.last_resort, f.taint, f.disk_ok,
             f.knows_its_weights, f.holds_weights, f.weights_copy,
             f.fabrics, f.fabric_rates,
             f.label_ok, {topology_key}, f.fresh, f.maintenance{"".join(f", f.{name}" for name in extra)}
    """


class _Group:
    """Nodes judge() cannot tell apart for the request: one set of facts, several ids."""

    def __init__(self, facts: NodeFacts, members: Sequence[str], size: int | None = None) -> None:
        self.facts = facts
        # The members' ids: all of them, or (counted by the census) the first
        # few, ascending, of `size`.
        self.members = members
        self.size = len(members) if size is None else size
        # Shards each member takes (the whole-replica count is the same for each).
        self.taken = 0


class FitCount:
    """The facts of a class's nodes as the counted replicas leave them.

    `most`: count no more replicas than this (the tenant's room under its
    limit, in replicas). Then the whole replicas are taken in place's order
    (ranking.node_rank, then node id), node by node, as place's calls one by
    one would take them, so that `nodes` says where those replicas go;
    groups the count stops inside are split by member id (which needs every
    member's id: not a census's groups).
    """

    def __init__(
        self, groups: Iterable[_Group], request: PlaceRequest, most: int | None = None
    ) -> None:
        self.request = request
        self.groups = list(groups)
        # Nodes the spread phase took apart from their groups, and their shards.
        self.facts: dict[str, NodeFacts] = {}
        self.taken: Counter[str] = Counter()
        self.replicas = 0
        self.most = most

    def _left(self) -> int | None:
        return None if self.most is None else self.most - self.replicas

    @classmethod
    def of_nodes(cls, facts: Iterable[NodeFacts], request: PlaceRequest) -> FitCount:
        return cls((_Group(f, [f.node_id]) for f in facts), request)

    def _take(self, node_id: str, shards: int) -> None:
        self.facts[node_id] = after(self.facts[node_id], self.request, shards)
        self.taken[node_id] += shards

    def fitting(self) -> list[NodeFacts]:
        return [f for f in self.facts.values() if judge(f, self.request).fits]

    def _take_whole(self) -> None:
        if self.most is not None:
            self._take_whole_within()
            return
        shards = self.request.shards
        for group in self.groups:
            if not judge(group.facts, self.request).fits:
                continue
            whole = group.facts.room(self.request) // shards
            if whole:
                group.facts = after(group.facts, self.request, whole * shards)
                group.taken += whole * shards
                self.replicas += whole * group.size

    def _take_whole_within(self) -> None:
        """_take_whole up to `most` replicas, best node first, a node filled before the next."""
        shards = self.request.shards

        def rank(group: _Group) -> tuple[int, int, int, int, str]:
            return node_rank(group.facts, self.request, self.request.gpus)

        kept: list[_Group] = []
        for group in sorted(self.groups, key=rank):
            left = self._left() or 0
            whole = group.facts.room(self.request) // shards
            if not left or not whole or not judge(group.facts, self.request).fits:
                kept.append(group)
                continue
            assert group.size == len(group.members), "a cut group needs every member's id"
            members = sorted(group.members)
            full, rest = divmod(min(left, whole * group.size), whole)
            parts = [(members[:full], whole), (members[full : full + (rest > 0)], rest)]
            for ids, replicas in parts:
                if ids:
                    taken = _Group(after(group.facts, self.request, replicas * shards), ids)
                    taken.taken = group.taken + replicas * shards
                    kept.append(taken)
                    self.replicas += replicas * len(ids)
            untouched = members[full + (rest > 0) :]
            if untouched:
                alone = _Group(group.facts, untouched)
                alone.taken = group.taken
                kept.append(alone)
        self.groups = kept

    def _take_apart(self) -> None:
        """The members of groups that can still take a shard, one by one: a spread tells them apart."""
        kept = []
        for group in self.groups:
            if not judge(group.facts, self.request).fits:
                kept.append(group)
                continue
            assert group.size == len(group.members), "a spread needs every member's id"
            for node_id in sorted(group.members):
                self.facts[node_id] = replace(group.facts, node_id=node_id)
                self.taken[node_id] = group.taken
        self.groups = kept

    def _spread_groups(self, fitting: Sequence[NodeFacts]) -> list[list[NodeFacts]] | None:
        """The nodes a spread draws from, by (fabric, domain); None when a node is in two."""
        request = self.request
        groups: dict[tuple[str, str | None], list[NodeFacts]] = {}
        for f in fitting:
            fabrics = [x for x in f.fabrics if request.fabric is None or x == request.fabric]
            domain = f.topology.domain if request.same_nvlink_domain and f.topology else None
            if not fabrics or (request.same_nvlink_domain and domain is None):
                continue  # in no group: the planner never spreads onto it
            if len(fabrics) > 1:
                return None
            groups.setdefault((fabrics[0], domain), []).append(f)
        return [groups[key] for key in sorted(groups, key=lambda k: (k[0], k[1] or ""))]

    def _spread_by_group(self, groups: list[list[NodeFacts]]) -> None:
        shards = self.request.shards
        for members in groups:
            room = sum(f.room(self.request) for f in members)
            count = room // shards
            left = self._left()
            if left is not None:
                count = min(count, left)
            # Shards go to the group's nodes in the planner's rank order.
            left = count * shards
            ranked = sorted(members, key=lambda f: node_rank(f, self.request))
            for f in ranked:
                if not left:
                    break
                k = min(f.room(self.request), left)
                self._take(f.node_id, k)
                left -= k
            self.replicas += count

    def _spread_by_plans(self) -> None:
        while self._left() != 0:
            plan = plan_placement(self.fitting(), self.request)
            if plan is None:
                return
            for node_id, k in plan.nodes:
                self._take(node_id, k)
            self.replicas += 1

    def count(self) -> None:
        self._take_whole()
        if self.request.shards == 1 or self._left() == 0:
            return
        self._take_apart()
        groups = self._spread_groups(self.fitting())
        if groups is None:
            self._spread_by_plans()
        else:
            self._spread_by_group(groups)

    def limited_by(self) -> tuple[tuple[VerdictCode, int], ...]:
        codes = Counter(judge(f, self.request).code for f in self.facts.values())
        for group in self.groups:
            codes[judge(group.facts, self.request).code] += group.size
        fitting = codes.pop(VerdictCode.FITS, 0)
        if self._left() == 0 and fitting:
            # Nodes that would take one more but for the tenant's limit.
            codes[VerdictCode.QUOTA_EXCEEDED] = fitting
        return tuple(sorted(codes.items(), key=lambda item: (-item[1], item[0].value)))

    def used(self, first: int) -> tuple[list[tuple[str, int]], int]:
        """The first `first` nodes by id that take shards, with their shards; and how many do."""
        candidates: list[tuple[str, int]] = []
        total = 0
        for group in self.groups:
            if group.taken:
                total += group.size
                smallest = heapq.nsmallest(first, group.members)
                candidates.extend((node_id, group.taken) for node_id in smallest)
        apart = [(node_id, k) for node_id, k in self.taken.items() if k]
        return heapq.nsmallest(first, candidates + apart), total + len(apart)


def count_by_plans(facts: Iterable[NodeFacts], request: PlaceRequest) -> int:
    """The replicas plan_placement places one by one on these facts: what fit's shortcuts must equal."""
    counting = FitCount((), request)
    counting.facts = {f.node_id: f for f in facts}
    counting._spread_by_plans()
    return counting.replicas


def counted_by_census(request: PlaceRequest) -> bool:
    """Whether fit may count the request's class by its pools' census (service/scheduling/pool_census.py).

    When every fact judge() reads of the request is a column the census
    tells kinds of pool apart by: one shard (a spread tells the nodes apart
    by id), no fact of the node's row (weights, label, disk, age), no
    toleration (its offer reads the taints), and no topology but
    nvlinkShards' (pool_facts, from the pool's own summary).
    """
    node_facts = (request.weights, request.label, request.min_local_disk_free, request.max_age)
    return (
        request.shards == 1
        and all(fact is None for fact in node_facts)
        and not request.tolerating
        and (not request.needs_topology or pooled(request))
    )


def census_facts_sql(
    request: PlaceRequest,
    *,
    reads: str = "count",
    all_fabrics: bool = False,
    extra: Mapping[str, str] | None = None,
    skip: bool = False,
) -> str:
    """The census of the request's class, each kind of pool with the facts survey_groups_sql gives a group.

    The kind's first node stands for it: its state (read only for the
    unschedulable kinds, which judge() finds NOT_SCHEDULABLE whatever the
    state) and its withholding taint (read only where a taint withholds
    GPUs, which judge() finds TAINTED whichever taint it is).

    `reads`: what of each kind. "count" (fit): every kind, counted, with
    the first :ids ids of a kind whose nodes may take a shard (free for
    one). "window" (placement groups' window, groups/reads.py): the kinds
    with :need GPUs free, uncounted, the first :ids ids of each. "members"
    (fitGroup's board): every kind, uncounted, the first :ids ids of each
    (all of them for a NULL :ids). `all_fabrics` and `extra` as
    survey_groups_sql's, with `extra` over the kind `c`. `skip`: the nodes
    :skip left out (census_sql), for fit at a later instant.

    The SQL generated below looks like this: docs/internals/sql/scheduling.placement.fit/census_facts_sql.plain.count.sql
    (every shape beside it).
    """
    topology = (
        f"CAST({pool_facts('c.free_groups', 'c.nvlink_known')} AS json)"
        if pooled(request)
        else "CAST(NULL AS json)"
    )
    fabrics = (
        "c.fabrics, c.fabric_rates"
        if all_fabrics or request.fabric is not None
        else "CAST('{}' AS text[]) AS fabrics, CAST('{}' AS int[]) AS fabric_rates"
    )
    if reads == "count":
        census = census_sql("k.schedulable AND k.free >= :per", skip=skip)
    elif reads == "window":
        # From the first schedulable kind with a shard free: true is the last
        # boolean, so every kind after it is schedulable too.
        census = census_sql(start="(t.schedulable, t.free) >= (true, :need)", counts=False)
    else:
        assert reads == "members", reads
        census = census_sql(counts=False)
    first = "c.members[1]"
    taint = pool_withholding_taint("r")
    columns = "".join(f", {sql} AS {name}" for name, sql in (extra or {}).items())
    return f"""
    SELECT {first} AS node_id,
           {_pool_state("c.schedulable", first)} AS state,
           CAST(NULL AS text) AS state_reason, c.free, c.withheld, c.last_resort,
           (SELECT {taint} FROM gpu_pools r WHERE r.node_id = {first} AND r.gpu_class = :cls)
               AS taint,
           CAST(NULL AS bigint) AS local_disk_free, CAST(NULL AS bigint) AS local_disk_total,
           false AS knows_its_weights, false AS holds_weights, CAST(NULL AS jsonb) AS weights_copy,
           {fabrics}, CAST(NULL AS text) AS label_value, {topology} AS topology,
           CAST(NULL AS float8) AS gpus_facts_age, CAST(NULL AS json) AS maintenance,
           {ANY_IN_FORCE} AS maintenance_in_force, c.nodes, c.members{columns}
    FROM ({census}) c{" WHERE c.nodes > 0" if skip else ""}
    """


# The nodes whose pool of :cls may offer otherwise at :at than now
# (availability.gpu_offered_at): GPUs set aside by a reservation ending by
# then, or held by a replica due to be gone by then; at most :most of them.
CHANGED_BY = text(
    """
    SELECT g.node_id FROM reservations r JOIN gpus g ON g.reservation = r.id
    WHERE r.state <> 'ENDED' AND r.ends_at <= CAST(:at AS timestamptz) AND g.gpu_class = :cls
    UNION
    SELECT s.node_id FROM shards s WHERE s.until <= CAST(:at AS timestamptz)
    LIMIT :most
    """
)
# Past this many, the census would compare every index entry with a long
# list: the pools are surveyed instead.
MOST_CHANGED = 1000


async def _census_groups(
    conn: Connection, request: PlaceRequest, first: int, changed: Sequence[str] = ()
) -> list[_Group] | None:
    """The class's nodes as groups, counted by the census; None when it declines (too many kinds).

    At a later instant (request.at): the pools that will offer as they do now
    counted by the census as now (`changed`, the others, left out), the
    `changed` ones surveyed as they will be then.
    """
    params = {**request_params(request), "ids": max(first, 1), "most": MOST_KINDS + 1}
    params["skip"] = list(changed)
    later = request.at is not None
    now = replace(request, at=None)
    sql = census_facts_sql(now, skip=later)
    rows = list(await conn.execute(cached_text(sql), params))
    if len(rows) > MOST_KINDS:
        DECLINED.count("kinds")
        return None
    if rows and rows[0].maintenance_in_force:
        # A kind of pool holds nodes in and out of a maintenance window alike.
        DECLINED.count("maintenance")
        return None
    # Kinds judge() cannot tell apart for this request (their topology, say,
    # when it reads none) are one group, as the survey groups them.
    groups: dict[NodeFacts, _Group] = {}
    for row in rows:
        facts = facts_of(row)
        key = replace(facts, node_id="")
        group = groups.get(key)
        if group is None:
            groups[key] = _Group(facts, list(row.members), row.nodes)
            continue
        members = heapq.nsmallest(max(first, 1), [*group.members, *row.members])
        group.facts = replace(group.facts, node_id=members[0])
        group.members = members
        group.size += row.nodes
    found = list(groups.values())
    if later and changed:
        found += await _survey_groups(conn, request, set(), changed)
    return found


async def _survey_groups(
    conn: Connection, request: PlaceRequest, gone: set[str], only: Sequence[str] | None = None
) -> list[_Group]:
    """The class's nodes as survey_groups_sql groups them, every member's id, `gone` left out.

    `only`: of these nodes alone."""
    groups = []
    sql = survey_groups_sql(request, only=only is not None)
    params = {**request_params(request), "only": list(only or ())}
    rows = await conn.execute(cached_text(sql), params)
    for row in rows:
        members = [m for m in row.members if m not in gone] if gone else row.members
        if members:
            groups.append(_Group(replace(facts_of(row), node_id=min(members)), members))
    return groups


async def fit(
    conn: Connection,
    request: PlaceRequest,
    *,
    exclude: Iterable[str] = (),
    first: int,
    census: bool = True,
) -> Fit | Rejection:
    """How many more replicas of the request's shape fit now; `exclude`: nodes counted as gone.

    One statement: the class's pools counted by kind (census_facts_sql)
    when counted_by_census, else the facts of every node of the class, as
    explainPlacement reads them, grouped (survey_groups_sql). A shape place
    would refuse is the same Rejection. `census=False` reads every pool
    (what the census must equal).
    """
    request = shape_of(request)
    problem = validate_place(request)
    if problem is not None:
        return problem
    tenant = request.charge.tenant_id
    standing = (await headroom(conn, tenant, [request.gpu_class], at=request.at))[request.gpu_class]
    if not standing.known:
        return refused_for_charge(UnknownTenant(tenant))
    gone = set(exclude)
    groups = None
    changed: list[str] = []
    if request.at is not None:
        params = {"cls": request.gpu_class, "at": request.at, "most": MOST_CHANGED + 1}
        changed = [r.node_id for r in await conn.execute(CHANGED_BY, params)]
    if census and counted_by_census(request) and not gone and len(changed) <= MOST_CHANGED:
        groups = await _census_groups(conn, request, first, changed)
    if groups is None:
        groups = await _survey_groups(conn, request, gone)
    counting = FitCount(groups, request)
    counting.count()
    room = standing.room
    if room is not None and room // request.gpus <= counting.replicas:
        # The tenant's limit stops it at or before the nodes do: counted again
        # up to the limit, every pool read (the count cuts groups by member).
        counting = FitCount(
            await _survey_groups(conn, request, gone), request, room // request.gpus
        )
        counting.count()
    used, total = counting.used(first)
    return Fit(
        replicas=counting.replicas,
        nodes=tuple(FitNode(node_id, shards) for node_id, shards in used),
        nodes_omitted=total - len(used),
        limited_by=counting.limited_by(),
    )
