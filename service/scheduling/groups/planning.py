"""Where a group's replicas would go on a board already read: a complete search in the ranking's order (no database).

Every replica is planned by place's own planner (plan.plan_placement, which
judges each node and takes them in service/scheduling/ranking.py's order),
over the board (board.Board: classes of like nodes, and the nodes this plan
has opened):

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

The search (issue 44). Planning one replica at a time and never going back
said "no room" when a group fitted: three prefill replicas that each need an
NVLink pair and their decode filled a board's pairs with a decode and left
the third prefill none, while the decode fitted on a node without NVLink. So
within a zone the replicas are planned depth first: each replica's first
choice is what place's planner picks (the ranking's best, tier by tier), and
when the rest of the group finds no room after it, its next choice is tried,
then the next, through every way the replica can go (every node of each
class with room, every spread of its shards over nodes of one fabric), so a
zone holds the group exactly when the search finds a plan there. Wherever
the first choices fit, the plan is the one planning replica by replica
found. Three things keep it small: like nodes are offered once (the first
ids of a class: board.Board.candidates), a state of the board the search
found no plan from is remembered (board.Board.state: which take went to
which of two like nodes changes nothing), and a zone whose nodes have fewer
GPUs or shards than the group asks is refused before any replica is tried.

The search is bounded: at most SEARCH_BOUND replica plans are tried per call
(every level and zone together). Reaching the bound is Bounded, never "no
room": placeGroup refuses with SEARCH_BOUND and holds nothing, fitGroup
stops counting there and says so, explainGroupPlacement says so
(docs/scheduler/groups.md).

The same function answers placeGroup, fitGroup (round after round on one
board) and explainGroupPlacement, so they cannot disagree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from service.scheduling.groups.board import Board, NodeClass, Origin, node_of
from service.scheduling.groups.packing import Take
from service.scheduling.groups.paths import (
    CLOSENESS,
    Whereabouts,
    Zone,
    kv_pairs,
    partner,
    path_kind,
)
from service.scheduling.groups.requests import GroupRequest, LocalityLevel
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement.plan import Plan, plan_placement
from service.scheduling.ranking import node_rank
from service.scheduling.verdicts import NodeFacts, judge

LEVELS = tuple(LocalityLevel)

# The most replica plans one plan_group call tries, over every level and
# zone. Far above what the searches of the tests' clusters and the 10,000-node
# benchmark take (tests/scheduling/test_group_exhaustive.py counts them); a
# group that reaches it is answered Bounded, not "no room".
SEARCH_BOUND = 20_000


@dataclass(frozen=True)
class Member:
    role: str
    n: int
    plan: Plan


@dataclass(frozen=True)
class NodeShare:
    """What a plan puts on one node's view of its GPUs, for the claim to pack as the plan did.

    `rail`: a railAligned role's own GPUs (the claim takes its fit order);
    otherwise the takes are packed over the view's cells (`grouped`: its
    NVLink groups are cells) by packing.pack. `takes`: the index of each
    member in GroupPlan.members and its take, in plan order.
    """

    node_id: str
    rail: bool
    grouped: bool
    takes: tuple[tuple[int, Take], ...]


@dataclass(frozen=True)
class GroupPlan:
    members: tuple[Member, ...]
    # The locality level the plan reaches and its zone's name (None: ANY).
    level: LocalityLevel
    zone: str | None
    score: tuple[int, int]
    shares: tuple[NodeShare, ...] = ()


@dataclass(frozen=True)
class Misfit:
    """No plan: the role whose replica found no room, the furthest any plan got, and why."""

    role: str
    n: int
    level: LocalityLevel
    message: str


@dataclass(frozen=True)
class Bounded:
    """The search tried SEARCH_BOUND replica plans without finding a plan or proving there is none."""

    level: LocalityLevel
    zone: str | None
    trials: int

    @property
    def message(self) -> str:
        where = f" zone {self.zone}" if self.zone is not None else ""
        return (
            f"the planner stopped after trying {self.trials} replica plans (its bound) at "
            f"locality {self.level.value}{where} without finding a placement or proving that "
            "there is none: this is not 'no room'; ask for fewer replicas, another locality, "
            "or retry when the cluster has changed"
        )


class _BoundReached(Exception):
    """The search spent its trials (Budget)."""


class Budget:
    """The replica plans a plan_group call may still try."""

    def __init__(self, trials: int) -> None:
        self.trials = trials
        self.spent = 0

    def spend(self) -> None:
        self.spent += 1
        if self.spent > self.trials:
            raise _BoundReached


class Zonal:
    """A zone of a locality level as a node filter, with what it asks of each replica's request."""

    def __init__(
        self, level: LocalityLevel, name: str | None, node: str | None = None, order: str = ""
    ) -> None:
        self.level, self.name, self.node = level, name, node
        # Zones of equal score are taken in this order: the name, or a node's planning id.
        self.order = order or name or ""
        self.asked: dict[PlaceRequest, PlaceRequest] = {}

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

    def request(self, shape: PlaceRequest) -> PlaceRequest:
        """The shape as the zone asks it: in a FABRIC zone, a spread on that fabric.

        Every node of a FABRIC zone is on its fabric, so a replica spread over
        some of them can always use it. A shape that names another fabric
        keeps it: its nodes must be on both (a node on ib-a and ib-b holds an
        ib-b replica of a group in zone ib-a).
        """
        if self.level is not LocalityLevel.FABRIC or shape.fabric is not None:
            return shape
        asked = self.asked.get(shape)
        if asked is None:
            asked = self.asked[shape] = replace(shape, fabric=self.name)
        return asked


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
        # One node holds the group: one candidate per class of the first role
        # suffices (its members are alike for every role), the smallest id.
        found, _ = board.candidates(first_role, Zonal(LocalityLevel.ANY, None), 1)
        ids = {f.node_id for f in found}
        return [Zonal(level, node_of(i), node_of(i), order=i) for i in sorted(ids)]
    zones: set[str] = set()
    every = [c.zone for c in board.classes if c.members]
    every += [o.zone for o in board.opened.values()]
    for zone in every:
        if level is LocalityLevel.NVLINK_DOMAIN and zone.domain is not None:
            zones.add(zone.domain)
        elif level is LocalityLevel.LABEL and zone.label is not None:
            zones.add(zone.label)
        elif level is LocalityLevel.FABRIC:
            zones.update(zone.fabrics)
    return [Zonal(level, name) for name in sorted(zones)]


