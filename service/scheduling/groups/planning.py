"""Where a group's replicas would go on nodes already read: locality as a score, hard when asked (no database).

The board: per role, the nodes that passed the read, as classes of nodes
whose facts judge() cannot tell apart (the grouped survey fit reads), plus
the nodes this plan has opened (taken a replica on), each with its facts
for every role as the replicas already planned leave it. Every replica is
planned by place's own planner (plan.plan_placement, which judges each node
and takes them in service/scheduling/ranking.py's order), over:

1. a zone of the locality level (one node, one NVLink domain, one value of
   the label, one fabric, or everything), every zone tried, the best plan
   kept: the lowest sum of KV path ranks (paths.CLOSENESS), then the fewest
   GPUs left free on the nodes used (packing: the least flexible zone first),
   then the zone's name;
2. within the zone, tiers: a kvTo replica first on its kvFrom partner's nodes
   (paths.partner), then on any node the group already uses, then anywhere
   in the zone; kvFrom replicas are each followed by their receivers, so a
   sender and its receivers share a node when one has room.

Preferred locality falls back to coarser levels (NODE, NVLINK_DOMAIN, LABEL,
FABRIC, ANY) when no zone of the level holds the group; hard does not.

Only the smallest few ids of a class are candidates (a replica uses at most
`shards` nodes, and among equal nodes the planner takes the smallest ids),
so a plan costs what the classes cost, not the cluster. The same function
answers placeGroup, fitGroup (round after round on one board) and
explainPlacement, so they cannot disagree.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from service.scheduling.groups.paths import (
    CLOSENESS,
    Whereabouts,
    Zone,
    kv_pairs,
    partner,
    path_kind,
)
from service.scheduling.groups.requests import GroupRequest, LocalityLevel
from service.scheduling.placement.fit import after, groups_after
from service.scheduling.placement.plan import Plan, plan_placement
from service.scheduling.verdicts import NodeFacts, PlaceRequest, judge

LEVELS = tuple(LocalityLevel)


@dataclass
class NodeClass:
    """Nodes a role's read could not tell apart: one set of facts and zone, member ids ascending."""

    facts: NodeFacts
    zone: Zone
    members: list[str]


@dataclass(frozen=True)
class Member:
    role: str
    n: int
    plan: Plan


@dataclass(frozen=True)
class GroupPlan:
    members: tuple[Member, ...]
    # The locality level the plan reaches and its zone's name (None: ANY).
    level: LocalityLevel
    zone: str | None
    score: tuple[int, int]


@dataclass(frozen=True)
class Misfit:
    """No plan: the role whose replica found no room first, in the best zone tried, and why."""

    role: str
    n: int
    level: LocalityLevel
    message: str


