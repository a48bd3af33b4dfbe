"""Pages of nodes with their details, as JSON built by PostgreSQL in one statement.

Why: a 1,000-node page with its GPUs, storage and allocations is tens of
thousands of values. Read as rows, every one of them is decoded by asyncpg,
wrapped in a record, completed by the executor and encoded again as JSON,
work PostgreSQL does far more cheaply when it builds the JSON itself (as
PostGraphile has it do). Here too, for a selection made only of what this module can express, PostgreSQL
builds the answer (json_build_object per object, json_agg per list, in the
same order and with the same values the records would give) and the service
passes the text through. A page read without `first` reads one entry past
its page, as the resolvers do, and the same rule (paging.stops_short) says
whether the answer must carry PAGE_TRUNCATED.

Two pages: list_nodes' page (NodePage) and free_gpus' entries with their
nodes (FreeGpusPage). What a selection may name: the attributes below, by the records' own names
(NodeRecord, GpuRecord, FilesystemRecord, ShardRecord, FabricRecord,
WeightsRecord; fleet health's Taint, drift Finding and Remediation), each with
the expression of the JSON value that attribute holds; fleet health's lists
come from service/fleet/health/'s SQL for them, and Gpu.recommendedAction
from the remediation policy itself (recommend). Anything else is not this module's to answer: the compiled
page declines such a selection and graphql-core answers it from the records.

Only the fast path's page and node routes (compiled_page.py, compiled_node.py)
use it, so it lives in the fast path's package and goes with it. The SQL of
each rule it builds from (a free GPU, a schedulable node, a node's taints,
drift and open remediations, the NVLink groups) is not written here: each
stays with its rule in the domain, next to the rule's Python form.

The page is the one node_reads.list_nodes reads (same filter, same order,
same limit), and each detail list has its loader's order (node_details.py,
allocations.shards_on_nodes), so both ways answer alike; one statement is also
one snapshot, where the row path reads nodes and details in separate ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.database.connections import Connection, cached_text
from service.fleet.health.drift import drift_sql
from service.fleet.health.policy import RemediationAction
from service.fleet.health.remediations import open_sql
from service.fleet.health.taint_rows import gpu_taints_sql, node_taints_sql
from service.fleet.node_details import has_faults_sql, recommended_action
from service.fleet.node_reads import NodeFilter, by_key_sql, page_clause
from service.fleet.topology import describe_groups_sql, largest_free_group_sql
from service.node_states import state_actor_sql, state_reason_sql
from service.paging import PageRequest, PageTruncated, stops_short
from service.scheduling.availability import (
    gpu_free,
    gpu_health_reasons,
    gpu_healthy,
    node_schedulable,
)
from service.scheduling.capacity import free_gpus_query
from service.scheduling.generations import replica_generation
from service.scheduling.weights_lifecycle import pinned_by


def timestamp(column: str) -> str:
    """SQL text: a timestamptz column as the GraphQL DateTime scalar writes it.

    The scalar is Strawberry's: datetime.isoformat() of the value asyncpg
    decodes, which is always in UTC (whatever the session's TimeZone), with
    six digits of microseconds, none when they are zero:
    2026-12-04T07:58:29.120000+00:00, 2026-12-04T07:58:29+00:00. PostgreSQL's
    own to_json writes the session's zone and trims the fraction
    (2026-12-04T08:58:29.12+01:00), so the text is built here. asyncpg
    decodes infinity as datetime.max and -infinity as datetime.min, both
    without a zone. tests/fast_path/test_compiled_page.py compares this with the
    scalar on values of each kind and in several session time zones.
    """
    return (
        f"CASE {column} WHEN 'infinity' THEN '9999-12-31T23:59:59.999999'"
        f" WHEN '-infinity' THEN '0001-01-01T00:00:00'"
        f" ELSE replace(to_char({column} AT TIME ZONE 'UTC',"
        """ 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'), '.000000+', '+') END"""
    )


