"""A node's life as the agent and the operator shape it: register, heartbeat, cordon, drain, remove.

Functions here run inside the caller's transaction and never commit: the
resolver opens one transaction per mutation, so a report is stored whole or
not at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import text

from service import gpu_health
from service.availability import USABLE_COLUMNS, gpu_usable, node_schedulable, pool_counts
from service.connections import Connection
from service.errors import InvalidInput, NodeNotFound
from service.events import note_recorded, record_event
from service.gpu_health import ReportedXid
from service.gpu_pools import POOL_UPSERT, refresh_pools
from service.node_views import NODE_COLUMNS, NodeRecord, node_from_row
from service.reports import MAX_TEXT_LENGTH, NodeReport, gpu_class_of, sum_disks, validate_report
from service.topology import nvlink_groups


@dataclass(frozen=True)
class Registration:
    node_id: str
    created: bool
    changed: bool
    # The node's row as this registration left it (the caller's reply needs
    # no second read: nothing after the upsert changes the row).
    node: NodeRecord
    # The XIDs the report carried, for the caller to count once it commits.
    xids: tuple[ReportedXid, ...] = ()


# One round trip answers "new, changed or the same?": the old row is read
# (and locked) in the statement that upserts it. The operator's cordon or
# drain and its reason are not in the SET list, so they survive: an agent
# reconnecting must not silently undo an operator's decision.
_UPSERT_NODE = text(
    f"""
    WITH old AS (
        SELECT report_digest, liveness, boot_id FROM nodes WHERE id = :id FOR NO KEY UPDATE
    ), upserted AS (
        INSERT INTO nodes AS n (
            id, hostname, mgmt_addr, labels, memory_total_mb, agent_version, engine_versions,
            local_disk_free, local_disk_total, shared_disk_free, shared_disk_total,
            knows_its_weights, report_digest, boot_id
        )
        -- Selected through `old`, so the old row is read (and locked) before
        -- this row is written: read after, in the same statement, the lock
        -- skips the row this statement just updated and every re-registration
        -- looked like a new node, rewriting its hardware and logging
        -- "registered" again.
        SELECT CAST(:id AS text), CAST(:hostname AS text), CAST(:mgmt_addr AS text),
               CAST(:labels AS jsonb), CAST(:memory_total_mb AS integer),
               CAST(:agent_version AS text), CAST(:engine_versions AS jsonb),
               CAST(:local_free AS bigint), CAST(:local_total AS bigint),
               CAST(:shared_free AS bigint), CAST(:shared_total AS bigint),
               CAST(:knows_its_weights AS boolean), CAST(:digest AS text),
               CAST(:boot_id AS text)
        FROM (SELECT 1) AS one LEFT JOIN old ON true
        ON CONFLICT (id) DO UPDATE SET
            hostname = excluded.hostname,
            mgmt_addr = excluded.mgmt_addr,
            labels = excluded.labels,
            memory_total_mb = excluded.memory_total_mb,
            agent_version = excluded.agent_version,
            engine_versions = excluded.engine_versions,
            local_disk_free = excluded.local_disk_free,
            local_disk_total = excluded.local_disk_total,
            shared_disk_free = excluded.shared_disk_free,
            shared_disk_total = excluded.shared_disk_total,
            knows_its_weights = excluded.knows_its_weights,
            report_digest = excluded.report_digest,
            -- An agent that does not say keeps the last boot id it said.
            boot_id = coalesce(excluded.boot_id, n.boot_id),
            reported_at = CASE WHEN n.report_digest IS DISTINCT FROM excluded.report_digest
                               THEN now() ELSE n.reported_at END,
            liveness = 'alive',
            liveness_reason = NULL,
            last_seen = now()
        RETURNING {NODE_COLUMNS}
    )
    SELECT upserted.*,
           (SELECT report_digest FROM old) AS old_digest,
           (SELECT liveness FROM old) AS old_liveness,
           (SELECT boot_id FROM old) AS old_boot_id,
           NOT EXISTS (SELECT 1 FROM old) AS created
    FROM upserted
    """
)

# Everything a changed (or returning) report writes after the node row, in
# one round trip: the four child tables, the node's gpu_pools rows and the
# events. Round trips dominate a registration's cost (seven statements ran
# about half as fast as one here).
#
# It runs as a second statement, after _UPSERT_NODE holds the node's row lock,
# and not fused into it: READ COMMITTED gives each statement the snapshot of
# its start, and a statement that waited for the lock behind an allocation
# would count free GPUs from a snapshot without that allocation. Started under
# the lock, this one sees every allocation committed on the node, and none can
# commit until we do (allocate takes the same lock first).
#
# Its own writes are invisible to its own reads, so the pool counts come from
# the report's GPUs when it changed (what the gpus table holds afterwards) and
# from the stored GPUs otherwise. Unchanged rows are not rewritten (the IS
# DISTINCT FROM guards): dead tuples are what slows the scheduler's scans
# after a burst of re-registrations.
_REPLACE_REPORT = text(
    f"""
    WITH g_in AS (
        SELECT * FROM jsonb_to_recordset(CAST(:gpus AS jsonb)) AS r(
            idx int, uuid text, pci_bus_id text, name text, gpu_class text, memory_mb int,
            healthy boolean, health_reasons text[], numa_node int, nvlink_peers int[],
            nvlink_group int, nvlink_domain text, near_hcas text[])
    ), g_gone AS (
        DELETE FROM gpus g WHERE CAST(:changed AS boolean) AND g.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM g_in i WHERE i.idx = g.idx)
    ), g_up AS (
        INSERT INTO gpus AS g (
            node_id, idx, uuid, pci_bus_id, name, gpu_class, memory_mb, healthy, health_reasons,
            numa_node, nvlink_peers, nvlink_group, nvlink_domain, near_hcas)
        SELECT :node_id, idx, uuid, pci_bus_id, name, gpu_class, memory_mb, healthy, health_reasons,
               numa_node, nvlink_peers, nvlink_group, nvlink_domain, near_hcas
        FROM g_in WHERE CAST(:changed AS boolean) ORDER BY idx
        ON CONFLICT (node_id, idx) DO UPDATE SET
            uuid = excluded.uuid, pci_bus_id = excluded.pci_bus_id, name = excluded.name,
            gpu_class = excluded.gpu_class,
            memory_mb = excluded.memory_mb, healthy = excluded.healthy,
            health_reasons = excluded.health_reasons,
            numa_node = excluded.numa_node, nvlink_peers = excluded.nvlink_peers,
            nvlink_group = excluded.nvlink_group, nvlink_domain = excluded.nvlink_domain,
            near_hcas = excluded.near_hcas
        WHERE (g.uuid, g.pci_bus_id, g.name, g.gpu_class, g.memory_mb, g.healthy,
               g.health_reasons, g.numa_node, g.nvlink_peers, g.nvlink_group, g.nvlink_domain,
               g.near_hcas)
              IS DISTINCT FROM
              (excluded.uuid, excluded.pci_bus_id, excluded.name, excluded.gpu_class,
               excluded.memory_mb,
               excluded.healthy, excluded.health_reasons, excluded.numa_node,
               excluded.nvlink_peers, excluded.nvlink_group, excluded.nvlink_domain,
               excluded.near_hcas)
    ), f_in AS (
        SELECT * FROM jsonb_to_recordset(CAST(:fabrics AS jsonb))
            AS r(fabric text, hcas text[], rate_gbps int)
    ), f_gone AS (
        DELETE FROM fabric_attachments f WHERE CAST(:changed AS boolean) AND f.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM f_in i WHERE i.fabric = f.fabric)
    ), f_up AS (
        INSERT INTO fabric_attachments AS f (node_id, fabric, hcas, rate_gbps)
        SELECT :node_id, fabric, hcas, rate_gbps FROM f_in
        WHERE CAST(:changed AS boolean) ORDER BY fabric
        ON CONFLICT (node_id, fabric) DO UPDATE
        SET hcas = excluded.hcas, rate_gbps = excluded.rate_gbps
        WHERE (f.hcas, f.rate_gbps) IS DISTINCT FROM (excluded.hcas, excluded.rate_gbps)
    ), s_in AS (
        SELECT * FROM jsonb_to_recordset(CAST(:filesystems AS jsonb)) AS r(
            fs_id text, mount_point text, fs_type text, shared boolean, free_bytes bigint,
            total_bytes bigint, directories text[])
    ), s_gone AS (
        DELETE FROM filesystems f WHERE CAST(:changed AS boolean) AND f.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM s_in i WHERE i.fs_id = f.fs_id)
    ), s_up AS (
        INSERT INTO filesystems AS f (
            node_id, fs_id, mount_point, fs_type, shared, free_bytes, total_bytes, directories)
        SELECT :node_id, fs_id, mount_point, fs_type, shared, free_bytes, total_bytes,
               directories
        FROM s_in WHERE CAST(:changed AS boolean) ORDER BY fs_id
        ON CONFLICT (node_id, fs_id) DO UPDATE SET
            mount_point = excluded.mount_point, fs_type = excluded.fs_type,
            shared = excluded.shared, free_bytes = excluded.free_bytes,
            total_bytes = excluded.total_bytes, directories = excluded.directories
        WHERE (f.mount_point, f.fs_type, f.shared, f.free_bytes, f.total_bytes, f.directories)
              IS DISTINCT FROM
              (excluded.mount_point, excluded.fs_type, excluded.shared, excluded.free_bytes,
               excluded.total_bytes, excluded.directories)
    ), w_in AS (
        SELECT * FROM jsonb_to_recordset(CAST(:weights AS jsonb))
            AS r(path text, size_bytes bigint)
    ), w_gone AS (
        DELETE FROM weights w WHERE CAST(:changed AS boolean) AND w.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM w_in i WHERE i.path = w.path)
    ), w_up AS (
        INSERT INTO weights AS w (node_id, path, size_bytes)
        SELECT :node_id, path, size_bytes FROM w_in
        WHERE CAST(:changed AS boolean) ORDER BY path
        ON CONFLICT (node_id, path) DO UPDATE SET size_bytes = excluded.size_bytes
        WHERE w.size_bytes IS DISTINCT FROM excluded.size_bytes
    ), gpus_now AS (
        -- The GPUs as the gpus table holds them after this statement, with
        -- the columns availability.gpu_usable reads (USABLE_COLUMNS): the
        -- report's, and the service's own (cordon, sticky reasons) that a
        -- report does not overwrite.
        SELECT i.idx, i.gpu_class, i.healthy,
               coalesce(o.sticky_reasons, CAST('{{}}' AS text[])) AS sticky_reasons,
               o.cordon_reason
        FROM g_in i LEFT JOIN gpus o ON o.node_id = :node_id AND o.idx = i.idx
        WHERE CAST(:changed AS boolean)
        UNION ALL
        SELECT idx, gpu_class, {", ".join(USABLE_COLUMNS)} FROM gpus
        WHERE node_id = :node_id AND NOT CAST(:changed AS boolean)
    ), counts AS (
        SELECT g.gpu_class, {pool_counts("g", "a.gpu_index IS NOT NULL")}
        FROM gpus_now g
        LEFT JOIN allocated_gpus a ON a.node_id = :node_id AND a.gpu_index = g.idx
        GROUP BY g.gpu_class
    ), pools_gone AS (
        DELETE FROM gpu_pools p WHERE p.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM counts c WHERE c.gpu_class = p.gpu_class)
    ), pools_up AS (
        INSERT INTO gpu_pools AS p (
            node_id, gpu_class, total, unhealthy, allocated, free, schedulable)
        SELECT :node_id, c.gpu_class, c.total, c.unhealthy, c.allocated, c.free,
               {node_schedulable("n")}
        FROM counts c JOIN nodes n ON n.id = :node_id
        ORDER BY c.gpu_class
        {POOL_UPSERT}
    ), recorded AS (
        -- The rows service.events.record_event writes, in the order given.
        INSERT INTO events (kind, node_id, actor, reason)
        SELECT e.item ->> 'kind', :node_id, :actor, e.item ->> 'reason'
        FROM jsonb_array_elements(CAST(:events AS jsonb)) WITH ORDINALITY AS e(item, ord)
        ORDER BY e.ord
        RETURNING id
    ), failed AS (
        -- A held GPU this report makes unusable keeps its allocation; its
        -- holder is told (service/gpu_health.after_change does the same for
        -- cordons and XIDs). `o` is the stored row, as before this statement.
        INSERT INTO events (kind, node_id, replica_id, shard_id, actor, reason, detail)
        SELECT 'gpu_failed_under_allocation', :node_id, s.replica_id, s.shard_id, :actor,
               'unhealthy: ' || array_to_string(i.health_reasons, ', '),
               jsonb_build_object('index', i.idx, 'uuid', i.uuid)
        FROM gpus_now g
        JOIN g_in i ON i.idx = g.idx
        JOIN gpus o ON o.node_id = :node_id AND o.idx = g.idx
        JOIN allocated_gpus a ON a.node_id = :node_id AND a.gpu_index = g.idx
        JOIN shards s ON s.shard_id = a.shard_id
        WHERE CAST(:changed AS boolean) AND {gpu_usable("o")} AND NOT {gpu_usable("g")}
        ORDER BY g.idx
        RETURNING id
    )
    SELECT id FROM recorded UNION ALL SELECT id FROM failed
    """
)


def _rows_json(rows: Sequence[Mapping[str, object]]) -> str:
    return json.dumps(rows, separators=(",", ":"))


async def register_node(
    conn: Connection, report: NodeReport, actor: str | None = None
) -> Registration:
    """Create or replace a node's report. Its cordon, drain and allocations survive."""
    validate_report(report)
    digest = report.digest()
    disks = sum_disks(report.storage)
    result = await conn.execute(
        _UPSERT_NODE,
        {
            "id": report.id,
            "hostname": report.hostname,
            "mgmt_addr": report.mgmt_addr,
            "labels": json.dumps(dict(report.labels)),
            "memory_total_mb": report.memory_total_mb,
            "agent_version": report.agent_version,
            "engine_versions": json.dumps(dict(report.engine_versions)),
            "local_free": disks.local.free_bytes if disks.local else None,
            "local_total": disks.local.total_bytes if disks.local else None,
            "shared_free": disks.shared.free_bytes if disks.shared else None,
            "shared_total": disks.shared.total_bytes if disks.shared else None,
            "knows_its_weights": bool(report.weights),
            "digest": digest,
            "boot_id": report.boot_id,
        },
    )
    row = result.one()
    created = bool(row.created)
    changed = created or row.old_digest != digest
    came_back = row.old_liveness is not None and row.old_liveness != "alive"
    node = node_from_row(row)
    rebooted = row.old_boot_id is not None and report.boot_id not in (None, row.old_boot_id)

    if not (changed or came_back):
        # The common case: an agent re-sending what it sent before. Only the
        # node row's last_seen moved; nothing else is rewritten.
        xids = await gpu_health.after_report(conn, report, rebooted, actor)
        return Registration(report.id, created, changed, node, xids)

    events: list[dict[str, str | None]] = []
    if created:
        events.append({"kind": "registered", "reason": None})
    elif changed:
        events.append({"kind": "report_changed", "reason": None})
    if came_back:
        events.append({"kind": "back", "reason": f"registered while {row.old_liveness}"})
    recorded = await conn.execute(
        _REPLACE_REPORT,
        {
            "node_id": report.id,
            "changed": changed,
            **_hardware_rows(report),
            "events": _rows_json(events),
            "actor": actor,
        },
    )
    note_recorded(list(recorded.scalars()))
    xids = await gpu_health.after_report(conn, report, rebooted, actor)
    return Registration(report.id, created, changed, node, xids)