@dataclass
class Board:
    """What the planner sees: per role its request and classes, and the nodes opened so far."""

    requests: dict[str, PlaceRequest]
    classes: dict[str, list[NodeClass]]
    opened: dict[str, dict[str, NodeFacts]] = field(default_factory=dict)
    zones: dict[str, Zone] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.where: dict[str, dict[str, int]] = {
            role: {m: i for i, c in enumerate(cs) for m in c.members}
            for role, cs in self.classes.items()
        }
        self.fits: dict[str, list[bool]] = {
            role: [judge(c.facts, self.requests[role]).fits for c in cs]
            for role, cs in self.classes.items()
        }
        self.tokens: dict[str, list[str]] = {
            role: [token(c.facts, c.zone) for c in cs] for role, cs in self.classes.items()
        }
        self.keys: dict[str, dict[tuple[NodeFacts, Zone], int]] = {
            role: {key(c.facts, c.zone): i for i, c in enumerate(cs)}
            for role, cs in self.classes.items()
        }
        # A class member's facts under its planning id, by (role, class, node):
        # a class's facts never change (settle moves members, class_for adds
        # classes), and a plan asks for the same members zone after zone.
        self.planned: dict[tuple[str, int, str], NodeFacts] = {}

    def fork(self) -> Board:
        other = Board.__new__(Board)
        other.requests, other.classes = self.requests, self.classes
        other.where, other.fits = self.where, self.fits
        other.tokens, other.keys, other.planned = self.tokens, self.keys, self.planned
        other.opened = {n: dict(f) for n, f in self.opened.items()}
        other.zones = dict(self.zones)
        return other

    def facts_of(self, node_id: str, role: str) -> NodeFacts | None:
        opened = self.opened.get(node_id)
        if opened is not None:
            return opened.get(role)
        i = self.where[role].get(node_id)
        if i is None:
            return None
        return replace(self.classes[role][i].facts, node_id=node_id)

    def zone_of(self, node_id: str) -> Zone | None:
        if node_id in self.zones:
            return self.zones[node_id]
        for role, where in self.where.items():
            if node_id in where:
                return self.classes[role][where[node_id]].zone
        return None

    def candidates(self, role: str, keep: Zonal, per_class: int) -> list[NodeFacts]:
        """The nodes a replica of `role` may be planned on in the zone: opened ones, and each class's first ids.

        Under their planning ids (planning_id): the class's token, then the node id.
        """
        found = [
            replace(f, node_id=planning_id(token(f, zone), node_id))
            for node_id, by_role in self.opened.items()
            if (f := by_role.get(role)) is not None and keep(node_id, zone := self.zones[node_id])
        ]
        if keep.node is not None:
            # One node's zone: its class by lookup, not a walk over every member.
            i = self.where[role].get(keep.node)
            if i is not None and keep.node not in self.opened and self.fits[role][i]:
                found.append(self._planned(role, i, keep.node))
            return found
        for i, c in enumerate(self.classes[role]):
            # Below NODE a zone is a fact of the class: one test for all its members.
            if not self.fits[role][i] or not c.members or not keep(c.members[0], c.zone):
                continue
            taken = 0
            for node_id in c.members:
                if taken == per_class:
                    break
                if node_id in self.opened:
                    continue
                found.append(self._planned(role, i, node_id))
                taken += 1
        return found

    def _planned(self, role: str, i: int, node_id: str) -> NodeFacts:
        """Class i's facts for a member, under its planning id."""
        facts = self.planned.get((role, i, node_id))
        if facts is None:
            planning = planning_id(self.tokens[role][i], node_id)
            facts = self.planned[(role, i, node_id)] = replace(
                self.classes[role][i].facts, node_id=planning
            )
        return facts

    def take(self, role: str, plan: Plan) -> None:
        """Apply a replica's plan: its nodes opened, their facts for every role of the class reduced."""
        request = self.requests[role]
        for node_id, shards in plan.nodes:
            if node_id not in self.opened:
                zone = self.zone_of(node_id)
                assert zone is not None
                self.zones[node_id] = zone
                self.opened[node_id] = {
                    r: f for r in self.requests if (f := self.facts_of(node_id, r)) is not None
                }
            by_role = self.opened[node_id]
            for other, f in by_role.items():
                wanted = self.requests[other]
                if wanted.gpu_class != request.gpu_class:
                    continue
                by_role[other] = (
                    after(f, request, shards)
                    if other == role
                    else _less(f, wanted, request, shards)
                )

    def class_for(self, role: str, f: NodeFacts, zone: Zone) -> int:
        """The index of the role's class with these facts and zone, made when there is none."""
        found = self.keys[role].get(key(f, zone))
        if found is None:
            found = len(self.classes[role])
            self.classes[role].append(NodeClass(replace(f, node_id=""), zone, []))
            self.fits[role].append(judge(f, self.requests[role]).fits)
            self.tokens[role].append(token(f, zone))
            self.keys[role][key(f, zone)] = found
        return found

    def settle(self) -> None:
        """Put the opened nodes back into classes by their facts now, as a fresh read would group them."""
        for node_id, by_role in self.opened.items():
            zone = self.zones[node_id]
            for role, f in by_role.items():
                classes, where = self.classes[role], self.where[role]
                old = where.pop(node_id, None)
                if old is not None:
                    members = classes[old].members
                    del members[bisect.bisect_left(members, node_id)]
                target = self.class_for(role, f, zone)
                bisect.insort(classes[target].members, node_id)
                where[node_id] = target
        self.opened.clear()
        self.zones.clear()


