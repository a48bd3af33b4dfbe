"""The board a group is planned on: classes of like nodes, and the nodes a plan has opened (no database).

A class is a set of nodes that no role's read can tell apart: for every
role of the group the same facts (what judge() and the ranking read), and
the same zone. Such nodes are interchangeable for the whole group, so the
planner offers, of each class, only its first few ids (a replica uses at
most `shards` nodes, and among equal nodes the planner takes the smallest
ids): a plan costs what the classes cost, not the cluster. Classes are of
every role at once (issue 44): a node two roles see differently (an
NVSwitch board and a node of unknown topology are alike to a role without
nvlinkShards) must be offered to each, or the planner would search the
wrong half of a class.

A node a plan opens (takes a replica's shards on) keeps its facts at
opening, and the takes on it in plan order; its facts for each role are
derived from those by packing.pack, the rule the claim follows on the
GPUs it finds under the node's lock:

- roles of one GPU class that are offered the same GPUs (the same
  tolerations, or a node that withholds no GPU from either; and no
  railAligned, whose GPUs are those with a near HCA) form a view, whose
  cells are the free GPUs of each NVLink group and the rest
  (packing.cells_of); a take is packed into the cells;
- a node's GPUs of one class go to one view: another view's roles find no
  room on a node a view has taken GPUs of (which of its GPUs they lose
  would depend on GPUs the board does not know, so the plan never counts
  on it);
- a railAligned role is a view alone, its takes counted as fit counts one
  replica's (fit.after: the fit order of its own GPUs).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache

from service.scheduling.groups.packing import (
    Cells,
    Take,
    cells_of,
    leave,
    nvlink_room,
    pack,
    usable_of,
)
from service.scheduling.groups.paths import Zone
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement.fit import after
from service.scheduling.verdicts import NodeFacts, judge


@dataclass
class NodeClass:
    """Nodes no role's read could tell apart: each role's facts (absent: its read lacks them), zone, ids ascending.

    `cells`: for a group with an nvlinkShards role, per NVLink group of the
    node's free GPUs (offered without tolerations) how many and how many of
    them a PREFER_NO_SCHEDULE taint sends last, most free first, then fewest
    used last (reads._cells_sql); None when not read.
    """

    facts: dict[str, NodeFacts]
    zone: Zone
    members: list[str]
    cells: tuple[tuple[int, int], ...] | None = None


# A view of a node's GPUs (see the module's docstring): the GPU class, then
# "rail" and the role, or the tolerations ("all": a node that withholds no
# GPU from the role) and the GPUs offered.
View = tuple[object, ...]


@dataclass
class OpenNode:
    """A node a plan took shards on: its zone, its class when opened (its facts then), and the takes."""

    zone: Zone
    origin: int
    # (role, shards, the member's place in the plan), in plan order.
    takes: list[tuple[str, int, int]] = field(default_factory=list)
    # The roles' facts as the takes leave it (most room; once claimed), and
    # under planning ids: kept until the takes change.
    current: dict[str, NodeFacts] | None = None
    claimed: dict[str, NodeFacts] | None = None
    planned: dict[str, NodeFacts] = field(default_factory=dict)

    def changed(self) -> None:
        self.current = self.claimed = None
        self.planned = {}


def view_of(role: str, request: PlaceRequest, facts: NodeFacts) -> View:
    """Which of a node's views the role is in (see the module's docstring).

    Roles whatever their tolerations see a node alike when no taint
    withholds any of its GPUs or sends any last; otherwise alike only with
    the same tolerations.
    """
    if request.rail_aligned:
        return (request.gpu_class, "rail", role)
    if facts.withheld == 0 and facts.last_resort == 0:
        return (request.gpu_class, "all", facts.free)
    return (request.gpu_class, request.tolerations, facts.free)


Cells2 = tuple[tuple[int, int], ...]


def class_key(facts: dict[str, NodeFacts], zone: Zone, cells: Cells2 | None) -> tuple[object, ...]:
    """What a class is: each role's facts (under no node id), the zone, and the NVLink cells."""
    return (tuple(sorted(facts.items())), zone, cells)