def _hardware_rows(report: NodeReport) -> dict[str, str]:
    """The report's child rows as the JSON parameters of _REPLACE_REPORT."""
    groups = nvlink_groups({g.index: g.nvlink_peers for g in report.gpus})
    gpus = [
        {
            "idx": g.index,
            "uuid": g.uuid,
            "pci_bus_id": g.pci_bus_id,
            "name": g.name,
            "gpu_class": gpu_class_of(g),
            "memory_mb": g.memory_mb,
            "healthy": g.healthy,
            # A GPU reported unhealthy without a reason still says so.
            "health_reasons": sorted(set(g.health_reasons)) or ([] if g.healthy else ["unhealthy"]),
            "numa_node": g.numa_node,
            "nvlink_peers": None if g.nvlink_peers is None else sorted(g.nvlink_peers),
            "nvlink_group": groups[g.index],
            "nvlink_domain": g.nvlink_domain,
            "near_hcas": None if g.near_hcas is None else sorted(set(g.near_hcas)),
        }
        for g in report.gpus
    ]
    fabrics = [
        {"fabric": f.fabric, "hcas": list(f.hcas), "rate_gbps": f.rate_gbps} for f in report.fabrics
    ]
    filesystems = [
        {
            "fs_id": fs.id,
            "mount_point": fs.mount_point,
            "fs_type": fs.fs_type,
            "shared": fs.shared,
            "free_bytes": fs.free_bytes,
            "total_bytes": fs.total_bytes,
            "directories": sorted(set(fs.directories)),
        }
        for fs in report.storage
    ]
    weights = [{"path": w.path, "size_bytes": w.size_bytes} for w in report.weights]
    return {
        "gpus": _rows_json(gpus),
        "fabrics": _rows_json(fabrics),
        "filesystems": _rows_json(filesystems),
        "weights": _rows_json(weights),
    }


