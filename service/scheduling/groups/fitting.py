"""fitGroup: how many more whole groups fit now, by placeGroup's own planner, writing nothing.

Exact against placeGroup called one by one: the board is read as placeGroup
reads it (reads.read_board), planned by the same function
(planning.plan_group), and each plan applied before the next as the claims
would leave the nodes (Board.take, then Board.settle regroups the nodes it
opened as a fresh read would). The planner takes nodes in
service/scheduling/ranking.py's order and draws nothing at random, so the
same cluster gives the same count on every call.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime

from service.database.connections import Connection
from service.scheduling.groups.board import Board
from service.scheduling.groups.charging import asked_by_class
from service.scheduling.groups.planning import Bounded, GroupPlan, Misfit, plan_group
from service.scheduling.groups.reads import read_board
from service.scheduling.groups.requests import GroupRequest, validate_group
from service.scheduling.rejections import Rejection, refused_for_charge
from service.scheduling.tenancy.charges import UnknownTenant
from service.scheduling.tenancy.headroom import headroom
from service.scheduling.verdicts import VerdictCode, judge

# fitGroup names no group; placeGroup's checks want some id.
SHAPE_ID = "fit"
# Far above any cluster's count (a 100k-node cluster of 8-GPU nodes holds
# 800k one-GPU groups at most); bounds a count that could not end.
MAX_GROUPS = 1_000_000


@dataclass(frozen=True)
class GroupFit:
    groups: int
    # What limits the next group: the role that found no room first, at which
    # locality level, and that role's verdicts over the nodes as the counted
    # groups leave them (most nodes first).
    limited_by: tuple[str, ...]


def _limits(board: Board, group: GroupRequest, misfit: Misfit | Bounded) -> tuple[str, ...]:
    if isinstance(misfit, Bounded):
        return (f"search bound reached: {misfit.message}",)
    request = board.requests[misfit.role]
    codes: Counter[VerdictCode] = Counter()
    for c in board.classes:
        f = c.facts.get(misfit.role)
        if f is not None:
            codes[judge(f, request).code] += len(c.members)
    hard = " hard" if group.locality.hard else ""
    said = [f"role {misfit.role}: {misfit.message} at locality {misfit.level.value}{hard}"]
    for code, nodes in sorted(codes.items(), key=lambda item: (-item[1], item[0].value)):
        plural = "" if nodes == 1 else "s"
        said.append(f"role {misfit.role}: {code.value} on {nodes} node{plural}")
    return tuple(said)


def count_groups(
    board: Board, group: GroupRequest, *, repeats: bool = True
) -> tuple[int, Misfit | Bounded, Board]:
    """Groups plan_group places one after another on the board, why the next does not fit, the board after.

    Round by round, except that a round whose repeats provably plan the same
    is applied as many times as that stays true at once (_repeats): on a
    cluster of thousands of like nodes most rounds are such repeats.
    `repeats=False` plans every round (what the shortcut must equal).
    """
    count = 0
    while count < MAX_GROUPS:
        outcome = plan_group(board, group)
        if isinstance(outcome, Misfit | Bounded):
            return count, outcome, board
        trial, plan = outcome
        moves = _moves(board, trial, plan)
        more = _repeats(board, group, moves) if repeats else 0
        trial.settle()
        board = trial
        count += 1
        if more:
            _apply(board, moves, more)
            count += more
    raise AssertionError("fitGroup counted past MAX_GROUPS")


# A node a plan used: the class it was in and the class it goes to.
Move = tuple[int, int]


def _moves(board: Board, trial: Board, plan: GroupPlan) -> list[Move]:
    """Each node the plan uses (in order of first use), with its class before and after."""
    nodes = list(dict.fromkeys(n for m in plan.members for n, _ in m.plan.nodes))
    moves = []
    for node_id in nodes:
        zone = trial.opened[node_id].zone
        target = board.class_for(trial.final_facts(node_id), zone, trial.final_cells(node_id))
        moves.append((board.where[node_id], target))
    return moves


def _repeats(board: Board, group: GroupRequest, moves: list[Move]) -> int:
    """How many more rounds after this one provably plan the same as it: 0 when none does.

    The planner orders nodes by their facts and then by planning_id (the
    role's token of the class, then the id): a round's choices depend on
    which classes exist, which are fitting, and (through the candidates each
    class offers, board.Board.candidates, and the counts of room,
    planning._room_in) on how many members a class has. Two bounds:

    - A class the round takes nodes from may shrink while it keeps more
      than the round opened of it and one replica's shards: fewer like nodes
      never give the search a plan it did not have, the plan it found is
      still there (its nodes are the class's first), and every choice tried
      before it still fails, so the same plan is found again.
    - A class the round puts nodes into may grow only while it already
      offers as many as any path of the search can look at (the window's
      size: every node the group could open, and one replica's shards
      more); more like nodes could otherwise give a failed path room. One
      that fits no role offers none.

    And for each role every class's token must be its own (two classes of
    one token would be told apart by node id).
    """
    opened = sum(r.replicas * max(1, r.shape.shards) for r in group.roles)
    most_shards = max(max(1, r.shards) for r in board.requests.values())
    floor = len(moves) + most_shards + 1
    plenty = opened + most_shards
    taken: Counter[int] = Counter(source for source, _ in moves)
    landed: Counter[int] = Counter(target for _, target in moves)
    live = [i for i, c in enumerate(board.classes) if c.members or i in landed]
    for role in board.requests:
        tokens = [board.tokens[i][role] for i in live if role in board.tokens[i]]
        if len(set(tokens)) != len(tokens):
            return 0
    for target in landed:
        if target in taken:
            return 0  # a node staying in its class: the round changed nothing countable
        size = len(board.classes[target].members)
        if any(board.fits[target].values()) and size < plenty:
            return 0
    repeats = MAX_GROUPS
    for source, per_round in taken.items():
        # This round takes its share first; each repeat takes as much again.
        left = len(board.classes[source].members) - per_round
        repeats = min(repeats, (left - floor) // per_round)
    return max(0, repeats)


def _apply(board: Board, moves: list[Move], repeats: int) -> None:
    """The moves of one round, `repeats` times: each takes the smallest ids of its class, as the planner would."""
    for source, target in moves:
        left = board.classes[source]
        moved = left.members[:repeats]
        if len(moved) < repeats:
            raise AssertionError("a repeated round found too few nodes in its class")
        left.members = left.members[repeats:]
        landed = board.classes[target]
        landed.members = sorted(landed.members + moved)
        board.where.update(dict.fromkeys(moved, target))


async def fit_group(
    conn: Connection, group: GroupRequest, *, at: datetime | None = None
) -> GroupFit | Rejection:
    """How many more whole groups of this spec fit now; a spec placeGroup would refuse is its Rejection.

    `at`: at that later instant (availability.gpu_offered_at). Within the tenant's limit: no more groups than its room under the limit
    of each class holds (placeGroup charges a group as one), and when that
    is what stops the next group, limitedBy says so first.
    """
    group = replace(group, group_id=group.group_id or SHAPE_ID)
    problem = validate_group(group)
    if problem is not None:
        return problem
    asked = asked_by_class(group)
    standing = await headroom(conn, group.charge.tenant_id, asked, at=at)
    if any(not s.known for s in standing.values()):
        return refused_for_charge(UnknownTenant(group.charge.tenant_id))
    # `at`: each role's shape as an ordinary place would be offered then.
    requests = {r.role: replace(r.shape, replica_id="", at=at) for r in group.roles}
    board = await read_board(conn, group, requests)
    count, misfit, board = count_groups(board, group)
    # Per class with a limit: how many groups its room holds.
    rooms = {c: room // asked[c] for c in sorted(asked) if (room := standing[c].room) is not None}
    within = min(rooms.values(), default=count + 1)
    quota = [
        f"tenant {standing[c].tenant}: QUOTA_EXCEEDED, holds {standing[c].used} {c} of its limit "
        f"{standing[c].limit}; a group takes {asked[c]}"
        for c, groups in rooms.items()
        if groups == within
    ]
    if within < count:
        # The limit stops it first: what the board would allow next says nothing.
        return GroupFit(within, tuple(quota))
    limits = _limits(board, group, misfit)
    if within > count:
        return GroupFit(count, limits)
    return GroupFit(count, (*quota, *limits))