def key(facts: NodeFacts, zone: Zone) -> tuple[NodeFacts, Zone]:
    """What a class is: its facts (under no node id) and zone."""
    return replace(facts, node_id=""), zone


@lru_cache(maxsize=4096)
def token(facts: NodeFacts, zone: Zone) -> str:
    """A class's place among nodes the ranking finds equal: a digest of its facts and zone.

    The facts a request leaves unread, or that move on their own (disk left
    out of the judgement, label values, the age of the GPU facts), are left
    out, so a fresh read orders the classes as fitGroup's board does; so is
    the taint that withholds some GPUs (it names why a node does not fit,
    and decides nothing among nodes that do), so nodes withheld by different
    taints take their turn by id, as in placeGroup's window, which tells
    them apart by their pools alone (reads.read_window).
    """
    stable = replace(
        facts,
        node_id="",
        local_disk_free=None,
        local_disk_total=None,
        label_value=None,
        gpus_facts_age=None,
        taint=None,
    )
    return hashlib.blake2b(repr((stable, zone)).encode(), digest_size=8).hexdigest()


TOKEN_LENGTH = 16


def planning_id(class_token: str, node_id: str) -> str:
    """The id the planner orders a node by: its class's token, then its own id.

    ranking.node_rank's last term is the node id; through this id, among
    nodes equal on every other term, a group takes them class by class in a
    fixed order and by id within a class. Which ids a class holds then never
    decides between classes, so fitGroup may count many identical rounds at
    once (fitting.count_groups) and still count what placeGroup does.
    """
    return f"{class_token}/{node_id}"


def node_of(planning: str) -> str:
    """The node id inside a planning_id."""
    return planning[TOKEN_LENGTH + 1 :]


def _less(f: NodeFacts, wanted: PlaceRequest, took: PlaceRequest, shards: int) -> NodeFacts:
    """Another role's view of a node after `shards` shards of `took` went on it (same GPU class)."""
    gpus = shards * took.gpus_per_shard
    topology = f.topology
    if topology is not None:
        groups = topology.groups
        if wanted.nvlink_shards and took.nvlink_shards:
            groups = groups_after(groups, took.gpus_per_shard, shards)
        usable = max(0, min(topology.usable, f.free - gpus))
        usable -= usable % wanted.gpus_per_shard
        topology = replace(topology, usable=usable, groups=groups)
    return replace(f, free=f.free - gpus, topology=topology)


class Zonal:
    """A zone of a locality level as a node filter, with what it asks of each replica's request."""

    def __init__(
        self, level: LocalityLevel, name: str | None, node: str | None = None, order: str = ""
    ) -> None:
        self.level, self.name, self.node = level, name, node
        # Zones of equal score are taken in this order: the name, or a node's planning id.
        self.order = order or name or ""

    def __call__(self, node_id: str, zone: Zone) -> bool:
        level = self.level
        if level is LocalityLevel.NODE:
            return node_id == self.node
        if level is LocalityLevel.NVLINK_DOMAIN:
            return zone.domain == self.name
        if level is LocalityLevel.LABEL:
            return zone.label == self.name
        if level is LocalityLevel.FABRIC:
            return self.name in zone.fabrics
        return True

    def request(self, shape: PlaceRequest) -> PlaceRequest | None:
        """The shape as the zone asks it (FABRIC: on that fabric); None when it cannot be met there."""
        if self.level is not LocalityLevel.FABRIC:
            return shape
        if shape.fabric is not None and shape.fabric != self.name:
            return None
        return replace(shape, fabric=self.name)