def _domain_of(f: NodeFacts, request: PlaceRequest) -> str | None:
    return f.topology.domain if request.same_nvlink_domain and f.topology else None


def plans_of(pool: Sequence[NodeFacts], request: PlaceRequest, origin: Origin) -> Iterator[Plan]:
    """Every way a replica can go on these nodes, place's own plan first, then in the ranking's order.

    Whole on one node (the nodes by ranking.node_rank), then, for a replica
    of several shards, spread over nodes of one fabric (and, sameNvlinkDomain,
    one domain), each node taking as many of the shards as it can first. Of
    a class's members (`origin`) only the first is offered whole, and a
    spread uses its members in order, each taking no more than the one
    before: like nodes in another order would be the same plan again.
    Repeats are left to the caller.
    """
    first = plan_placement(pool, request)
    if first is not None:
        yield first
    fitting = [f for f in pool if judge(f, request).fits]
    shards = request.shards
    whole = [
        f for f in fitting if f.room(request) >= shards and origin.get(f.node_id, (0, 0))[1] == 0
    ]
    for f in sorted(whole, key=lambda f: node_rank(f, request, request.gpus)):
        yield Plan(None, ((f.node_id, shards),), _domain_of(f, request))
    if shards == 1:
        return
    fabrics = (
        [request.fabric] if request.fabric else sorted({x for f in fitting for x in f.fabrics})
    )
    domains: list[str | None] = [None]
    if request.same_nvlink_domain:
        domains = [*sorted({d for f in fitting if (d := _domain_of(f, request)) is not None})]
    for domain in domains:
        for fabric in fabrics:
            members = sorted(
                (
                    f
                    for f in fitting
                    if fabric in f.fabrics and (domain is None or _domain_of(f, request) == domain)
                ),
                key=lambda f: node_rank(f, request, request.gpus_per_shard),
            )
            yield from _spreads(members, request, origin, fabric, domain)


def _spreads(
    members: Sequence[NodeFacts],
    request: PlaceRequest,
    origin: Origin,
    fabric: str,
    domain: str | None,
) -> Iterator[Plan]:
    """Every spread of the replica's shards over two or more of `members` (in ranking order), most first."""
    rooms = [f.room(request) for f in members]
    after = [sum(rooms[j:]) for j in range(len(members) + 1)]
    place = {origin[f.node_id]: j for j, f in enumerate(members) if f.node_id in origin}
    counts = [0] * len(members)

    def go(j: int, left: int) -> Iterator[Plan]:
        if left == 0:
            used = tuple((members[x].node_id, counts[x]) for x in range(j) if counts[x])
            if len(used) >= 2:
                yield Plan(fabric, used, domain)
            return
        if j == len(members) or after[j] < left:
            return
        most = min(rooms[j], left)
        came = origin.get(members[j].node_id)
        if came is not None and came[1] > 0:
            before = place.get((came[0], came[1] - 1))
            most = min(most, counts[before]) if before is not None else 0
        for k in range(most, -1, -1):
            counts[j] = k
            yield from go(j + 1, left - k)
        counts[j] = 0

    yield from go(0, request.shards)


