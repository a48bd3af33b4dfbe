"""Reading nodes: one node, or a page of nodes matching a scheduler's filter.

Each read is one statement whatever the cluster size; the per-node details
(GPUs, fabrics, storage, weights, allocations) are read by node_details.py in one
statement per kind for a whole page of nodes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from sqlalchemy.engine import Row

from service.database.connections import Connection, cached_text
from service.database.plan_shapes import key_row_exists
from service.errors import InvalidInput
from service.fleet.reports import Disk
from service.node_states import STATES, shown_reason
from service.scheduling.availability import is_schedulable, node_schedulable
from service.scheduling.freshness import check_max_age, gpu_facts_fresh


@dataclass(frozen=True)
class NodeRecord:
    """A node's row as read (node_from_row), and the views of it that readers use.

    The columns are kept as stored; labels, engine versions and disks are
    built on first use (cached_property writes the instance's __dict__ itself,
    which a frozen dataclass allows: the record stays immutable to its
    readers). Most reads of a node never look at them (a heartbeat's answer,
    a state check), and decoding the two jsonb columns plus two Disks was two
    thirds of reading a node's row.
    """

    id: str
    hostname: str
    mgmt_addr: str
    labels_json: str | None  # jsonb's text
    memory_total_mb: int | None
    state: str
    state_reason: str | None
    state_actor: str | None
    last_seen: datetime
    registered_at: datetime
    agent_version: str | None
    engine_versions_json: str | None  # jsonb's text
    local_disk_free: int | None
    local_disk_total: int | None
    shared_disk_free: int | None
    shared_disk_total: int | None
    knows_its_weights: bool
    # The kernel's boot id the agent last reported; None from an older agent.
    boot_id: str | None = None
    # Which life of the node this is (service/fleet/fencing.py).
    incarnation: int = 1
    # When the agent observed each fact block, on the service's clock, and
    # why its times were corrected (service/fleet/observed_at.py).
    gpus_observed_at: datetime | None = None
    fabrics_observed_at: datetime | None = None
    storage_observed_at: datetime | None = None
    observed_at_correction: str | None = None
    # Whether the agent looked for HCAs (reports.HcaDiscovery); None: it did not say.
    hca_discovery: str | None = None

    @property
    def schedulable(self) -> bool:
        return is_schedulable(self.state)

    @cached_property
    def labels(self) -> dict[str, str]:
        return _mapping(self.labels_json)

    @cached_property
    def engine_versions(self) -> dict[str, str]:
        return _mapping(self.engine_versions_json)

    @cached_property
    def local_disk(self) -> Disk | None:
        """Space on the filesystems the node fills itself; None when unknown."""
        return _disk(self.local_disk_free, self.local_disk_total)

    @cached_property
    def shared_disk(self) -> Disk | None:
        return _disk(self.shared_disk_free, self.shared_disk_total)


@dataclass(slots=True)
class BeatRecord:
    """A node's id and state as its heartbeat left them: what a beat's answer needs.

    Not a NodeRecord: a batch of heartbeats returns a row a beat, and reading
    the node's other columns (its names, labels, disks, two timestamps) and
    building a NodeRecord from them is work a beat's answer does not need,
    paid on every beat. Agents ask for their state only
    (agent/operations/heartbeat.graphql); a heartbeat asking for more is
    answered by its resolver, which reads the node.
    """

    id: str
    state: str
    state_reason: str | None
    state_actor: str | None

    @property
    def schedulable(self) -> bool:
        return is_schedulable(self.state)


# What node_writes.heartbeat_alive and heartbeat_many return; beat_from_row reads
# them by position.
BEAT_COLUMNS = "n.id, n.state, n.admin_reason, n.admin_actor, n.liveness_reason"
_BEAT_WIDTH = 5


def beat_from_row(row: Row[Any]) -> BeatRecord:
    """A BeatRecord from a row that starts with BEAT_COLUMNS, in their order."""
    node_id, state, admin_reason, admin_actor, liveness_reason = row[:_BEAT_WIDTH]
    reason, actor = shown_reason(state, admin_reason, admin_actor, liveness_reason)
    return BeatRecord(node_id, state, reason, actor)


def _disk(free: int | None, total: int | None) -> Disk | None:
    return None if total is None else Disk(free, total)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NodeFilter:
    state: str | None = None
    schedulable: bool | None = None
    fabric: str | None = None
    gpu_class: str | None = None
    label: tuple[str, str] | None = None
    has_weights: str | None = None
    min_local_disk_free: int | None = None
    # Seconds: only nodes whose GPU facts are at most this old (service/scheduling/freshness.py).
    max_age: int | None = None


# Also what register_node returns, so its reply needs no second read.
# node_from_row reads these columns by position.
# The jsonb columns as text: NodeRecord decodes them when they are read.
NODE_COLUMNS = """
    n.id, n.hostname, n.mgmt_addr, n.labels::text AS labels, n.memory_total_mb, n.state,
    n.admin_reason, n.admin_actor, n.liveness_reason, n.last_seen, n.registered_at,
    n.agent_version, n.engine_versions::text AS engine_versions, n.local_disk_free, n.local_disk_total,
    n.shared_disk_free, n.shared_disk_total, n.knows_its_weights, n.boot_id, n.incarnation,
    n.gpus_observed_at, n.fabrics_observed_at, n.storage_observed_at, n.observed_at_correction,
    n.hca_discovery