# Many nodes' heartbeats in one statement: service/heartbeats.py gathers the
# beats that arrive while a batch is in flight. Rows are locked in id order,
# the order every writer of several nodes uses, so two batches (or a batch
# and an allocation) queue instead of deadlocking. The new row comes back
# whole, so the reply needs no second read.
_HEARTBEATS = text(
    f"""
    WITH old AS (
        SELECT id, liveness FROM nodes WHERE id = ANY(CAST(:ids AS text[]))
        ORDER BY id FOR NO KEY UPDATE
    )
    UPDATE nodes n SET last_seen = now(), liveness = 'alive', liveness_reason = NULL
    FROM old WHERE n.id = old.id
    RETURNING {NODE_COLUMNS}, old.liveness AS old_liveness
    """
)


# The common case alone: known nodes that were alive and stay alive. Nothing
# else changes with such a beat (no pools, no event), so it is one statement,
# which its caller runs without BEGIN and COMMIT: two round trips of the
# three a batch cost. Rows are locked in id order, like _HEARTBEATS, so two
# processes' batches cannot deadlock; a node the sweep marked unreachable
# meanwhile fails the re-checked liveness test and is left to heartbeat_many.
_ALIVE_HEARTBEATS = text(
    f"""
    WITH alive AS (
        SELECT id FROM nodes WHERE id = ANY(CAST(:ids AS text[])) AND liveness = 'alive'
        ORDER BY id FOR NO KEY UPDATE
    )
    UPDATE nodes n SET last_seen = now()
    FROM alive WHERE n.id = alive.id
    RETURNING {NODE_COLUMNS}
    """
)


