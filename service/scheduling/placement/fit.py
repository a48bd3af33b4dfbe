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

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from service.database.connections import Connection, cached_text
from service.scheduling.placement.plan import plan_placement, validate_place
from service.scheduling.placement.statements import (
    NO_LIMIT,
    facts_of,
    request_params,
    survey_sql,
)
from service.scheduling.rejections import Rejection
from service.scheduling.verdicts import NodeFacts, PlaceRequest, VerdictCode, judge

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


def _groups_after(groups: tuple[int, ...], per: int, shards: int) -> tuple[int, ...]:
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
            groups = _groups_after(groups, request.gpus_per_shard, shards)
        topology = replace(topology, usable=topology.usable - gpus, groups=groups)
    return replace(f, free=f.free - gpus, topology=topology)


class FitCount:
    """The facts of a class's nodes as the counted replicas leave them."""

    def __init__(self, facts: Iterable[NodeFacts], request: PlaceRequest) -> None:
        self.request = request
        self.facts = {f.node_id: f for f in facts}
        self.taken: Counter[str] = Counter()
        self.replicas = 0

    def _take(self, node_id: str, shards: int) -> None:
        self.facts[node_id] = after(self.facts[node_id], self.request, shards)
        self.taken[node_id] += shards

    def fitting(self) -> list[NodeFacts]:
        return [f for f in self.facts.values() if judge(f, self.request).fits]

    def _take_whole(self) -> None:
        shards = self.request.shards
        for f in self.fitting():
            whole = f.room(self.request) // shards
            if whole:
                self._take(f.node_id, whole * shards)
                self.replicas += whole

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

    def _spread_by_group(self, groups: list[list[NodeFacts]], rng: random.Random) -> None:
        shards = self.request.shards
        wants_weights = self.request.weights is not None
        for members in groups:
            room = sum(f.room(self.request) for f in members)
            count = room // shards
            # Shards go to the group's nodes in the planner's rank order.
            left = count * shards
            ranked = sorted(
                members, key=lambda f: (wants_weights and not f.holds_weights, f.free, rng.random())
            )
            for f in ranked:
                if not left:
                    break
                k = min(f.room(self.request), left)
                self._take(f.node_id, k)
                left -= k
            self.replicas += count

    def _spread_by_plans(self, rng: random.Random) -> None:
        while True:
            plan = plan_placement(self.fitting(), self.request, rng)
            if plan is None:
                return
            for node_id, k in plan.nodes:
                self._take(node_id, k)
            self.replicas += 1

    def count(self, rng: random.Random) -> None:
        self._take_whole()
        if self.request.shards == 1:
            return
        groups = self._spread_groups(self.fitting())
        if groups is None:
            self._spread_by_plans(rng)
        else:
            self._spread_by_group(groups, rng)

    def limited_by(self) -> tuple[tuple[VerdictCode, int], ...]:
        codes = Counter(judge(f, self.request).code for f in self.facts.values())
        codes.pop(VerdictCode.FITS, None)
        return tuple(sorted(codes.items(), key=lambda item: (-item[1], item[0].value)))


def count_by_plans(facts: Iterable[NodeFacts], request: PlaceRequest, rng: random.Random) -> int:
    """The replicas plan_placement places one by one on these facts: what fit's shortcuts must equal."""
    counting = FitCount(facts, request)
    counting._spread_by_plans(rng)
    return counting.replicas


async def fit(
    conn: Connection,
    request: PlaceRequest,
    *,
    exclude: Iterable[str] = (),
    first: int,
    rng: random.Random | None = None,
) -> Fit | Rejection:
    """How many more replicas of the request's shape fit now; `exclude`: nodes counted as gone.

    One statement: the facts of every node of the class, as explainPlacement
    reads them. A shape place would refuse is the same Rejection.
    """
    request = shape_of(request)
    problem = validate_place(request)
    if problem is not None:
        return problem
    rows = await conn.execute(
        cached_text(survey_sql(request)), {**request_params(request), "limit": NO_LIMIT}
    )
    gone = set(exclude)
    counting = FitCount((f for f in map(facts_of, rows) if f.node_id not in gone), request)
    counting.count(rng or random.Random())
    used = sorted(counting.taken.items())
    return Fit(
        replicas=counting.replicas,
        nodes=tuple(FitNode(node_id, shards) for node_id, shards in used[:first]),
        nodes_omitted=max(0, len(used) - first),
        limited_by=counting.limited_by(),
    )