@lru_cache(maxsize=65536)
def token(facts: NodeFacts, zone: Zone) -> str:
    """A role's class's place among nodes the ranking finds equal: a digest of its facts and zone.

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
    """The id the planner orders a node by: its role's token of it, then its own id.

    ranking.node_rank's last term is the node id; through this id, among
    nodes equal on every other term, a role takes them token by token in a
    fixed order and by id within one. Which ids a class holds then never
    decides between classes, so fitGroup may count many identical rounds at
    once (fitting.count_groups) and still count what placeGroup does.
    """
    return f"{class_token}/{node_id}"


def node_of(planning: str) -> str:
    """The node id inside a planning_id."""
    return planning[TOKEN_LENGTH + 1 :]


# Where a candidate came from: its class and its place among the members the
# class offered (None: a node the plan has opened).
Origin = dict[str, tuple[int, int]]


class Board:
    """What the planner sees: the roles' requests, the classes, and the nodes opened so far."""

    def __init__(
        self,
        requests: dict[str, PlaceRequest],
        classes: list[NodeClass],
        plenty: int | None = None,
    ) -> None:
        self.requests = requests
        # Facts are kept under no node id: a member's come with its id where
        # one is asked for (candidates' planning ids).
        for c in classes:
            c.facts = {r: replace(f, node_id="") for r, f in c.facts.items()}
        self.classes = classes
        # A class with this many members has as many as a plan can use
        # (reads.window_size): a window reads no more of it, so counts of
        # room take it as unbounded, on the window and the whole board alike.
        self.plenty = plenty
        self.where: dict[str, int] = {m: i for i, c in enumerate(classes) for m in c.members}
        self.fits: list[dict[str, bool]] = [
            {r: judge(f, requests[r]).fits for r, f in c.facts.items()} for c in classes
        ]
        self.tokens: list[dict[str, str]] = [
            {r: token(f, c.zone) for r, f in c.facts.items()} for c in classes
        ]
        self.keys: dict[tuple[object, ...], int] = {
            class_key(c.facts, c.zone, c.cells): i for i, c in enumerate(classes)
        }
        # A class member's facts under its planning id, by (role, class, node):
        # a class's facts never change (settle moves members, class_for adds
        # classes), and a plan asks for the same members zone after zone.
        self.planned: dict[tuple[str, int, str], NodeFacts] = {}
        # Per class, each role's view of its nodes' GPUs, and each view's cells.
        self.views: dict[int, dict[str, View]] = {}
        self.cells_of: dict[tuple[int, View], tuple[Cells, Cells | None, bool]] = {}
        # The roles' facts of a node of a class with these takes, in order (Board._derive).
        self.derived: dict[tuple[object, ...], dict[str, NodeFacts]] = {}
        self.opened: dict[str, OpenNode] = {}

    def fork(self) -> Board:
        """A board that shares the classes and opens nodes of its own."""
        other = Board.__new__(Board)
        other.requests, other.classes, other.where = self.requests, self.classes, self.where
        other.fits, other.tokens, other.keys = self.fits, self.tokens, self.keys
        other.planned, other.plenty = self.planned, self.plenty
        other.views, other.cells_of, other.derived = self.views, self.cells_of, self.derived
        other.opened = {
            n: OpenNode(o.zone, o.origin, list(o.takes)) for n, o in self.opened.items()
        }
        return other

    def unopened(self, i: int) -> int:
        """How many members of class i a plan may still open, as far as counting room goes."""
        members = self.classes[i].members
        if self.plenty is not None and len(members) >= self.plenty:
            return 1 << 30
        return len(members) - sum(1 for o in self.opened.values() if o.origin == i)

    def zone_of(self, node_id: str) -> Zone | None:
        opened = self.opened.get(node_id)
        if opened is not None:
            return opened.zone
        i = self.where.get(node_id)
        return None if i is None else self.classes[i].zone

    def facts_of(self, node_id: str, role: str) -> NodeFacts | None:
        """The role's facts of the node as the plan so far leaves it (under no node id)."""
        opened = self.opened.get(node_id)
        if opened is not None:
            return self._current(opened).get(role)
        i = self.where.get(node_id)
        return None if i is None else self.classes[i].facts.get(role)

    def candidates(
        self, role: str, keep: Callable[[str, Zone], bool], per_class: int, node: str | None = None
    ) -> tuple[list[NodeFacts], Origin]:
        """The nodes a replica of `role` may be planned on in the zone: opened ones, and each class's first ids.

        Under their planning ids (planning_id), with where each came from.
        `node`: a NODE zone's one node.
        """
        found = []
        for node_id, opened in self.opened.items():
            if not keep(node_id, opened.zone):
                continue
            f = opened.planned.get(role)
            if f is None:
                current = self._current(opened).get(role)
                if current is None:
                    continue
                planning = planning_id(token(current, opened.zone), node_id)
                f = opened.planned[role] = replace(current, node_id=planning)
            found.append(f)
        origin: Origin = {}
        if node is not None:
            # One node's zone: its class by lookup, not a walk over every class.
            i = self.where.get(node)
            if i is not None and node not in self.opened and self.fits[i].get(role):
                f = self._planned(role, i, node)
                found.append(f)
                origin[f.node_id] = (i, 0)
            return found, origin
        for i, c in enumerate(self.classes):
            # Below NODE a zone is a fact of the class: one test for all its members.
            if not self.fits[i].get(role) or not c.members or not keep(c.members[0], c.zone):
                continue
            taken = 0
            for node_id in c.members:
                if taken == per_class:
                    break
                if node_id in self.opened:
                    continue
                f = self._planned(role, i, node_id)
                found.append(f)
                origin[f.node_id] = (i, taken)
                taken += 1
        return found, origin

    def _planned(self, role: str, i: int, node_id: str) -> NodeFacts:
        """Class i's facts of the role for a member, under its planning id."""
        facts = self.planned.get((role, i, node_id))
        if facts is None:
            planning = planning_id(self.tokens[i][role], node_id)
            facts = self.planned[(role, i, node_id)] = replace(
                self.classes[i].facts[role], node_id=planning
            )
        return facts

    def take(self, role: str, nodes: tuple[tuple[str, int], ...], member: int) -> list[str]:
        """A replica's shards taken on its nodes (opening those not yet opened): the nodes it opened."""
        opened_now = []
        for node_id, shards in nodes:
            opened = self.opened.get(node_id)
            if opened is None:
                i = self.where[node_id]
                opened = self.opened[node_id] = OpenNode(self.classes[i].zone, i)
                opened_now.append(node_id)
            opened.takes.append((role, shards, member))
            opened.changed()
        return opened_now

    def untake(self, nodes: tuple[tuple[str, int], ...], opened_now: list[str]) -> None:
        """Undo the last take (take's answer is `opened_now`)."""
        for node_id, _ in nodes:
            opened = self.opened[node_id]
            opened.takes.pop()
            opened.changed()
        for node_id in opened_now:
            del self.opened[node_id]

    def state(self) -> tuple[object, ...]:
        """The opened nodes as the rest of a plan sees them: per node its class and takes, ids aside.

        The members a class offers are its first ids not yet opened, so the
        opened members of a class are always its first ones, and two plans
        whose nodes differ only by which like node took which take leave the
        same room: the search remembers a state it found no plan from.
        """
        return tuple(
            sorted(
                (o.origin, tuple(sorted((r, k) for r, k, _ in o.takes)))
                for o in self.opened.values()
            )
        )

    def view_of(self, opened: OpenNode) -> dict[str, View]:
        """Each role's view of the node's GPUs (the module's docstring): a fact of its class."""
        views = self.views.get(opened.origin)
        if views is None:
            facts = self.classes[opened.origin].facts
            views = self.views[opened.origin] = {
                r: view_of(r, self.requests[r], f) for r, f in facts.items()
            }
        return views

    def cells(self, opened: OpenNode, view: View) -> tuple[Cells, Cells | None, bool]:
        """The view's cells on the node as opened, how many GPUs of each are used last, and whether they are its NVLink groups.

        The GPUs used last per cell are known where the class's NVLink cells
        were read (NodeClass.cells, for roles without tolerations) or the
        view is one cell; None otherwise.
        """
        found = self.cells_of.get((opened.origin, view))
        if found is None:
            c = self.classes[opened.origin]
            roles = [r for r, v in self.view_of(opened).items() if v == view]
            first = c.facts[roles[0]]
            free, last = first.free, first.last_resort
            found = (free,), (last,), False
            for r in roles:
                topology = c.facts[r].topology
                if self.requests[r].nvlink_shards and topology is not None and topology.known:
                    plain = not any(self.requests[x].tolerating for x in roles)
                    known = c.cells
                    if (
                        plain
                        and known is not None
                        and sum(t for t, _ in known) == sum(topology.groups)
                    ):
                        totals = (*(t for t, _ in known), free - sum(t for t, _ in known))
                        lasts = (*(x for _, x in known), last - sum(x for _, x in known))
                        found = totals, lasts, True
                    else:
                        found = cells_of(topology.groups, free), None, True
                    break
            self.cells_of[(opened.origin, view)] = found
        return found

    def takes_of(self, opened: OpenNode) -> dict[View, tuple[Take, ...]]:
        """The takes on the node by view, in plan order."""
        views = self.view_of(opened)
        found: dict[View, list[Take]] = {}
        for r, k, _ in opened.takes:
            request = self.requests[r]
            found.setdefault(views[r], []).append(
                Take(request.gpus_per_shard, k, request.nvlink_shards)
            )
        return {v: tuple(t) for v, t in found.items()}

    def _current(self, opened: OpenNode) -> dict[str, NodeFacts]:
        if opened.current is None:
            opened.current = self._derive(opened, final=False)
        return opened.current

    def final_facts(self, node_id: str) -> dict[str, NodeFacts]:
        """Each role's facts of an opened node once its takes are claimed, as a fresh read would give them.

        The takes packed the preferred way (packing.pack), as the claim packs
        them: the cells that packing leaves.
        """
        opened = self.opened[node_id]
        if opened.claimed is None:
            opened.claimed = self._derive(opened, final=True)
        return opened.claimed

    def final_cells(self, node_id: str) -> Cells2 | None:
        """The class's NVLink cells of an opened node once its takes are claimed (NodeClass.cells).

        The cells the preferred packing leaves, where the view that took
        GPUs packed them over its NVLink groups with their GPUs used last
        known; unchanged where nothing took GPUs of the class; None where
        GPUs were taken in a way the cells cannot follow.
        """
        opened = self.opened[node_id]
        known = self.classes[opened.origin].cells
        if not known:
            return known
        by_view = self.takes_of(opened)
        for view, takes in by_view.items():
            if view[1] == "rail":
                return None
            cells, last, grouped = self.cells(opened, view)
            if not grouped or last is None:
                return None
            packed = pack(cells, takes)
            assert packed is not None, "a plan packs every take it made"
            left, left_last = leave(cells, last, packed[1])
            return tuple(
                sorted(
                    ((t, x) for t, x in zip(left[:-1], left_last[:-1], strict=True) if t > 0),
                    key=lambda c: (-c[0], c[1]),
                )
            )
        return known

    def _derive(self, opened: OpenNode, final: bool) -> dict[str, NodeFacts]:
        """The roles' facts of an opened node with its takes (final: as claimed; else: the most room left)."""
        key = (opened.origin, tuple((r, k) for r, k, _ in opened.takes), final)
        found = self.derived.get(key)
        if found is not None:
            return found
        views = self.view_of(opened)
        by_view = self.takes_of(opened)
        out: dict[str, NodeFacts] = {}
        for role, base in self.classes[opened.origin].facts.items():
            request = self.requests[role]
            view = views[role]
            others = [v for v in by_view if v != view and v[0] == request.gpu_class]
            if others:
                used = sum(t.gpus for v in others for t in by_view[v])
                out[role] = _less(base, used) if final else _no_room(base)
            elif view not in by_view:
                out[role] = base
            elif view[1] == "rail":
                shards = sum(t.shards for t in by_view[view])
                out[role] = after(base, request, shards)
            else:
                cells, last, grouped = self.cells(opened, view)
                out[role] = _packed_after(base, request, cells, last, grouped, by_view[view], final)
        self.derived[key] = out
        return out

    def class_for(self, facts: dict[str, NodeFacts], zone: Zone, cells: Cells2 | None) -> int:
        """The index of the class with these facts (under no node id), zone and cells, made when there is none."""
        key = class_key(facts, zone, cells)
        found = self.keys.get(key)
        if found is None:
            found = len(self.classes)
            self.classes.append(NodeClass(dict(facts), zone, [], cells))
            self.fits.append({r: judge(f, self.requests[r]).fits for r, f in facts.items()})
            self.tokens.append({r: token(f, zone) for r, f in facts.items()})
            self.keys[key] = found
        return found

    def settle(self) -> None:
        """Put the opened nodes back into classes by their facts once claimed, as a fresh read would group them."""
        for node_id, opened in self.opened.items():
            old = self.where.pop(node_id, None)
            if old is not None:
                members = self.classes[old].members
                del members[bisect.bisect_left(members, node_id)]
            target = self.class_for(
                self.final_facts(node_id), opened.zone, self.final_cells(node_id)
            )
            bisect.insort(self.classes[target].members, node_id)
            self.where[node_id] = target
        self.opened.clear()