# Attribute -> SQL expression of its JSON value, per record kind, over the
# kind's table alias.
NODE: Mapping[str, str] = {
    "id": "n.id",
    "hostname": "n.hostname",
    "mgmt_addr": "n.mgmt_addr",
    "memory_total_mb": "n.memory_total_mb",
    "state": "n.state",
    "schedulable": node_schedulable("n"),
    "agent_version": "n.agent_version",
    "knows_its_weights": "n.knows_its_weights",
    "hca_discovery": "n.hca_discovery",
    "boot_id": "n.boot_id",
    "incarnation": "n.incarnation",
    "last_seen": timestamp("n.last_seen"),
    "registered_at": timestamp("n.registered_at"),
    # Node.nvlinkGroups and Node.largestFreeNvlinkGroup, from topology's
    # definitions (their SQL form sits next to the Python one).
    "nvlink_groups": describe_groups_sql("n"),
    "largest_free_nvlink_group": largest_free_group_sql("n"),
    # The reason that explains the state (node_reads.node_from_row): liveness
    # while unreachable or lost, the operator's otherwise.
    "state_reason": state_reason_sql("n"),
    "state_actor": state_actor_sql("n"),
}
GPU: Mapping[str, str] = {
    "index": "g.idx",
    "uuid": "g.uuid",
    "pci_bus_id": "g.pci_bus_id",
    "name": "g.name",
    "gpu_class": "g.gpu_class",
    "memory_mb": "g.memory_mb",
    "healthy": gpu_healthy("g"),
    "health_reasons": gpu_health_reasons("g"),
    "cordon_reason": "g.cordon_reason",
    "sticky_reasons": "g.sticky_reasons",
    "numa_node": "g.numa_node",
    "nvlink_peers": "g.nvlink_peers",
    "nvlink_group": "g.nvlink_group",
    "nvlink_domain": "g.nvlink_domain",
    "near_hcas": "g.near_hcas",
}
SHARD: Mapping[str, str] = {
    "shard_id": "s.shard_id",
    "replica_id": "s.replica_id",
    "node_id": "s.node_id",
    # Sorted, as ShardRecord holds them.
    "gpu_indices": "(SELECT coalesce(array_agg(i ORDER BY i), '{}') FROM unnest(s.gpu_indices) i)",
    "fabric": "s.fabric",
    "hcas": "s.hcas",
    "created_at": timestamp("s.created_at"),
    "fence": "s.fence",
    "generation": replica_generation("s"),
    "held_since": timestamp("s.held_since"),
    "tenant": "s.tenant",
    "priority": "s.priority",
    "deployment": "s.deployment",
    "borrowed": "s.borrowed",
}
FILESYSTEM: Mapping[str, str] = {
    "id": "f.fs_id",
    "mount_point": "f.mount_point",
    "fs_type": "f.fs_type",
    "shared": "f.shared",
    "free_bytes": "f.free_bytes",
    "total_bytes": "f.total_bytes",
    "directories": "f.directories",
}
FABRIC: Mapping[str, str] = {
    "fabric": "fa.fabric",
    "hcas": "fa.hcas",
    "rate_gbps": "fa.rate_gbps",
}
WEIGHTS: Mapping[str, str] = {
    "path": "w.path",
    "size_bytes": "w.size_bytes",
    "revision": "w.revision",
    # The stored value; the compiled page writes the enum's name (as node state).
    "state": "w.state",
    "total_bytes": "w.total_bytes",
    "digest": "w.digest",
    "observed_at": timestamp("w.observed_at"),
    "pinned_by": pinned_by("w"),
}
# A taint (service.scheduling.taints.Taint) over taint_rows.TAINT_ROW `x`: a
# GPU's own (Gpu.taints) or a node's (Node.taints).
TAINT: Mapping[str, str] = {
    "key": "x.key",
    "value": "x.value",
    "effect": "x.effect",
    "source": "x.source",
    "reason": "x.reason",
    "actor": "x.actor",
    "since": timestamp("x.since"),
}
# A drift finding (Node.drift) over drift_findings `d`.
DRIFT: Mapping[str, str] = {
    "kind": "d.kind",
    "expected": "d.expected",
    "observed": "d.observed",
    "since": timestamp("d.since"),
    "gpu_indices": "d.gpu_indices",
    "remediation_id": "d.remediation_id::text",
}
# An open remediation (Node.remediations) over remediations `r`: its id is an ID (text).
REMEDIATION: Mapping[str, str] = {
    "id": "r.id::text",
    "node_id": "r.node_id",
    "gpu_indices": "r.gpu_indices",
    "gpu_class": "r.gpu_class",
    "action": "r.action",
    "state": "r.state",
    "scope": "r.scope",
    "cause": "r.cause",
    "trigger": "r.trigger",
    "taint_key": "r.taint_key",
    "attempts": "r.attempts",
    "failures": "r.failures",
    "created_at": timestamp("r.created_at"),
    "since": timestamp("r.since"),
}
# A node's fleet-health lists, by attribute: their kind and the domain's SQL
# for them (which rows, in which order), given the node's alias and the entry.
HEALTH_LISTS: Mapping[str, tuple[Mapping[str, str], Any]] = {
    "taints": (TAINT, node_taints_sql),
    "drift": (DRIFT, drift_sql),
    "remediations": (REMEDIATION, open_sql),
}