def _room_in(board: Board, group: GroupRequest, zonal: Zonal) -> Misfit | None:
    """Why the zone cannot hold the group by counting alone, or None (then the search decides).

    Per role, the shards its nodes in the zone have room for; per GPU class,
    their free GPUs: a zone with fewer than the group asks holds no plan.
    """
    asked: dict[str, int] = {}
    for r in group.roles:
        request = zonal.request(board.requests[r.role])
        asked[request.gpu_class] = asked.get(request.gpu_class, 0) + r.replicas * request.gpus
        room = 0
        for node_id, opened in board.opened.items():
            f = board.facts_of(node_id, r.role)
            if f is not None and zonal(node_id, opened.zone) and judge(f, request).fits:
                room += f.room(request)
        for i, c in _zone_classes(board, zonal):
            f = c.facts.get(r.role)
            # The zone's nodes are on its fabric: the zone's request fits where the shape does.
            if f is not None and board.fits[i].get(r.role):
                count = 1 if zonal.node is not None else board.unopened(i)
                room += count * f.room(request)
        if room < r.replicas * request.shards:
            n = min(r.replicas - 1, room // request.shards)
            return Misfit(r.role, n, zonal.level, "no room in the zone")
    for cls in asked:
        most: dict[str, int] = {}
        for role, request in board.requests.items():
            if request.gpu_class != cls:
                continue
            for node_id, opened in board.opened.items():
                f = board.facts_of(node_id, role)
                if f is not None and zonal(node_id, opened.zone):
                    most[node_id] = max(most.get(node_id, 0), f.free)
        total = sum(most.values())
        for i, c in _zone_classes(board, zonal):
            frees = [f.free for r, f in c.facts.items() if board.requests[r].gpu_class == cls]
            count = 1 if zonal.node is not None else board.unopened(i)
            total += count * max(frees, default=0)
        if total < asked[cls]:
            role = next(r.role for r in group.roles if r.shape.gpu_class == cls)
            return Misfit(role, 0, zonal.level, f"no room in the zone: {total} {cls} free")
    return None


def _zone_classes(board: Board, zonal: Zonal) -> Iterator[tuple[int, NodeClass]]:
    """The classes with members in the zone not yet opened (a NODE zone: its node's class)."""
    if zonal.node is not None:
        i = board.where.get(zonal.node)
        if i is not None and zonal.node not in board.opened:
            yield i, board.classes[i]
        return
    for i, c in enumerate(board.classes):
        if c.members and zonal(c.members[0], c.zone):
            yield i, c


def _search(
    board: Board,
    group: GroupRequest,
    steps: Sequence[tuple[str, int]],
    zonal: Zonal,
    anchors: Iterable[str],
    budget: Budget,
) -> tuple[Board, list[Member]] | Misfit:
    """Every replica of the group planned in one zone, on a fork of the board; or why none fits there.

    Depth first over order(group), each replica's plans in plans_of's order,
    tier by tier (the module's docstring).
    """
    trial = board.fork()
    unfit = _room_in(trial, group, zonal)
    if unfit is not None:
        return unfit
    members: list[Member] = []
    used: list[str] = list(anchors)
    by_replica: dict[tuple[str, int], list[str]] = {}
    failed: set[tuple[int, tuple[object, ...]]] = set()
    furthest = [0]
    senders = group.role(group.kv_from) if group.kv_from is not None else None

    def tiers(role: str, n: int) -> list[set[str] | None]:
        found: list[set[str] | None] = []
        if role == group.kv_to and senders is not None:
            found.append(set(by_replica.get((senders.role, partner(n, senders.replicas)), ())))
        return [*found, set(used), None]

    def choices(role: str, n: int, request: PlaceRequest) -> Iterator[Plan]:
        candidates, origin = trial.candidates(role, zonal, max(1, request.shards), zonal.node)
        ids = [node_of(f.node_id) for f in candidates]
        seen: set[tuple[tuple[str, int], ...]] = set()
        for tier in tiers(role, n):
            pool = (
                candidates
                if tier is None
                else [f for f, x in zip(candidates, ids, strict=True) if x in tier]
            )
            if not pool:
                continue
            for plan in plans_of(pool, request, origin):
                if plan.nodes in seen:
                    continue
                seen.add(plan.nodes)
                yield plan

    def deeper(i: int) -> bool:
        if i == len(steps):
            return True
        # The board's state is the same when every choice here has been
        # undone: computed only when the search has failed somewhere.
        if failed and (i, trial.state()) in failed:
            return False
        role, n = steps[i]
        request = zonal.request(trial.requests[role])
        for plan in choices(role, n, request):
            budget.spend()
            nodes = tuple((node_of(x), k) for x, k in plan.nodes)
            opened_now = trial.take(role, nodes, len(members))
            members.append(Member(role, n, Plan(plan.fabric, nodes, plan.domain)))
            mine = [x for x, _ in nodes]
            fresh = [x for x in dict.fromkeys(mine) if x not in used]
            by_replica[(role, n)] = mine
            used.extend(fresh)
            if deeper(i + 1):
                return True
            del used[len(used) - len(fresh) :]
            del by_replica[(role, n)]
            members.pop()
            trial.untake(nodes, opened_now)
        failed.add((i, trial.state()))
        furthest[0] = max(furthest[0], i)
        return False

    if deeper(0):
        return trial, members
    role, n = steps[furthest[0]]
    return Misfit(role, n, zonal.level, "no room in the zone")


def whereabouts(board: Board, plan: Plan) -> Whereabouts:
    return Whereabouts(tuple((n, board.opened[n].zone) for n, _ in plan.nodes))


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
        left += min(f.free for f in board.final_facts(node_id).values())
    return closeness, left


def shares(board: Board) -> tuple[NodeShare, ...]:
    """Per opened node and view, the takes the claim packs (GroupPlan.shares)."""
    found = []
    for node_id, opened in board.opened.items():
        views = board.view_of(opened)
        for view, takes in board.takes_of(opened).items():
            members = [m for r, _, m in opened.takes if views[r] == view]
            rail = view[1] == "rail"
            grouped = False if rail else board.cells(opened, view)[2]
            found.append(NodeShare(node_id, rail, grouped, tuple(zip(members, takes, strict=True))))
    return tuple(found)


def plan_group(
    board: Board,
    group: GroupRequest,
    anchors: Iterable[str] = (),
    *,
    bound: int | None = None,
) -> tuple[Board, GroupPlan] | Misfit | Bounded:
    """The best plan for the whole group (the board as it leaves it), why none fits, or Bounded.

    `anchors`: nodes the group already uses (scaleGroup adds close to them).
    `bound`: the most replica plans tried (SEARCH_BOUND when not given).
    """
    anchors = list(anchors)
    locality = group.locality
    start = LEVELS.index(locality.level)
    levels = [locality.level] if locality.hard else list(LEVELS[start:])
    if locality.label is None:
        levels = [lv for lv in levels if lv is not LocalityLevel.LABEL]
    steps = order(group)
    first_role = steps[0][0]
    budget = Budget(SEARCH_BOUND if bound is None else bound)
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
            try:
                outcome = _search(board, group, steps, zonal, anchors, budget)
            except _BoundReached:
                return Bounded(level, zonal.name, budget.trials)
            if isinstance(outcome, Misfit):
                if misfit is None or _later(steps, outcome, misfit):
                    misfit = outcome
                continue
            trial, members = outcome
            points = score(trial, group, members)
            rank = (*points, zonal.order)
            if best is None or rank < best[0]:
                best = (rank, trial, GroupPlan(tuple(members), level, zonal.name, points))
        if best is not None:
            _, trial, plan = best
            return trial, replace(plan, shares=shares(trial))
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
    for c in board.classes:
        if c.members:
            for role, f in c.facts.items():
                cls = board.requests[role].gpu_class
                most[cls] = max(most[cls], f.free)
    for node_id in board.opened:
        for role, f in board.final_facts(node_id).items():
            cls = board.requests[role].gpu_class
            most[cls] = max(most[cls], f.free)
    return all(most[cls] >= gpus for cls, gpus in asked.items())


def _holds(board: Board, zonal: Zonal, node_id: str) -> bool:
    zone = board.zone_of(node_id)
    return zone is None or zonal(node_id, zone)


def _later(steps: Sequence[tuple[str, int]], a: Misfit, b: Misfit) -> bool:
    """Whether misfit `a` came further through the group's order than `b` (the closer miss is told)."""
    return steps.index((a.role, a.n)) > steps.index((b.role, b.n))
