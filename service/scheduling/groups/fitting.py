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
from service.scheduling.groups.planning import Board, Misfit, plan_group
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


def count_groups(board: Board, group: GroupRequest) -> tuple[int, Misfit, Board]:
    """Groups plan_group places one after another on the board, why the next does not fit, the board after."""
    count = 0
    while count < MAX_GROUPS:
        outcome = plan_group(board, group)
        if isinstance(outcome, Misfit):
            return count, outcome, board
        board = outcome[0]
        board.settle()
        count += 1
    raise AssertionError("fitGroup counted past MAX_GROUPS")


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