# Gpu.recommendedAction is the remediation policy's word (node_details.recommended_action,
# Python over the policy the service installed), never restated in SQL: a
# GPU with faults is written as a mark holding its sticky reasons and
# recovery action, which the page replaces (_recommend) before it is passed
# on; the others are NONE. The mark's key starts with U+0001, which no key
# of a page can hold otherwise (keys are the selection's, or these), and an
# object's opening `{"` is never inside a JSON string, where `"` is escaped.
_MARK = "\\u0001recommended"
_MARKED = re.compile(r'\{"' + re.escape(_MARK) + r'" : (\[.*?\]), "recovery" : (null|"[^"]*")\}')


def _recommend(found: re.Match[str]) -> str:
    sticky, recovery = json.loads(found[1]), json.loads(found[2])
    return json.dumps(recommended_action(sticky, recovery).name)


def recommend(text: str) -> str:
    """A page's or node's JSON with each GPU's recommendedAction mark replaced by the policy's."""
    return _MARKED.sub(_recommend, text) if _MARK in text else text


# A node's disks (NodeRecord.local_disk / shared_disk): null when unknown.
DISKS: Mapping[str, tuple[str, str]] = {
    "local_disk": ("n.local_disk_free", "n.local_disk_total"),
    "shared_disk": ("n.shared_disk_free", "n.shared_disk_total"),
}
DISK: Mapping[str, int] = {"free_bytes": 0, "total_bytes": 1}
# A node's key-value lists (Node.labels, Node.engineVersions), in node_reads.by_key's order.
KEY_VALUE_LISTS: Mapping[str, str] = {"labels": "n.labels", "engine_versions": "n.engine_versions"}
KEY_VALUE: Mapping[str, str] = {"key": "e.key", "value": "e.value"}

# A node's detail lists: the kind of their items, FROM ... WHERE, and the
# order their loaders read them in.
_LISTS: Mapping[str, tuple[Mapping[str, str], str, str]] = {
    "gpus": (
        GPU,
        "FROM gpus g LEFT JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx"
        " LEFT JOIN shards s ON s.shard_id = a.shard_id WHERE g.node_id = n.id",
        "g.idx",
    ),
    # Node.freeGpus without gpuClass: the gpus list, kept to availability's
    # one definition of a free GPU (a free GPU has no holding shard).
    "free_gpus": (
        GPU,
        "FROM gpus g LEFT JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx"
        f" LEFT JOIN shards s ON s.shard_id = a.shard_id WHERE g.node_id = n.id AND {gpu_free('g')}",
        "g.idx",
    ),
    "filesystems": (
        FILESYSTEM,
        "FROM filesystems f WHERE f.node_id = n.id",
        "f.mount_point, f.fs_id",
    ),
    "shards": (SHARD, "FROM shards s WHERE s.node_id = n.id", "s.shard_id"),
    "fabrics": (FABRIC, "FROM fabric_attachments fa WHERE fa.node_id = n.id", "fa.fabric"),
    "weights": (WEIGHTS, "FROM weights w WHERE w.node_id = n.id", "w.path"),
}
# An entry of capacity.free_gpus (NodeFreeGpus), over its row `q`: the node is
# the whole node object, read in the same statement.
FREE_GPUS: Mapping[str, str] = {"gpu_indices": "coalesce(q.indices, '{}')"}
# An entry's node when the selection reads only its id: the entry's own
# node_id, not a lookup of the node row per entry (buffers a page need not
# read). Exact: the entry comes from a gpu_pools row, whose
# node_id references nodes, in the same snapshot.
ENTRY_NODE: Mapping[str, str] = {"id": "q.node_id"}


