"""explainGroupPlacement: what placeGroup would answer now, per role and per node, without holding anything."""

from __future__ import annotations

from dataclasses import dataclass, replace

from service.database.connections import Connection
from service.scheduling.groups.paths import Whereabouts, kv_pairs, path_kind
from service.scheduling.groups.planning import Bounded, Misfit, plan_group
from service.scheduling.groups.reads import KvPath, read_board
from service.scheduling.groups.requests import (
    GroupRequest,
    LocalityLevel,
    member_id,
    shape_of,
    validate_group,
)
from service.scheduling.placement.explanation import verdicts_of
from service.scheduling.rejections import Rejection, shown
from service.scheduling.verdicts import Verdict


@dataclass(frozen=True)
class RoleExplanation:
    role: str
    # Whether the role's replicas fit without the other roles.
    placeable: bool
    message: str
    # Per node (the first by id, bounded as explainPlacement's), the first check that fails.
    verdicts: tuple[Verdict, ...]
    omitted: int


@dataclass(frozen=True)
class PlannedMember:
    role: str
    replica_id: str
    # (node id, shards) as the plan would put them; the fabric of a multi-node member.
    nodes: tuple[tuple[str, int], ...]
    fabric: str | None


@dataclass(frozen=True)
class GroupExplanation:
    placeable: bool
    message: str
    # The locality level the best plan reaches (None: no plan), and its zone.
    level: LocalityLevel | None
    zone: str | None
    members: tuple[PlannedMember, ...]
    kv_paths: tuple[KvPath, ...]
    roles: tuple[RoleExplanation, ...]


async def explain_group(conn: Connection, group: GroupRequest) -> GroupExplanation | Rejection:
    """placeGroup's planner on the nodes as they are: the plan or why not, and each role's verdicts."""
    problem = validate_group(group)
    if problem is not None:
        return problem
    requests = {r.role: replace(r.shape, replica_id="") for r in group.roles}
    board = await read_board(conn, group, requests)
    roles = []
    for r in group.roles:
        alone = plan_group(board, replace(group, roles=(r,), kv_from=None, kv_to=None))
        verdicts, omitted = await verdicts_of(conn, shape_of(r.role, r.shape, group.group_id, 0))
        if isinstance(alone, Bounded):
            said = f"{r.replicas} replicas not decided alone: {alone.message}"
        elif isinstance(alone, Misfit):
            said = f"{r.replicas} replicas do not fit even alone: {alone.message}"
        else:
            said = f"{r.replicas} replicas fit alone at locality {alone[1].level.value}"
        roles.append(
            RoleExplanation(
                r.role, not isinstance(alone, Misfit | Bounded), said, verdicts, omitted
            )
        )
    outcome = plan_group(board, group)
    if isinstance(outcome, Bounded):
        message = f"group {shown(group.group_id)} is not decided: {outcome.message}"
        return GroupExplanation(False, message, None, None, (), (), tuple(roles))
    if isinstance(outcome, Misfit):
        message = (
            f"group {shown(group.group_id)} would not fit: role {shown(outcome.role)} replica "
            f"{outcome.n + 1} finds no room at locality {outcome.level.value}: {outcome.message}"
        )
        return GroupExplanation(False, message, None, None, (), (), tuple(roles))
    planned, plan = outcome
    members = tuple(
        PlannedMember(m.role, member_id(group.group_id, m.role, m.n), m.plan.nodes, m.plan.fabric)
        for m in plan.members
    )
    paths: list[KvPath] = []
    if group.kv_from is not None and group.kv_to is not None:
        by_role = {
            role: sorted((m for m in plan.members if m.role == role), key=lambda m: m.n)
            for role in (group.kv_from, group.kv_to)
        }
        senders, receivers = by_role[group.kv_from], by_role[group.kv_to]
        for i, j in kv_pairs(len(senders), len(receivers)):
            a, b = senders[i], receivers[j]

            def where(nodes: tuple[tuple[str, int], ...]) -> Whereabouts:
                return Whereabouts(tuple((n, planned.opened[n].zone) for n, _ in nodes))

            paths.append(
                KvPath(
                    member_id(group.group_id, a.role, a.n),
                    member_id(group.group_id, b.role, b.n),
                    path_kind(where(a.plan.nodes), where(b.plan.nodes)),
                )
            )
    zone = f" {plan.zone}" if plan.zone is not None and plan.level is not LocalityLevel.NODE else ""
    nodes = sorted({n for m in plan.members for n, _ in m.plan.nodes})
    message = (
        f"would place {len(plan.members)} replicas of group {shown(group.group_id)} at locality "
        f"{plan.level.value}{zone} on {', '.join(nodes)}"
    )
    return GroupExplanation(
        True, message, plan.level, plan.zone, members, tuple(paths), tuple(roles)
    )