"""
_NODE_WIDTH = 25


def by_key(mapping: dict[str, str]) -> list[tuple[str, str]]:
    """A node's labels or engine versions in the order they are shown: by key, by code point."""
    return sorted(mapping.items())


def by_key_sql(column: str, entry: str, e: str = "e") -> str:
    """SQL: by_key of a jsonb column of `nodes` as a JSON array of `entry` (over `e.key`, `e.value`).

    Python orders strings by code point, which is UTF-8's byte order:
    COLLATE "C" compares bytes, whatever the database's collation.
    """
    return (
        f"(SELECT coalesce(json_agg({entry} ORDER BY {e}.key COLLATE \"C\"), '[]')"
        f" FROM jsonb_each_text({column}) {e})"
    )


def _mapping(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        value = json.loads(value)
    if type(value) is dict:
        # register_node stores labels and engine versions as string-to-string
        # objects only, so each is returned as read, not copied per node.
        return value
    return {str(k): str(v) for k, v in (value or {}).items()}


def node_from_row(row: Row[Any]) -> NodeRecord:
    """A node from a row that starts with NODE_COLUMNS, in their order.

    By position: named access on SQLAlchemy rows was most of this function's
    cost, which a 1,000-node page pays a thousand times. The record's fields
    are set as one dict update: the frozen dataclass's __init__ sets each of
    its fields through object.__setattr__, and a batch of heartbeats reads a
    row per beat.
    """
    (
        node_id, hostname, mgmt_addr, labels, memory_total_mb, state, admin_reason,
        admin_actor, liveness_reason, last_seen, registered_at, agent_version,
        engine_versions, local_free, local_total, shared_free, shared_total, knows, boot_id,
        incarnation,
        gpus_observed_at, fabrics_observed_at, storage_observed_at, observed_at_correction,
        hca_discovery,
    ) = row[:_NODE_WIDTH]  # fmt: skip
    reason, actor = shown_reason(state, admin_reason, admin_actor, liveness_reason)
    record: NodeRecord = object.__new__(NodeRecord)
    record.__dict__.update(
        id=node_id,
        hostname=hostname,
        mgmt_addr=mgmt_addr,
        labels_json=labels,
        memory_total_mb=memory_total_mb,
        state=state,
        state_reason=reason,
        state_actor=actor,
        last_seen=last_seen,
        registered_at=registered_at,
        agent_version=agent_version,
        engine_versions_json=engine_versions,
        local_disk_free=local_free,
        local_disk_total=local_total,
        shared_disk_free=shared_free,
        shared_disk_total=shared_total,
        knows_its_weights=knows,
        boot_id=boot_id,
        incarnation=incarnation,
        gpus_observed_at=gpus_observed_at,
        fabrics_observed_at=fabrics_observed_at,
        storage_observed_at=storage_observed_at,
        observed_at_correction=observed_at_correction,
        hca_discovery=hca_discovery,
    )
    return record


async def get_nodes(conn: Connection, ids: Sequence[str]) -> dict[str, NodeRecord]:
    rows = await conn.execute(
        cached_text(f"SELECT {NODE_COLUMNS} FROM nodes n WHERE n.id = ANY(CAST(:ids AS text[]))"),
        {"ids": list(ids)},
    )
    return {row.id: node_from_row(row) for row in rows}


async def get_node(conn: Connection, node_id: str) -> NodeRecord | None:
    return (await get_nodes(conn, [node_id])).get(node_id)


def _filter_sql(f: NodeFilter, params: dict[str, Any]) -> list[str]:
    where: list[str] = []
    if f.state is not None:
        if f.state not in STATES:
            raise InvalidInput("filter.state", f.state, f"expected one of {', '.join(STATES)}")
        where.append("n.state = :state")
        params["state"] = f.state
    if f.schedulable is not None:
        schedulable = node_schedulable("n")
        where.append(schedulable if f.schedulable else f"NOT {schedulable}")
    # Related rows are probed by their key, so a page walks nodes in id
    # order and stops (service/database/plan_shapes.py).
    if f.fabric is not None:
        where.append(key_row_exists("fabric_attachments", {"node_id": "n.id", "fabric": ":fabric"}))
        params["fabric"] = f.fabric
    if f.gpu_class is not None:
        where.append(key_row_exists("gpu_pools", {"node_id": "n.id", "gpu_class": ":cls"}))
        params["cls"] = f.gpu_class
    if f.label is not None:
        where.append("n.labels @> CAST(:label AS jsonb)")
        params["label"] = json.dumps({f.label[0]: f.label[1]})
    if f.has_weights is not None:
        # A node that reported no weights was not asked to look: keep it.
        holds = key_row_exists("weights", {"node_id": "n.id", "path": ":weights"})
        where.append(f"(NOT n.knows_its_weights OR {holds})")
        params["weights"] = f.has_weights
    if f.max_age is not None:
        check_max_age(f.max_age)
        where.append(gpu_facts_fresh("n"))
        params["max_age"] = f.max_age
    if f.min_local_disk_free is not None:
        if f.min_local_disk_free < 0:
            raise InvalidInput("filter.minLocalDiskFree", f.min_local_disk_free, "must be >= 0")
        # Unknown disk is not a full disk: a node that reported none stays in.
        where.append("(n.local_disk_total IS NULL OR n.local_disk_free >= :min_disk)")
        params["min_disk"] = f.min_local_disk_free
    return where


def page_clause(
    node_filter: NodeFilter, first: int, after: str | None = None
) -> tuple[str, dict[str, Any]]:
    """WHERE ... ORDER BY ... LIMIT of a page over `nodes n`, and its parameters.

    Also json_pages.py's page, so both ways of reading a page pick the same nodes.
    """
    params: dict[str, Any] = {"first": first}
    where = _filter_sql(node_filter, params)
    if after is not None:
        where.append("n.id > :after")
        params["after"] = after
    clause = f"WHERE {' AND '.join(where)} " if where else ""
    return f"{clause}ORDER BY n.id LIMIT :first", params


async def list_nodes(
    conn: Connection, node_filter: NodeFilter, first: int, after: str | None = None
) -> list[NodeRecord]:
    """A page of nodes sorted by id; `after` is the last id of the previous page."""
    clause, params = page_clause(node_filter, first, after)
    rows = await conn.execute(cached_text(f"SELECT {NODE_COLUMNS} FROM nodes n {clause}"), params)
    return [node_from_row(row) for row in rows]