@dataclass(frozen=True)
class Value:
    """One key of an object: an attribute's value, a constant, or a nested selection.

    `names` renders the value by name (an enum's values to their names); the
    caller gives a name to every value the attribute can hold.
    """

    key: str
    attribute: str = ""
    constant: str | None = None
    names: Mapping[str, str] | None = None
    selection: tuple[Value, ...] | None = None


@dataclass(frozen=True)
class JsonPage:
    """A page's entries as a JSON array (text), and PAGE_TRUNCATED when it stopped short."""

    entries: str
    truncated: PageTruncated | None


async def _json_page(
    conn: Connection,
    entry: str,
    rows: str,
    alias: str,
    key: str,
    params: dict[str, Any],
    request: PageRequest,
) -> JsonPage:
    """The first request.size of `rows` (read with request.limit), each as `entry`, by `key`.

    `entry` reads each row as `alias`. Every row read is numbered in the
    page's order: those past the page are only counted, and the last one
    kept gives the cursor that continues.
    """
    order = f"{alias}.{key}"
    sql = (
        f"SELECT coalesce(json_agg({entry} ORDER BY {order})"
        f" FILTER (WHERE {alias}.page_position <= :kept), '[]')::text AS entries,"
        f" count(*) AS read, max({order}) FILTER (WHERE {alias}.page_position = :kept) AS last"
        f" FROM (SELECT {alias}.*, row_number() OVER (ORDER BY {order}) AS page_position"
        f" FROM ({rows}) {alias}) {alias}"
    )
    row = (await conn.execute(cached_text(sql), {**params, "kept": request.size})).one()
    if stops_short(request, row.read):
        return JsonPage(row.entries, PageTruncated(row.last, request.size))
    return JsonPage(row.entries, None)


def _recommended(page: JsonPage) -> JsonPage:
    return JsonPage(recommend(page.entries), page.truncated)


class Unsupported(ValueError):
    """The selection names something this module cannot build."""


class _Statement:
    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        # Whether the JSON holds recommendedAction marks, for recommend().
        self.recommends = False

    def param(self, value: Any) -> str:
        name = f"p{len(self.params)}"
        self.params[name] = value
        return f"CAST(:{name} AS text)"

    def object(self, kind: Mapping[str, str], selection: Sequence[Value]) -> str:
        parts: list[str] = []
        for value in selection:
            parts.append(self.param(value.key))
            parts.append(self.value(kind, value))
        return f"json_build_object({', '.join(parts)})"

    def value(self, kind: Mapping[str, str], value: Value) -> str:
        if value.constant is not None:
            return self.param(value.constant)
        attribute = value.attribute
        if kind is GPU and attribute == "recommended_action" and value.selection is None:
            self.recommends = True
            none = self.param(RemediationAction.NONE.name)
            return (
                f"CASE WHEN {has_faults_sql('g')} THEN json_build_object(chr(1) || 'recommended',"
                f" g.sticky_reasons, 'recovery', g.recovery_action) ELSE to_json({none}) END"
            )
        if value.selection is None:
            expression = kind.get(attribute)
            if expression is None:
                raise Unsupported(attribute)
            if value.names is not None:
                cases = " ".join(
                    f"WHEN {self.param(v)} THEN {self.param(n)}" for v, n in value.names.items()
                )
                expression = f"CASE {expression} {cases} END"
            return expression
        if kind is NODE and attribute in DISKS:
            free, total = DISKS[attribute]
            columns = (free, total)
            parts: list[str] = []
            for sub in value.selection:
                parts.append(self.param(sub.key))
                if sub.constant is not None:
                    parts.append(self.param(sub.constant))
                elif sub.attribute in DISK and sub.selection is None and sub.names is None:
                    parts.append(columns[DISK[sub.attribute]])
                else:
                    raise Unsupported(sub.attribute)
            return f"CASE WHEN {total} IS NULL THEN NULL ELSE json_build_object({', '.join(parts)}) END"
        if kind is NODE and attribute in KEY_VALUE_LISTS:
            entry = self.object(KEY_VALUE, value.selection)
            return by_key_sql(KEY_VALUE_LISTS[attribute], entry)
        if kind is NODE and attribute in HEALTH_LISTS:
            item, rows = HEALTH_LISTS[attribute]
            return str(rows("n", self.object(item, value.selection)))
        if kind is GPU and attribute == "taints":
            return f"coalesce({gpu_taints_sql('g', self.object(TAINT, value.selection))}, '[]')"
        if kind is NODE and attribute in _LISTS:
            item, source, order = _LISTS[attribute]
            return (
                f"(SELECT coalesce(json_agg({self.object(item, value.selection)}"
                f" ORDER BY {order}), '[]') {source})"
            )
        if kind is FREE_GPUS and attribute == "node":
            if all(
                v.constant is not None or (v.attribute in ENTRY_NODE and v.selection is None)
                for v in value.selection
            ):
                return self.object(ENTRY_NODE, value.selection)
            return (
                f"(SELECT {self.object(NODE, value.selection)} FROM nodes n WHERE n.id = q.node_id)"
            )
        if kind is GPU and attribute == "shard":
            # The GPU's holding shard, joined in the gpus list: null when free.
            return (
                f"CASE WHEN s.shard_id IS NULL THEN NULL"
                f" ELSE {self.object(SHARD, value.selection)} END"
            )
        raise Unsupported(attribute)


