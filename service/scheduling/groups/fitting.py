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

from service.database.connections import Connection
from service.scheduling.groups.planning import Board, GroupPlan, Misfit, plan_group
from service.scheduling.groups.reads import read_board
from service.scheduling.groups.requests import GroupRequest, validate_group
from service.scheduling.rejections import Rejection
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


def _limits(board: Board, group: GroupRequest, misfit: Misfit) -> tuple[str, ...]:
    request = board.requests[misfit.role]
    codes: Counter[VerdictCode] = Counter()
    for c in board.classes[misfit.role]:
        codes[judge(c.facts, request).code] += len(c.members)
    hard = " hard" if group.locality.hard else ""
    said = [f"role {misfit.role}: {misfit.message} at locality {misfit.level.value}{hard}"]
    for code, nodes in sorted(codes.items(), key=lambda item: (-item[1], item[0].value)):
        plural = "" if nodes == 1 else "s"
        said.append(f"role {misfit.role}: {code.value} on {nodes} node{plural}")
    return tuple(said)


def count_groups(
    board: Board, group: GroupRequest, *, repeats: bool = True
) -> tuple[int, Misfit, Board]:
    """Groups plan_group places one after another on the board, why the next does not fit, the board after.

    Round by round, except that a round whose repeats provably plan the same
    is applied as many times as that stays true at once (_repeats): on a
    cluster of thousands of like nodes most rounds are such repeats.
    `repeats=False` plans every round (what the shortcut must equal).
    """
    count = 0
    while count < MAX_GROUPS:
        outcome = plan_group(board, group)
        if isinstance(outcome, Misfit):
            return count, outcome, board
        trial, plan = outcome
        moves = _moves(board, trial, plan)
        more = _repeats(board, moves) if repeats else 0
        trial.settle()
        board = trial
        count += 1
        if more:
            _apply(board, moves, more)
            count += more
    raise AssertionError("fitGroup counted past MAX_GROUPS")


# A node a plan used: per role, the class it was in and the class it goes to.
Move = dict[str, tuple[int, int]]


def _moves(board: Board, trial: Board, plan: GroupPlan) -> list[Move]:
    """Each node the plan uses (in order of first use), with its class before and after, per role."""
    nodes = list(dict.fromkeys(n for m in plan.members for n, _ in m.plan.nodes))
    moves = []
    for node_id in nodes:
        zone = trial.zones[node_id]
        move = {}
        for role, f in trial.opened[node_id].items():
            source = board.where[role][node_id]
            move[role] = (source, board.class_for(role, f, zone))
        moves.append(move)
    return moves


def _repeats(board: Board, moves: list[Move]) -> int:
    """How many more rounds after this one provably plan the same as it: 0 when none does.

    The planner orders nodes by their facts and then by planning_id (the
    class's token, then the id): a round's choices depend on which classes
    exist, which are fitting, and (through the candidates each class offers,
    planning.Board.candidates) on how many members a class has only while it
    has fewer than the most a round can look at. So a round that moves nodes
    between classes that keep at least `floor` members, into classes that
    already have that many or are not fitting for any role, leaves a board on
    which the same round is planned again; as long as every class's token is
    its own (two classes of one token would be told apart by node id).
    """
    floor = len(moves) + max(max(1, r.shards) for r in board.requests.values()) + 1
    taken: dict[tuple[str, int], int] = {}
    landed: dict[tuple[str, int], int] = {}
    for move in moves:
        for role, (source, target) in move.items():
            taken[(role, source)] = taken.get((role, source), 0) + 1
            landed[(role, target)] = landed.get((role, target), 0) + 1
    for role, tokens in board.tokens.items():
        live = [
            t for i, t in enumerate(tokens) if board.classes[role][i].members or (role, i) in landed
        ]
        if len(set(live)) != len(live):
            return 0
    for (role, target), _ in landed.items():
        if (role, target) in taken:
            return 0  # a node staying in its class: the round changed nothing countable
        size = len(board.classes[role][target].members)
        if board.fits[role][target] and size < floor:
            return 0
    for move in moves:
        # A node's class for one role must say its class for the others: the
        # planner picks it by one role's class and the next round's pick must
        # land in the same classes of the others.
        first, *others = (board.classes[r][source].members for r, (source, _) in move.items())
        if any(len(o) != len(first) or o != first for o in others):
            return 0
    repeats = MAX_GROUPS
    for (role, source), per_round in taken.items():
        # This round takes its share first; each repeat takes as much again.
        left = len(board.classes[role][source].members) - per_round
        repeats = min(repeats, (left - floor) // per_round)
    return max(0, repeats)


def _apply(board: Board, moves: list[Move], repeats: int) -> None:
    """The moves of one round, `repeats` times: each takes nodes that are in every class it names.

    The smallest ids common to its classes, as the planner would take them.
    Roles that read alike have equal member lists: then those are the first
    `repeats` of the list, and the lists are cut and merged whole (sorted()
    merges two sorted runs in one pass).
    """
    for move in moves:
        roles = list(move)
        lists = [board.classes[r][move[r][0]].members for r in roles]
        if all(members == lists[0] for members in lists[1:]):
            common = lists[0]
        else:
            common = sorted(set.intersection(*(set(members) for members in lists)))
        if len(common) < repeats:
            raise AssertionError("a repeated round found too few nodes in its classes")
        moved = common[:repeats]
        gone: set[str] | None = None
        for role in roles:
            source, target = move[role]
            left = board.classes[role][source]
            if left.members[:repeats] == moved:
                left.members = left.members[repeats:]
            else:
                gone = gone or set(moved)
                left.members = [node_id for node_id in left.members if node_id not in gone]
            landed = board.classes[role][target]
            landed.members = sorted(landed.members + moved)
            board.where[role].update(dict.fromkeys(moved, target))


async def fit_group(conn: Connection, group: GroupRequest) -> GroupFit | Rejection:
    """How many more whole groups of this spec fit now; a spec placeGroup would refuse is its Rejection."""
    group = replace(group, group_id=group.group_id or SHAPE_ID)
    problem = validate_group(group)
    if problem is not None:
        return problem
    requests = {r.role: replace(r.shape, replica_id="") for r in group.roles}
    board = await read_board(conn, group, requests)
    count, misfit, board = count_groups(board, group)
    return GroupFit(count, _limits(board, group, misfit))
