"""Shards as stored: a replica's shards on nodes, how they are read back, what a claim answers."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Row

from service.database.connections import Connection, cached_text
from service.scheduling.generations import replica_generation
from service.scheduling.tenancy.victims import Preemption


@dataclass(frozen=True)
class ShardRecord:
    shard_id: str
    replica_id: str
    node_id: str
    gpu_indices: tuple[int, ...]
    fabric: str | None
    hcas: tuple[str, ...]
    created_at: datetime
    # The fencing token its engine is started with, its replica's generation
    # (service/scheduling/generations.py), and since when it is held for a
    # LOST node (service/fleet/fencing.py; None: not held).
    fence: int
    generation: int
    held_since: datetime | None
    # Its charge (service/scheduling/tenancy/): the tenant, the priority, the
    # deployment, and whether the claim took the tenant past its guarantee.
    tenant: str
    priority: int
    deployment: str | None
    borrowed: bool


def shard_columns(s: str) -> str:
    """SQL: the columns shard_from_row reads, from the shards row `s`."""
    return (
        f"{s}.shard_id, {s}.replica_id, {s}.node_id, {s}.gpu_indices, {s}.fabric, {s}.hcas,"
        f" {s}.created_at, {s}.fence, {replica_generation(s)} AS generation, {s}.held_since,"
        f" {s}.tenant, {s}.priority, {s}.deployment, {s}.borrowed"
    )


SHARD_COLUMNS = shard_columns("s")


def shard_from_row(row: Row[Any]) -> ShardRecord:
    return ShardRecord(
        shard_id=row.shard_id,
        replica_id=row.replica_id,
        node_id=row.node_id,
        gpu_indices=tuple(sorted(row.gpu_indices)),
        fabric=row.fabric,
        hcas=tuple(row.hcas),
        created_at=row.created_at,
        fence=row.fence,
        generation=row.generation,
        held_since=row.held_since,
        tenant=row.tenant,
        priority=row.priority,
        deployment=row.deployment,
        borrowed=row.borrowed,
    )


_SHARDS_BY_ID = text(
    f"SELECT {SHARD_COLUMNS} FROM shards s WHERE s.shard_id = ANY(CAST(:ids AS text[]))"
)
_SHARDS_ON_NODES = text(
    f"SELECT {SHARD_COLUMNS} FROM shards s WHERE s.node_id = ANY(CAST(:ids AS text[]))"
    " ORDER BY s.node_id, s.shard_id"
)


async def shards_by_id(conn: Connection, shard_ids: Sequence[str]) -> dict[str, ShardRecord]:
    rows = await conn.execute(_SHARDS_BY_ID, {"ids": list(shard_ids)})
    return {r.shard_id: shard_from_row(r) for r in rows}


async def shards_on_nodes(
    conn: Connection, node_ids: Sequence[str]
) -> dict[str, list[ShardRecord]]:
    out: dict[str, list[ShardRecord]] = defaultdict(list)
    rows = await conn.execute(_SHARDS_ON_NODES, {"ids": list(node_ids)})
    for r in rows:
        out[r.node_id].append(shard_from_row(r))
    return out


async def list_allocations(
    conn: Connection,
    *,
    node_id: str | None,
    replica_id: str | None,
    first: int,
    after: str | None = None,
    held: bool = False,
) -> list[ShardRecord]:
    """A page of shards sorted by shard id; `after` is the last shard id of the previous page.

    `held`: only shards held for a LOST node (service/fleet/fencing.py).
    """
    params: dict[str, Any] = {"first": first}
    for name, value in (("node_id", node_id), ("replica_id", replica_id), ("after", after)):
        if value is not None:
            params[name] = value
    sql = allocations_page_sql(
        node_id=node_id is not None,
        replica_id=replica_id is not None,
        after=after is not None,
        held=held,
    )
    rows = await conn.execute(cached_text(sql), params)
    return [shard_from_row(r) for r in rows]


def allocations_page_sql(*, node_id: bool, replica_id: bool, after: bool, held: bool) -> str:
    """list_allocations' statement, with the conditions asked for (:node_id, :replica_id, :after; held).

    The SQL generated below looks like this: docs/internals/sql/scheduling.allocations.records/allocations_page_sql.all.sql
    (every shape beside it).
    """
    where: list[str] = ["s.held_since IS NOT NULL"] if held else []
    if node_id:
        where.append("s.node_id = :node_id")
    if replica_id:
        where.append("s.replica_id = :replica_id")
    if after:
        where.append("s.shard_id > :after")
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {SHARD_COLUMNS} FROM shards s {clause} ORDER BY s.shard_id LIMIT :first"


@dataclass(frozen=True)
class Allocated:
    shards: tuple[ShardRecord, ...]
    # The replicas stopped to make room for these shards (preemption, which
    # takes them in the same transaction); none for a claim on free GPUs.
    preempted: tuple[Preemption, ...] = ()