def _packed_after(
    base: NodeFacts,
    request: PlaceRequest,
    cells: Cells,
    last: Cells | None,
    grouped: bool,
    takes: tuple[Take, ...],
    final: bool,
) -> NodeFacts:
    """A role's facts after its view's takes: free GPUs fewer, an nvlinkShards role's groups as packed.

    Final: the cells the preferred packing leaves (what the claim leaves),
    and of each cell's GPUs used last those its other GPUs did not cover
    (a claim takes a cell's other GPUs first); otherwise the most room any
    packing leaves the role (packing.nvlink_room), GPUs used last counted
    as if taken after every other.
    """
    used = sum(t.gpus for t in takes)
    topology = base.topology
    clean = base.free - base.last_resort
    last_resort = base.last_resort - max(0, used - clean)
    if final:
        packed = pack(cells, takes)
        assert packed is not None, "a plan packs every take it made"
        left = packed[1]
        if last is not None:
            last_resort = sum(leave(cells, last, left)[1])
    if topology is not None:
        per = request.gpus_per_shard
        if request.nvlink_shards and grouped:
            if final:
                room = usable_of(left[:-1], per) // per
            else:
                room, left = nvlink_room(cells, takes, per)
            groups = tuple(sorted((g for g in left[:-1] if g > 0), reverse=True))
            topology = replace(topology, groups=groups, usable=room * per)
        elif not request.nvlink_shards:
            # sameNvlinkDomain alone: every free GPU is usable, whole shards only.
            topology = replace(topology, usable=(base.free - used) // per * per)
    return replace(base, free=base.free - used, topology=topology, last_resort=last_resort)


def _no_room(f: NodeFacts) -> NodeFacts:
    """A node another view of the class took GPUs of: none for this role in this plan."""
    topology = f.topology
    if topology is not None:
        topology = replace(topology, usable=0, groups=())
    return replace(f, free=0, withheld=0, topology=topology, last_resort=0)


def _less(f: NodeFacts, used: int) -> NodeFacts:
    """A role's facts after another view took `used` GPUs of its class: at least that many fewer.

    Which GPUs they were is not on the board; counting every one of them
    gone is the least this role can be left.
    """
    free = max(0, f.free - used)
    topology = f.topology
    if topology is not None:
        topology = replace(topology, usable=min(topology.usable, free))
    return replace(f, free=free, topology=topology, last_resort=min(f.last_resort, free))