async def heartbeat_alive(conn: Connection, node_ids: Sequence[str]) -> dict[str, NodeRecord]:
    """Stamp the beats of nodes that were alive, in one statement; the others are absent.

    Whatever is absent (an unknown node, one coming back) goes to heartbeat_many.
    """
    rows = await conn.execute(_ALIVE_HEARTBEATS, {"ids": sorted(set(node_ids))})
    # The id from the record: a row's `.id` is a __getattr__ after a failed lookup.
    return {node.id: node for node in map(node_from_row, rows)}


async def heartbeat_many(conn: Connection, node_ids: Sequence[str]) -> dict[str, NodeRecord]:
    """Record that these nodes are alive, by the database's clock; bring back any that were not.

    The database's clock, because several service processes stamp the same
    column and the liveness sweep compares against now() on the same server.
    Unknown ids are absent from the answer. Returns each node as it is now.
    """
    rows = list(await conn.execute(_HEARTBEATS, {"ids": sorted(set(node_ids))}))
    back = [r for r in rows if r.old_liveness != "alive"]
    if back:
        await refresh_pools(conn, [r.id for r in back])
        for r in sorted(back, key=lambda r: r.id):
            await record_event(
                conn, "back", node_id=r.id, reason=f"heartbeat while {r.old_liveness}"
            )
    return {r.id: node_from_row(r) for r in rows}