def order(request: GroupRequest) -> list[tuple[str, int]]:
    """The order replicas are planned in: each kvFrom replica followed by its receivers, then the rest."""
    counts = {r.role: r.replicas for r in request.roles}
    if request.kv_from is None or request.kv_to is None:
        return [(r.role, n) for r in request.roles for n in range(r.replicas)]
    senders, receivers = counts[request.kv_from], counts[request.kv_to]
    out: list[tuple[str, int]] = []
    for i in range(senders):
        out.append((request.kv_from, i))
        out += [(request.kv_to, j) for j in range(receivers) if partner(j, senders) == i]
    kv = {request.kv_from, request.kv_to}
    out += [(r.role, n) for r in request.roles if r.role not in kv for n in range(r.replicas)]
    return out


def _zones(board: Board, level: LocalityLevel, first_role: str) -> list[Zonal]:
    if level is LocalityLevel.ANY:
        return [Zonal(level, None)]
    if level is LocalityLevel.NODE:
        # One node holds the group: one candidate per class of the first role suffices
        # (its members are equal), the smallest id.
        ids = {f.node_id for f in board.candidates(first_role, Zonal(LocalityLevel.ANY, None), 1)}
        return [Zonal(level, node_of(i), node_of(i), order=i) for i in sorted(ids)]
    zones: set[str] = set()
    every = [c.zone for cs in board.classes.values() for c in cs if c.members]
    every += list(board.zones.values())
    for zone in every:
        if level is LocalityLevel.NVLINK_DOMAIN and zone.domain is not None:
            zones.add(zone.domain)
        elif level is LocalityLevel.LABEL and zone.label is not None:
            zones.add(zone.label)
        elif level is LocalityLevel.FABRIC:
            zones.update(zone.fabrics)
    return [Zonal(level, name) for name in sorted(zones)]


def _plan_in(
    board: Board, group: GroupRequest, zonal: Zonal, anchors: Iterable[str] = ()
) -> tuple[Board, list[Member]] | Misfit:
    """Every replica of the group planned in one zone, on a fork of the board; or the first that fails."""
    trial = board.fork()
    members: list[Member] = []
    used: list[str] = list(anchors)
    by_replica: dict[tuple[str, int], list[str]] = {}
    for role, n in order(group):
        request = zonal.request(board.requests[role])
        if request is None:
            return Misfit(role, n, zonal.level, f"its shape's fabric is not {zonal.name}")
        tiers: list[set[str] | None] = []
        if role == group.kv_to and group.kv_from is not None:
            senders = group.role(group.kv_from)
            assert senders is not None
            tiers.append(set(by_replica.get((group.kv_from, partner(n, senders.replicas)), ())))
        tiers += [set(used), None]
        candidates = trial.candidates(role, zonal, max(1, request.shards))
        plan = None
        for tier in tiers:
            pool = (
                candidates
                if tier is None
                else [f for f in candidates if node_of(f.node_id) in tier]
            )
            if pool and (plan := plan_placement(pool, request)) is not None:
                break
        if plan is None:
            return Misfit(role, n, zonal.level, "no room in the zone")
        plan = replace(plan, nodes=tuple((node_of(n), k) for n, k in plan.nodes))
        trial.take(role, plan)
        nodes = [node_id for node_id, _ in plan.nodes]
        by_replica[(role, n)] = nodes
        used += [x for x in nodes if x not in used]
        members.append(Member(role, n, plan))
    return trial, members


def whereabouts(board: Board, plan: Plan) -> Whereabouts:
    return Whereabouts(tuple((n, board.zones[n]) for n, _ in plan.nodes))


