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
from sqlalchemy.ext.asyncio import AsyncConnection

from service.errors import InvalidInput, NodeNotFound
from service.events import record_event
from service.gpu_pools import refresh_pools
from service.reports import MAX_TEXT_LENGTH, NodeReport, gpu_class_of, sum_disks, validate_report


@dataclass(frozen=True)
class Registration:
    node_id: str
    created: bool
    changed: bool


# One round trip answers "new, changed or the same?": the old row is read
# (and locked) in the statement that upserts it. The operator's cordon or
# drain and its reason are not in the SET list, so they survive: an agent
# reconnecting must not silently undo an operator's decision.
_UPSERT_NODE = text(
    """
    WITH old AS (
        SELECT report_digest, liveness FROM nodes WHERE id = :id FOR NO KEY UPDATE
    ), upserted AS (
        INSERT INTO nodes AS n (
            id, hostname, mgmt_addr, labels, memory_total_mb, agent_version, engine_versions,
            local_disk_free, local_disk_total, shared_disk_free, shared_disk_total,
            knows_its_weights, report_digest
        ) VALUES (
            :id, :hostname, :mgmt_addr, CAST(:labels AS jsonb), :memory_total_mb, :agent_version,
            CAST(:engine_versions AS jsonb), :local_free, :local_total, :shared_free,
            :shared_total, :knows_its_weights, :digest
        )
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
            reported_at = CASE WHEN n.report_digest IS DISTINCT FROM excluded.report_digest
                               THEN now() ELSE n.reported_at END,
            liveness = 'alive',
            liveness_reason = NULL,
            last_seen = now()
        RETURNING n.id
    )
    SELECT (SELECT report_digest FROM old) AS old_digest,
           (SELECT liveness FROM old) AS old_liveness,
           NOT EXISTS (SELECT 1 FROM old) AS created
    FROM upserted
    """
)

_REPLACE_GPUS = text(
    """
    WITH incoming AS (
        SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
            idx int, uuid text, name text, gpu_class text, memory_mb int, healthy boolean,
            health_reasons text[])
    ), gone AS (
        DELETE FROM gpus g WHERE g.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM incoming i WHERE i.idx = g.idx)
    )
    INSERT INTO gpus AS g (node_id, idx, uuid, name, gpu_class, memory_mb, healthy, health_reasons)
    SELECT :node_id, idx, uuid, name, gpu_class, memory_mb, healthy, health_reasons
    FROM incoming ORDER BY idx
    ON CONFLICT (node_id, idx) DO UPDATE SET
        uuid = excluded.uuid, name = excluded.name, gpu_class = excluded.gpu_class,
        memory_mb = excluded.memory_mb, healthy = excluded.healthy,
        health_reasons = excluded.health_reasons
    WHERE (g.uuid, g.name, g.gpu_class, g.memory_mb, g.healthy, g.health_reasons)
          IS DISTINCT FROM
          (excluded.uuid, excluded.name, excluded.gpu_class, excluded.memory_mb,
           excluded.healthy, excluded.health_reasons)
    """
)

_REPLACE_FABRICS = text(
    """
    WITH incoming AS (
        SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb))
            AS r(fabric text, hcas text[], rate_gbps int)
    ), gone AS (
        DELETE FROM fabric_attachments f WHERE f.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM incoming i WHERE i.fabric = f.fabric)
    )
    INSERT INTO fabric_attachments AS f (node_id, fabric, hcas, rate_gbps)
    SELECT :node_id, fabric, hcas, rate_gbps FROM incoming ORDER BY fabric
    ON CONFLICT (node_id, fabric) DO UPDATE SET hcas = excluded.hcas, rate_gbps = excluded.rate_gbps
    WHERE (f.hcas, f.rate_gbps) IS DISTINCT FROM (excluded.hcas, excluded.rate_gbps)
    """
)

_REPLACE_FILESYSTEMS = text(
    """
    WITH incoming AS (
        SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
            fs_id text, mount_point text, fs_type text, shared boolean, free_bytes bigint,
            total_bytes bigint, directories text[])
    ), gone AS (
        DELETE FROM filesystems f WHERE f.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM incoming i WHERE i.fs_id = f.fs_id)
    )
    INSERT INTO filesystems AS f (
        node_id, fs_id, mount_point, fs_type, shared, free_bytes, total_bytes, directories)
    SELECT :node_id, fs_id, mount_point, fs_type, shared, free_bytes, total_bytes, directories
    FROM incoming ORDER BY fs_id
    ON CONFLICT (node_id, fs_id) DO UPDATE SET
        mount_point = excluded.mount_point, fs_type = excluded.fs_type, shared = excluded.shared,
        free_bytes = excluded.free_bytes, total_bytes = excluded.total_bytes,
        directories = excluded.directories
    WHERE (f.mount_point, f.fs_type, f.shared, f.free_bytes, f.total_bytes, f.directories)
          IS DISTINCT FROM
          (excluded.mount_point, excluded.fs_type, excluded.shared, excluded.free_bytes,
           excluded.total_bytes, excluded.directories)
    """
)