async def heartbeat(conn: Connection, node_id: str) -> None:
    """One node's heartbeat in the caller's transaction; see heartbeat_many."""
    if node_id not in await heartbeat_many(conn, [node_id]):
        raise NodeNotFound(node_id)


def check_reason(reason: str) -> str:
    cleaned = reason.strip()
    if not cleaned:
        raise InvalidInput("reason", reason, "say why, for the next operator to read")
    if len(cleaned) > MAX_TEXT_LENGTH:
        raise InvalidInput("reason", reason, f"longer than {MAX_TEXT_LENGTH} characters")
    return cleaned


_SET_ADMIN = text(
    """
    UPDATE nodes SET admin_state = :admin_state, admin_reason = :reason, admin_actor = :actor
    WHERE id = :id
    RETURNING id
    """
)


async def _set_admin_state(
    conn: Connection,
    node_id: str,
    admin_state: str | None,
    reason: str | None,
    actor: str | None,
) -> None:
    params = {"id": node_id, "admin_state": admin_state, "reason": reason, "actor": actor}
    if (await conn.execute(_SET_ADMIN, params)).one_or_none() is None:
        raise NodeNotFound(node_id)
    await refresh_pools(conn, [node_id])


async def cordon_node(conn: Connection, node_id: str, reason: str, actor: str | None) -> None:
    """Exclude the node from new placement; what runs there keeps running."""
    reason = check_reason(reason)
    await _set_admin_state(conn, node_id, "cordoned", reason, actor)
    await record_event(conn, "cordoned", node_id=node_id, actor=actor, reason=reason)


async def drain_node(conn: Connection, node_id: str, reason: str, actor: str | None) -> None:
    """Mark the node's replicas for moving off; like a cordon, it takes no new ones."""
    reason = check_reason(reason)
    await _set_admin_state(conn, node_id, "draining", reason, actor)
    await record_event(conn, "drained", node_id=node_id, actor=actor, reason=reason)


async def uncordon_node(conn: Connection, node_id: str, actor: str | None) -> None:
    await _set_admin_state(conn, node_id, None, None, actor)
    await record_event(conn, "uncordoned", node_id=node_id, actor=actor)


_REMOVE = text("DELETE FROM nodes WHERE id = :id RETURNING id")


async def remove_node(conn: Connection, node_id: str, actor: str | None) -> bool:
    """Forget the node; its GPUs, reports and allocations go with it (foreign keys cascade)."""
    removed = (await conn.execute(_REMOVE, {"id": node_id})).one_or_none() is not None
    if removed:
        await record_event(conn, "removed", node_id=node_id, actor=actor)
    return removed