def score(board: Board, group: GroupRequest, members: Sequence[Member]) -> tuple[int, int]:
    """(sum of KV path ranks, GPUs left free on the nodes used): lower is better."""
    closeness = 0
    if group.kv_from is not None and group.kv_to is not None:
        senders = [m for m in members if m.role == group.kv_from]
        receivers = [m for m in members if m.role == group.kv_to]
        senders.sort(key=lambda m: m.n)
        receivers.sort(key=lambda m: m.n)
        for i, j in kv_pairs(len(senders), len(receivers)):
            kind = path_kind(
                whereabouts(board, senders[i].plan), whereabouts(board, receivers[j].plan)
            )
            closeness += CLOSENESS[kind]
    left = 0
    for node_id in {n for m in members for n, _ in m.plan.nodes}:
        left += min(f.free for f in board.opened[node_id].values())
    return closeness, left


def plan_group(
    board: Board, group: GroupRequest, anchors: Iterable[str] = ()
) -> tuple[Board, GroupPlan] | Misfit:
    """The best plan for the whole group (the board as it leaves it), or why none fits.

    `anchors`: nodes the group already uses (scaleGroup adds close to them).
    """
    locality = group.locality
    start = LEVELS.index(locality.level)
    levels = [locality.level] if locality.hard else list(LEVELS[start:])
    if locality.label is None:
        levels = [lv for lv in levels if lv is not LocalityLevel.LABEL]
    first_role = order(group)[0][0]
    misfit: Misfit | None = None
    for k, level in enumerate(levels):
        if (
            level is LocalityLevel.NODE
            and k + 1 < len(levels)
            and not _one_node_may_hold(board, group)
        ):
            # No NODE zone can hold it: the level's Misfit is told only when it is the last.
            continue
        best: tuple[tuple[int, int, str], Board, GroupPlan] | None = None
        misfit = None
        zones = _zones(board, level, first_role)
        if locality.hard and anchors:
            # Added to a placed group: the zone it is in.
            zones = [z for z in zones if all(_holds(board, z, a) for a in anchors)]
        for zonal in zones:
            outcome = _plan_in(board, group, zonal, anchors)
            if isinstance(outcome, Misfit):
                if misfit is None or _later(group, outcome, misfit):
                    misfit = outcome
                continue
            trial, members = outcome
            points = score(trial, group, members)
            rank = (*points, zonal.order)
            if best is None or rank < best[0]:
                best = (rank, trial, GroupPlan(tuple(members), level, zonal.name, points))
        if best is not None:
            return best[1], best[2]
    if misfit is None:
        level = levels[-1]
        return Misfit(first_role, 0, level, f"no {level.value.lower().replace('_', ' ')} zone")
    return misfit


def _one_node_may_hold(board: Board, group: GroupRequest) -> bool:
    """Whether some node has as many GPUs free of each class as the group asks of it.

    A NODE zone is one node, which must then give every replica: when none
    has that much free, no NODE zone holds the group, and planning in each
    (a zone per class of node) would only find so.
    """
    asked: Counter[str] = Counter()
    for r in group.roles:
        asked[r.shape.gpu_class] += r.replicas * max(1, r.shape.shards) * r.shape.gpus_per_shard
    most: Counter[str] = Counter()
    for role, classes in board.classes.items():
        cls = board.requests[role].gpu_class
        for c in classes:
            if c.members:
                most[cls] = max(most[cls], c.facts.free)
    for by_role in board.opened.values():
        for role, f in by_role.items():
            cls = board.requests[role].gpu_class
            most[cls] = max(most[cls], f.free)
    return all(most[cls] >= gpus for cls, gpus in asked.items())


def _holds(board: Board, zonal: Zonal, node_id: str) -> bool:
    zone = board.zone_of(node_id)
    return zone is None or zonal(node_id, zone)


def _later(group: GroupRequest, a: Misfit, b: Misfit) -> bool:
    """Whether misfit `a` came further through the group's order than `b` (the closer miss is told)."""
    steps = order(group)
    return steps.index((a.role, a.n)) > steps.index((b.role, b.n))