_REPLACE_WEIGHTS = text(
    """
    WITH incoming AS (
        SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(path text, size_bytes bigint)
    ), gone AS (
        DELETE FROM weights w WHERE w.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM incoming i WHERE i.path = w.path)
    )
    INSERT INTO weights AS w (node_id, path, size_bytes)
    SELECT :node_id, path, size_bytes FROM incoming ORDER BY path
    ON CONFLICT (node_id, path) DO UPDATE SET size_bytes = excluded.size_bytes
    WHERE w.size_bytes IS DISTINCT FROM excluded.size_bytes
    """
)


def _rows_json(rows: Sequence[Mapping[str, object]]) -> str:
    return json.dumps(rows, separators=(",", ":"))


async def register_node(
    conn: AsyncConnection, report: NodeReport, actor: str | None = None
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
        },
    )
    row = result.one()
    created = bool(row.created)
    changed = created or row.old_digest != digest
    came_back = row.old_liveness is not None and row.old_liveness != "alive"

    if changed:
        await _replace_hardware(conn, report)
    if changed or came_back:
        await refresh_pools(conn, [report.id])
    if created:
        await record_event(conn, "registered", node_id=report.id, actor=actor)
    elif changed:
        await record_event(conn, "report_changed", node_id=report.id, actor=actor)
    if came_back:
        await record_event(
            conn,
            "back",
            node_id=report.id,
            actor=actor,
            reason=f"registered while {row.old_liveness}",
        )
    return Registration(node_id=report.id, created=created, changed=changed)


async def _replace_hardware(conn: AsyncConnection, report: NodeReport) -> None:
    node_id = report.id
    gpus = [
        {
            "idx": g.index,
            "uuid": g.uuid,
            "name": g.name,
            "gpu_class": gpu_class_of(g),
            "memory_mb": g.memory_mb,
            "healthy": g.healthy,
            # A GPU reported unhealthy without a reason still says so.
            "health_reasons": sorted(set(g.health_reasons)) or ([] if g.healthy else ["unhealthy"]),
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
    for statement, rows in (
        (_REPLACE_GPUS, gpus),
        (_REPLACE_FABRICS, fabrics),
        (_REPLACE_FILESYSTEMS, filesystems),
        (_REPLACE_WEIGHTS, weights),
    ):
        await conn.execute(statement, {"node_id": node_id, "rows": _rows_json(rows)})


_HEARTBEAT = text(
    """
    WITH old AS (SELECT id, liveness FROM nodes WHERE id = :id FOR NO KEY UPDATE)
    UPDATE nodes n SET last_seen = now(), liveness = 'alive', liveness_reason = NULL
    FROM old WHERE n.id = old.id
    RETURNING old.liveness AS old_liveness
    """
)


async def heartbeat(conn: AsyncConnection, node_id: str) -> None:
    """Record that the node is alive, by the database's clock; bring it back if it was not.

    The database's clock, because several service processes stamp the same
    column and the liveness sweep compares against now() on the same server.
    """
    row = (await conn.execute(_HEARTBEAT, {"id": node_id})).one_or_none()
    if row is None:
        raise NodeNotFound(node_id)
    if row.old_liveness != "alive":
        await refresh_pools(conn, [node_id])
        await record_event(
            conn, "back", node_id=node_id, reason=f"heartbeat while {row.old_liveness}"
        )


def _check_reason(reason: str) -> str:
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
    conn: AsyncConnection,
    node_id: str,
    admin_state: str | None,
    reason: str | None,
    actor: str | None,
) -> None:
    params = {"id": node_id, "admin_state": admin_state, "reason": reason, "actor": actor}
    if (await conn.execute(_SET_ADMIN, params)).one_or_none() is None:
        raise NodeNotFound(node_id)
    await refresh_pools(conn, [node_id])


async def cordon_node(conn: AsyncConnection, node_id: str, reason: str, actor: str | None) -> None:
    """Exclude the node from new placement; what runs there keeps running."""
    reason = _check_reason(reason)
    await _set_admin_state(conn, node_id, "cordoned", reason, actor)
    await record_event(conn, "cordoned", node_id=node_id, actor=actor, reason=reason)


async def drain_node(conn: AsyncConnection, node_id: str, reason: str, actor: str | None) -> None:
    """Mark the node's replicas for moving off; like a cordon, it takes no new ones."""
    reason = _check_reason(reason)
    await _set_admin_state(conn, node_id, "draining", reason, actor)
    await record_event(conn, "drained", node_id=node_id, actor=actor, reason=reason)


async def uncordon_node(conn: AsyncConnection, node_id: str, actor: str | None) -> None:
    await _set_admin_state(conn, node_id, None, None, actor)
    await record_event(conn, "uncordoned", node_id=node_id, actor=actor)


_REMOVE = text("DELETE FROM nodes WHERE id = :id RETURNING id")


async def remove_node(conn: AsyncConnection, node_id: str, actor: str | None) -> bool:
    """Forget the node; its GPUs, reports and allocations go with it (foreign keys cascade)."""
    removed = (await conn.execute(_REMOVE, {"id": node_id})).one_or_none() is not None
    if removed:
        await record_event(conn, "removed", node_id=node_id, actor=actor)
    return removed