class FreeGpusPage:
    """capacity.free_gpus' answer with each entry as the selection says, built once."""

    def __init__(self, selection: Sequence[Value]) -> None:
        statement = _Statement()
        self._entry = statement.object(FREE_GPUS, selection)  # raises Unsupported
        self._params = statement.params
        self._recommends = statement.recommends

    async def fetch(
        self,
        conn: Connection,
        *,
        gpu_class: str | None,
        fabric: str | None,
        min_free: int,
        request: PageRequest,
        after: str | None = None,
    ) -> JsonPage:
        """The page of entries free_gpus returns, as a JSON array."""
        query, params = free_gpus_query(
            gpu_class=gpu_class, fabric=fabric, min_free=min_free, first=request.limit, after=after
        )
        # free_gpus_query names its parameters by word, ours are p<n>: no clash.
        page = await _json_page(
            conn, self._entry, query, "q", "node_id", {**params, **self._params}, request
        )
        return _recommended(page) if self._recommends else page


class NodePage:
    """The statement for one selection, built once; fetched for any page."""

    def __init__(self, selection: Sequence[Value]) -> None:
        statement = _Statement()
        self._node = statement.object(NODE, selection)  # raises Unsupported
        self._params = statement.params
        self._recommends = statement.recommends

    async def fetch(
        self,
        conn: Connection,
        node_filter: NodeFilter,
        request: PageRequest,
        after: str | None = None,
    ) -> JsonPage:
        """The page list_nodes reads, each node as the selection says, as a JSON array."""
        clause, params = page_clause(node_filter, request.limit, after)
        # page_clause names its parameters by word, ours are p<n>: no clash.
        page = await _json_page(
            conn,
            self._node,
            f"SELECT * FROM nodes n {clause}",
            "n",
            "id",
            {**params, **self._params},
            request,
        )
        return _recommended(page) if self._recommends else page


class OneNode:
    """Nodes by id as the selection says: node_reads.get_nodes' nodes, built once per selection."""

    def __init__(self, selection: Sequence[Value]) -> None:
        statement = _Statement()
        node = statement.object(NODE, selection)  # raises Unsupported
        # The parameters are p<n> (keys, constants) and the ids.
        self._sql = cached_text(
            f"SELECT n.id, {node}::text AS node FROM nodes n"
            " WHERE n.id = ANY(CAST(:node_ids AS text[]))"
        )
        self._params = statement.params
        self._recommends = statement.recommends

    async def fetch(self, conn: Connection, node_ids: Sequence[str]) -> dict[str, str]:
        """Each node's JSON object (text) by id; an id of no node is left out."""
        rows = await conn.execute(self._sql, {**self._params, "node_ids": list(node_ids)})
        if self._recommends:
            return {row[0]: recommend(row[1]) for row in rows}
        return {row[0]: row[1] for row in rows}
