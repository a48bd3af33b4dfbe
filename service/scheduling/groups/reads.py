"""What placement groups read: the board a plan is made on, and a placed group with its KV paths."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import text

from service.database.connections import Connection, cached_text
from service.scheduling.allocations import ShardRecord, shard_columns, shard_from_row
from service.scheduling.groups.board import Board, NodeClass
from service.scheduling.groups.packing import usable_of
from service.scheduling.groups.paths import (
    KvPathKind,
    Whereabouts,
    Zone,
    kv_pairs,
    path_kind,
)
from service.scheduling.groups.requests import GroupRequest, LocalityLevel
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement.fit import (
    census_facts_sql,
    counted_by_census,
    survey_groups_sql,
)
from service.scheduling.placement.statements import facts_of, request_params
from service.scheduling.pool_census import DECLINED, KIND, MOST_KINDS, census_predicate
from service.scheduling.tenancy.victims import Preemption
from service.scheduling.verdicts import NodeFacts


def _zone_columns(group: GroupRequest, pool: str = "p", census: bool = False) -> dict[str, str]:
    """The zone of each pool's node, as extra columns of fit's grouped survey (or the census's).

    The NVLink domain (the pool's: availability.shared_nvlink_domain) is read
    only when the locality asks about domains (NODE falls back to
    NVLINK_DOMAIN), so that other groups' classes do not split by it.
    `pool`: the alias of the pool (or, `census`, the kind of pool) the
    columns are over. For a group with an nvlinkShards role, also
    `nvlink_cells` (_cells_sql).
    """
    level = group.locality.level
    domains = level in (LocalityLevel.NODE, LocalityLevel.NVLINK_DOMAIN)
    columns = {
        "zone_domain": f"NULLIF({pool}.nvlink_domain, '')" if domains else "CAST(NULL AS text)",
        "zone_label": (
            f"(SELECT x.labels ->> CAST(:zone_label AS text) FROM nodes x"
            f" WHERE x.id = {pool}.node_id)"
            if group.locality.label is not None
            else "CAST(NULL AS text)"
        ),
    }
    if any(r.shape.nvlink_shards for r in group.roles):
        columns["nvlink_cells"] = _cells_sql(pool, census)
    return columns


# A cell of nvlink_cells: free GPUs * CELL + those of them used last.
CELL = 1000


def _cells_sql(pool: str, census: bool) -> str:
    """SQL: per NVLink group of the pool's free GPUs, how many and how many a PREFER_NO_SCHEDULE taint sends last.

    Each as free * CELL + last, ascending, from the pool's own arrays
    (free_indices, free_groups, last_resort_indices: gpu_pools): the plan
    packs a node's NVLink groups, and a claim takes a group's other GPUs
    before those, so the ranking's last-resort term counts what it left
    exactly. A kind of the census (`census`) fixes free_groups but not which
    GPUs are used last: for a kind with some, its pools are read (the
    census index's range of the kind) and the cells are the kind's when
    every pool of it has the same, NULL otherwise (the board is then read
    from the survey, reads._read).
    """

    def of_pool(p: str) -> str:
        return (
            f"ARRAY(SELECT count(*) * {CELL}"
            f" + count(*) FILTER (WHERE x.i = ANY({p}.last_resort_indices))"
            f" FROM unnest({p}.free_indices, {p}.free_groups) AS x(i, g)"
            " WHERE x.g IS NOT NULL GROUP BY x.g ORDER BY 1)"
        )

    if not census:
        return of_pool(pool)
    same = " AND ".join(f"q.{column} = {pool}.{column}" for column in KIND)
    of_kind = f"FROM gpu_pools q WHERE q.gpu_class = :cls AND {census_predicate('q')} AND {same}"
    return (
        f"CASE WHEN {pool}.last_resort = 0 THEN ARRAY("
        f"SELECT count(*) * {CELL} FROM unnest({pool}.free_groups) AS x(g)"
        " WHERE x.g IS NOT NULL GROUP BY x.g ORDER BY 1)"
        f" ELSE (SELECT CASE WHEN min(u.v) = max(u.v) THEN min(u.v) END"
        f" FROM (SELECT {of_pool('q')} AS v {of_kind}) u) END"
    )


def _cells(value: Any) -> tuple[tuple[int, int], ...] | None:
    """nvlink_cells as (free, used last) per NVLink group, most free first, then fewest used last."""
    if value is None:
        return None
    return tuple(sorted(((v // CELL, v % CELL) for v in value), key=lambda c: (-c[0], c[1])))


def board_sql(group: GroupRequest, request: PlaceRequest) -> str:
    """The statement read_board sends for one role: fit's grouped survey with the zone columns.

    The SQL generated below looks like this: docs/internals/sql/scheduling.groups.reads/board_sql.any.sql
    (every shape beside it).
    """
    return survey_groups_sql(request, all_fabrics=True, extra=_zone_columns(group))


def board_census_sql(group: GroupRequest, request: PlaceRequest) -> str:
    """The statement read_board sends for one role of a group `windowed`: the census of every kind.

    The SQL generated below looks like this: docs/internals/sql/scheduling.groups.reads/board_census_sql.any.sql
    (every shape beside it).
    """
    return census_facts_sql(
        request, reads="members", all_fabrics=True, extra=_zone_columns(group, "c", census=True)
    )


def window_sql(group: GroupRequest, request: PlaceRequest) -> str:
    """The statement read_window sends for one role: the census of the kinds that take a shard.

    The SQL generated below looks like this: docs/internals/sql/scheduling.groups.reads/window_sql.any.sql
    (every shape beside it).
    """
    return census_facts_sql(
        request, reads="window", all_fabrics=True, extra=_zone_columns(group, "c", census=True)
    )


@dataclass
class _Read:
    """One role's read of a class: its facts, zone, NVLink cells (NodeClass.cells) and member ids."""

    facts: NodeFacts
    zone: Zone
    cells: tuple[tuple[int, int], ...] | None
    members: list[str]


def _classes(rows: Iterable[Any], keep: int | None = None) -> list[_Read] | None:
    """A statement's rows as classes: each row's facts, zone and member ids (the first `keep` of them).

    None when a row's NVLink cells are not known (a census kind with GPUs
    used last: _cells_sql).
    """
    found: dict[tuple[object, ...], _Read] = {}
    for row in rows:
        members = sorted(row.members)
        zone = Zone(tuple(row.fabrics), row.zone_domain, row.zone_label)
        facts = replace(facts_of(row), node_id=members[0])
        mapping = row._mapping
        cells = None
        if "nvlink_cells" in mapping:
            cells = _cells(mapping["nvlink_cells"])
            if cells is None:
                return None
        key = (replace(facts, node_id=""), zone, cells)
        same = found.get(key)
        if same is None:
            found[key] = _Read(facts, zone, cells, members[:keep] if keep else members)
            continue
        # Kinds of pool the request cannot tell apart (their topology, when it
        # reads none): one class, as the survey groups them.
        members = (
            heapq.nsmallest(keep, [*same.members, *members])
            if keep
            else [
                *same.members,
                *members,
            ]
        )
        members.sort()
        found[key] = _Read(replace(same.facts, node_id=members[0]), zone, cells, members)
    return list(found.values())


def _joint(
    roles: Sequence[str], reads: Mapping[str, list[_Read]], one_class: bool
) -> list[NodeClass]:
    """The roles' classes as classes of the board: nodes every role's read puts together.

    A node is in the class of the nodes that each role's read put in the same
    class as it (board.NodeClass); a role whose read lacks the node has no
    facts of it there. The zone is the first role's that reads the node.
    """
    keys: dict[str, list[int]] = {}
    for k, role in enumerate(roles):
        for i, c in enumerate(reads[role]):
            for node_id in c.members:
                keys.setdefault(node_id, [-1] * len(roles))[k] = i
    grouped: dict[tuple[int, ...], list[str]] = {}
    for node_id, found in keys.items():
        grouped.setdefault(tuple(found), []).append(node_id)
    classes = []
    for key, members in grouped.items():
        members.sort()
        facts = {
            role: replace(reads[role][i].facts, node_id=members[0])
            for role, i in zip(roles, key, strict=True)
            if i >= 0
        }
        first = next(reads[role][i] for role, i in zip(roles, key, strict=True) if i >= 0)
        # NVLink cells are of one GPU class's pool: kept for groups of one class.
        classes.append(NodeClass(facts, first.zone, members, first.cells if one_class else None))
    return classes


def _derived(facts: NodeFacts, request: PlaceRequest) -> NodeFacts:
    """A role's facts from the facts read for an nvlinkShards role of the same class (reader_of).

    For a `windowed` group the census's statements for two roles of the one
    GPU class differ only in the topology column: the nvlinkShards one reads
    the free GPUs of each NVLink group (and, for its :per, the usable ones);
    a role without nvlinkShards reads none.
    """
    if not request.nvlink_shards or facts.topology is None:
        return replace(facts, topology=None)
    topology = facts.topology
    usable = usable_of(topology.groups, request.gpus_per_shard)
    return replace(facts, topology=replace(topology, usable=usable))


def reader_of(requests: Mapping[str, PlaceRequest]) -> str:
    """The role whose census read gives every role's facts of a `windowed` group: nvlinkShards first."""
    return next((r for r, q in requests.items() if q.nvlink_shards), next(iter(requests)))


async def _read(
    conn: Connection,
    group: GroupRequest,
    requests: Mapping[str, PlaceRequest],
    statement: Callable[[PlaceRequest], str],
    extra: Mapping[str, Any],
    keep: int | None = None,
    census: bool = False,
) -> list[NodeClass] | None:
    """The board's classes from `statement`; None when the census declines (too many kinds).

    `census`: the statement is the pool census's, for a `windowed` group:
    one read, of the role reader_of names, gives every role's facts
    (_derived), so its classes are every role's at once. Otherwise one read
    per distinct statement, the classes joined (_joint). `keep`: the first
    members of each class kept.
    """
    roles = list(requests)
    if census:
        reader = reader_of(requests)
        request = requests[reader]
        sql = statement(request)
        params = {**request_params(request), "zone_label": group.locality.label, **extra}
        used = {k: v for k, v in params.items() if f":{k}" in sql}
        rows = list(await conn.execute(cached_text(sql), used))
        if len(rows) > MOST_KINDS:
            DECLINED.count("kinds")
            return None
        if rows and rows[0].maintenance_in_force:
            # A kind of pool holds nodes in and out of a maintenance window alike
            # (maintenance_rule.py): the survey, whose facts name the window, is read.
            DECLINED.count("maintenance")
            return None
        kinds = _classes(rows, keep)
        if kinds is None:
            DECLINED.count("last_resort")
            return None
        return [
            NodeClass(
                {r: _derived(c.facts, requests[r]) for r in roles}, c.zone, c.members, c.cells
            )
            for c in kinds
        ]
    reads: dict[str, list[_Read]] = {}
    # Roles whose statement and parameters are the same (prefill and decode
    # of one class, without topology, differ only in GPUs per shard, which
    # the statement does not read) share one read.
    read: dict[tuple[str, str], list[_Read]] = {}
    for role, request in requests.items():
        sql = statement(request)
        params = {**request_params(request), "zone_label": group.locality.label, **extra}
        used = {k: v for k, v in params.items() if f":{k}" in sql}
        same = (sql, repr(sorted(used.items())))
        if same not in read:
            rows = list(await conn.execute(cached_text(sql), used))
            classes = _classes(rows, keep)
            assert classes is not None, "the survey knows every pool's NVLink cells"
            read[same] = classes
        reads[role] = read[same]
    return _joint(roles, reads, len({r.gpu_class for r in requests.values()}) == 1)


async def read_board(
    conn: Connection,
    group: GroupRequest,
    requests: Mapping[str, PlaceRequest],
    *,
    census: bool = True,
) -> Board:
    """Every node of each role's class, grouped as fit groups them, with its zone: one statement per role.

    For a group the window may serve (windowed, whatever its anchors), from
    the pool census, every kind with all its members: the classes fit's
    survey gives but for the state of unschedulable nodes and the taint
    that withholds GPUs, which decide nothing among nodes that fit (the
    plan's tokens leave them out) and no verdict's code, and no row of the
    table compared with a group. `census=False` reads the survey (what the
    census must equal).
    """
    classes = None
    if census and windowed(group, requests):
        classes = await _read(
            conn,
            group,
            requests,
            lambda r: board_census_sql(group, r),
            {"ids": None, "most": MOST_KINDS + 1},
            census=True,
        )
    if classes is None:
        classes = await _read(conn, group, requests, lambda r: board_sql(group, r), {})
    assert classes is not None
    return Board(dict(requests), classes, window_size(requests, group))


def windowed(
    group: GroupRequest, requests: Mapping[str, PlaceRequest], anchors: Sequence[str] = ()
) -> bool:
    """Whether the group may be planned on its window (read_window) rather than the whole board.

    When every fact the planner reads of a node is a column of its pool row
    (the census tells kinds apart by them): each role's shape asks nothing
    of the node's own row (weights, label, disk, age), tolerates no taint,
    and needs no topology but nvlinkShards'; the locality has no label
    (LABEL zones are values of the node's labels); the roles are of one GPU
    class (a node opened by one role is seen by the others only in the same
    class's window); and it is a new group (scaleGroup's anchors may lie
    outside any window).
    """
    if anchors or group.locality.label is not None:
        return False
    if len({r.gpu_class for r in requests.values()}) != 1:
        return False
    # A board asked of a later instant (fitGroup's `at`) reads the pools as
    # they will be (availability.gpu_offered_at), which the census does not.
    return all(counted_by_census(replace(r, shards=1)) and r.at is None for r in requests.values())


def window_size(requests: Mapping[str, PlaceRequest], group: GroupRequest) -> int:
    """Members of each class the window reads: more than a plan can ever look at.

    Board.candidates offers, per class, its first `shards` members not yet
    opened, and a plan opens at most one node per shard of the group.
    """
    opened = sum(r.replicas * max(1, r.shape.shards) for r in group.roles)
    return opened + max(max(1, r.shards) for r in requests.values())


async def read_window(
    conn: Connection, group: GroupRequest, requests: Mapping[str, PlaceRequest]
) -> Board | None:
    """The board as far as the planner can look: every class that may take a shard, its first members.

    A plan reads, of each class, only the members Board.candidates offers
    (the first `shards` not yet opened) and the nodes it opened, so the first
    window_size members of every class that may take a shard of some role
    give the plan the whole board gives: the same candidates at every step,
    the same zones that can hold the group. Classes that take no shard add
    zones that hold nothing (they can only change the Misfit told when
    nothing fits, which placeGroup then reads from the whole board). Read
    from the pool census (pool_census.py: one descent per kind of pool), so
    it costs what the kinds of node cost, not the cluster. None when the
    census declines (too many kinds, or NVLink cells it cannot tell:
    _cells_sql). For a group that is `windowed`.
    """
    keep = window_size(requests, group)
    classes = await _read(
        conn,
        group,
        requests,
        lambda r: window_sql(group, r),
        # The fewest GPUs a role's shard takes: one read serves every role
        # whose statement reads no other fact of its shape.
        {
            "ids": keep,
            "most": MOST_KINDS + 1,
            "need": min(r.gpus_per_shard for r in requests.values()),
        },
        keep,
        census=True,
    )
    return None if classes is None else Board(dict(requests), classes, keep)


@dataclass(frozen=True)
class MemberRecord:
    role: str
    n: int
    replica_id: str
    shards: tuple[ShardRecord, ...]


@dataclass(frozen=True)
class KvPath:
    from_id: str
    to_id: str
    kind: KvPathKind


@dataclass(frozen=True)
class StoredGroup:
    group_id: str
    spec: dict[str, Any]
    generation: int
    members: tuple[MemberRecord, ...]
    kv_paths: tuple[KvPath, ...]
    # The replicas stopped to make room for it (placeGroup with preemption);
    # none when it was placed on free GPUs, or read back later.
    preempted: tuple[Preemption, ...] = ()


_GROUP = text("SELECT group_id, spec, generation FROM placement_groups WHERE group_id = :group_id")

# Each member with its shards, and where each shard is: the node's fabrics,
# the NVLink domain of the shard's GPUs (the one they all report), the value
# of the group's locality label, and the NVLink group of each of its GPUs.
_MEMBERS = text(
    f"""
    SELECT m.role, m.n, m.replica_id AS member_id, {shard_columns("s")},
           ARRAY(SELECT fa.fabric FROM fabric_attachments fa WHERE fa.node_id = s.node_id
                 ORDER BY fa.fabric) AS node_fabrics,
           (SELECT CASE WHEN count(*) = count(g.nvlink_domain)
                         AND count(DISTINCT g.nvlink_domain) = 1
                    THEN min(g.nvlink_domain) END
            FROM gpus g WHERE g.node_id = s.node_id AND g.idx = ANY(s.gpu_indices)) AS gpus_domain,
           (SELECT x.labels ->> CAST(:zone_label AS text) FROM nodes x WHERE x.id = s.node_id)
               AS zone_label,
           ARRAY(SELECT g.nvlink_group FROM gpus g
                 WHERE g.node_id = s.node_id AND g.idx = ANY(s.gpu_indices)) AS nvlink_groups
    FROM group_members m LEFT JOIN shards s ON s.replica_id = m.replica_id
    WHERE m.group_id = :group_id
    ORDER BY m.role, m.n, s.shard_id
    """
)


async def read_group(
    conn: Connection, group_id: str, head: tuple[dict[str, Any], int] | None = None
) -> StoredGroup | None:
    """A placed group as stored: its members (by role in the spec's order, then n) and their KV paths.

    `head`: the group's spec and generation, when the caller just wrote them.
    """
    if head is None:
        row = (await conn.execute(_GROUP, {"group_id": group_id})).first()
        if row is None:
            return None
        head = (row.spec, int(row.generation))
    spec, generation = head
    label = spec["locality"]["label"]
    shards: dict[str, list[ShardRecord]] = {}
    where: dict[str, list[tuple[str, Zone]]] = {}
    groups: dict[str, set[tuple[str, int | None]]] = {}
    names: dict[str, tuple[str, int]] = {}
    for row in await conn.execute(_MEMBERS, {"group_id": group_id, "zone_label": label}):
        names[row.member_id] = (row.role, row.n)
        shards.setdefault(row.member_id, [])
        if row.shard_id is None:
            continue
        shards[row.member_id].append(shard_from_row(row))
        zone = Zone(tuple(row.node_fabrics), row.gpus_domain, row.zone_label)
        where.setdefault(row.member_id, []).append((row.node_id, zone))
        groups.setdefault(row.member_id, set()).update((row.node_id, g) for g in row.nvlink_groups)
    rank = {r["role"]: i for i, r in enumerate(spec["roles"])}
    ordered = sorted(names.items(), key=lambda item: (rank.get(item[1][0], 99), item[1][1]))
    members = tuple(
        MemberRecord(role, n, replica_id, tuple(shards[replica_id]))
        for replica_id, (role, n) in ordered
    )
    paths: list[KvPath] = []
    if spec["kvFrom"] is not None:
        senders = [m for m in members if m.role == spec["kvFrom"] and m.shards]
        receivers = [m for m in members if m.role == spec["kvTo"] and m.shards]

        def whereabouts(m: MemberRecord) -> Whereabouts:
            return Whereabouts(tuple(where[m.replica_id]), frozenset(groups[m.replica_id]))

        for i, j in kv_pairs(len(senders), len(receivers)):
            a, b = senders[i], receivers[j]
            paths.append(
                KvPath(a.replica_id, b.replica_id, path_kind(whereabouts(a), whereabouts(b)))
            )
    return StoredGroup(group_id, spec, generation, members, tuple(paths))


_GROUP_IDS = text(
    """
    SELECT group_id FROM placement_groups
    WHERE CAST(:after AS text) IS NULL OR group_id > CAST(:after AS text)
    ORDER BY group_id LIMIT :first
    """
)


async def list_groups(conn: Connection, first: int, after: str | None) -> list[StoredGroup]:
    """A page of placed groups by id, after `after`: each read as read_group reads one."""
    ids = [r.group_id for r in await conn.execute(_GROUP_IDS, {"first": first, "after": after})]
    found = []
    for group_id in ids:
        stored = await read_group(conn, group_id)
        if stored is not None:
            found.append(stored)
    return found
