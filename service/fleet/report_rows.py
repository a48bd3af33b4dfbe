"""How a report becomes rows: the node row and its child rows, as SQL fragments and parameters.

Two statements write a report, and both are built from these fragments, so a
column added to a report is written the same way by each: the transactional
registration (service/fleet/node_writes.register_node: the node upsert, then the child
tables, pools and events) and the one-statement re-registration
(service/fleet/re_registration.py: a known, alive node whose GPUs did not change).

Unchanged rows are never rewritten (the IS DISTINCT FROM guards): dead
tuples are what slows the scheduler's scans after a burst of
re-registrations.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from service.fleet.node_reads import NODE_COLUMNS
from service.fleet.reports import NodeReport, gpu_class_of, sum_disks
from service.fleet.topology import nvlink_groups
from service.scheduling.availability import taint_marks
from service.scheduling.weights_lifecycle import pinned_by

# The gpus columns a report writes (the service's own, cordon and sticky
# reasons, are not among them: a report never overwrites them). A GPU whose
# stored columns equal its reported ones did not change.
GPU_REPORT_COLUMNS = (
    "uuid", "pci_bus_id", "name", "gpu_class", "memory_mb", "healthy", "health_reasons",
    "numa_node", "nvlink_peers", "nvlink_group", "nvlink_domain", "near_hcas", "recovery_action",
)  # fmt: skip

# The weights columns that say what the weights are; observed_at says when
# they were seen so, and is written only with a change of these.
WEIGHTS_CONTENT = ("size_bytes", "revision", "state", "total_bytes", "digest")


def _row(alias: str, columns: Sequence[str]) -> str:
    return "(" + ", ".join(f"{alias}.{c}" for c in columns) + ")"


def gpus_differ(stored: str, reported: str) -> str:
    """SQL: the GPU row `stored` (of gpus) differs from `reported` (a report's row) in a report's column."""
    return (
        f"{_row(stored, GPU_REPORT_COLUMNS)} IS DISTINCT FROM {_row(reported, GPU_REPORT_COLUMNS)}"
    )


def came_back(old: str) -> str:
    """SQL: the node row `old`, as it was before this report, was not alive (unreachable or lost)."""
    return f"({old}.liveness <> 'alive')"


def rebooted(old: str, boot_id: str) -> str:
    """SQL: the report's boot id `boot_id` is a new one: the node rebooted, its GPUs were reset.

    An agent that does not say (null) did not reboot as far as anyone knows;
    neither did a node whose last boot id is unknown.
    """
    return f"({old}.boot_id IS NOT NULL AND {boot_id} IS NOT NULL AND {old}.boot_id <> {boot_id})"


def new_life(old: str, boot_id: str) -> str:
    """SQL: the node row `old` starts a new incarnation with this contact.

    Back from LOST (its replicas were freed or held meanwhile), or a new boot
    id (its engines died with the reboot). UNREACHABLE is not a new life:
    nothing was freed while it lasted.
    """
    return f"({old}.liveness = 'lost' OR {rebooted(old, boot_id)})"


def upsert_node(source: str) -> str:
    """SQL: the node row's upsert from the report's parameters, one row per row of `source`.

    The operator's cordon or drain and its reason are not in the SET list, so
    they survive: an agent reconnecting must not silently undo an operator's
    decision.
    """
    return f"""
        INSERT INTO nodes AS n (
            id, hostname, mgmt_addr, labels, memory_total_mb, agent_version, engine_versions,
            local_disk_free, local_disk_total, shared_disk_free, shared_disk_total,
            knows_its_weights, report_digest, boot_id, gpus_observed_at, fabrics_observed_at,
            storage_observed_at, observed_at_correction, hca_discovery
        )
        SELECT CAST(:id AS text), CAST(:hostname AS text), CAST(:mgmt_addr AS text),
               CAST(:labels AS jsonb), CAST(:memory_total_mb AS integer),
               CAST(:agent_version AS text), CAST(:engine_versions AS jsonb),
               CAST(:local_free AS bigint), CAST(:local_total AS bigint),
               CAST(:shared_free AS bigint), CAST(:shared_total AS bigint),
               CAST(:knows_its_weights AS boolean), CAST(:digest AS text),
               CAST(:boot_id AS text), CAST(:gpus_observed_at AS timestamptz),
               CAST(:fabrics_observed_at AS timestamptz),
               CAST(:storage_observed_at AS timestamptz),
               CAST(:observed_at_correction AS text), CAST(:hca_discovery AS text)
        FROM {source}
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
            incarnation = n.incarnation
                + CASE WHEN {new_life("n", "excluded.boot_id")} THEN 1 ELSE 0 END,
            gpus_observed_at = excluded.gpus_observed_at,
            fabrics_observed_at = excluded.fabrics_observed_at,
            storage_observed_at = excluded.storage_observed_at,
            observed_at_correction = excluded.observed_at_correction,
            hca_discovery = excluded.hca_discovery,
            reported_at = CASE WHEN n.report_digest IS DISTINCT FROM excluded.report_digest
                               THEN now() ELSE n.reported_at END,
            liveness = 'alive',
            liveness_reason = NULL,
            last_seen = now()
        RETURNING {NODE_COLUMNS}"""


# The report's child rows, from the JSON parameters hardware_rows makes.
REPORTED_ROWS = """
    g_in AS (
        SELECT * FROM jsonb_to_recordset(CAST(:gpus AS jsonb)) AS r(
            idx int, uuid text, pci_bus_id text, name text, gpu_class text, memory_mb int,
            healthy boolean, health_reasons text[], numa_node int, nvlink_peers int[],
            nvlink_group int, nvlink_domain text, near_hcas text[], recovery_action text)
    ), f_in AS (
        SELECT * FROM jsonb_to_recordset(CAST(:fabrics AS jsonb))
            AS r(fabric text, hcas text[], rate_gbps int)
    ), s_in AS (
        SELECT * FROM jsonb_to_recordset(CAST(:filesystems AS jsonb)) AS r(
            fs_id text, mount_point text, fs_type text, shared boolean, free_bytes bigint,
            total_bytes bigint, directories text[])
    ), w_in AS (
        SELECT * FROM jsonb_to_recordset(CAST(:weights AS jsonb)) AS r(
            path text, size_bytes bigint, revision text, state text, total_bytes bigint,
            digest text, observed_at timestamptz)
    )"""


def write_gpus(when: str) -> str:
    """CTEs replacing the node's GPUs with g_in's when `when` (SQL, a boolean) holds."""
    updates = ", ".join(f"{c} = excluded.{c}" for c in GPU_REPORT_COLUMNS)
    columns = ", ".join(GPU_REPORT_COLUMNS)
    return f"""
    g_gone AS (
        DELETE FROM gpus g WHERE {when} AND g.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM g_in i WHERE i.idx = g.idx)
    ), g_up AS (
        -- A new GPU row takes its marks from the taints on it and its node
        -- (a GPU that left a report and came back keeps its taints); a
        -- stored row keeps its own, which every taint write keeps.
        INSERT INTO gpus AS g (node_id, idx, {columns}, withheld, last_resort)
        SELECT :node_id, idx, {columns}, {taint_marks("CAST(:node_id AS text)", "g_in.idx")}
        FROM g_in WHERE {when} ORDER BY idx
        ON CONFLICT (node_id, idx) DO UPDATE SET {updates}
        WHERE {gpus_differ("g", "excluded")}
    )"""


def write_own_rows(when: str) -> str:
    """CTEs replacing the rows only reports write (fabrics, filesystems, weights) when `when` holds."""
    return f"""
    f_gone AS (
        DELETE FROM fabric_attachments f WHERE {when} AND f.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM f_in i WHERE i.fabric = f.fabric)
    ), f_up AS (
        INSERT INTO fabric_attachments AS f (node_id, fabric, hcas, rate_gbps)
        SELECT :node_id, fabric, hcas, rate_gbps FROM f_in
        WHERE {when} ORDER BY fabric
        ON CONFLICT (node_id, fabric) DO UPDATE
        SET hcas = excluded.hcas, rate_gbps = excluded.rate_gbps
        WHERE (f.hcas, f.rate_gbps) IS DISTINCT FROM (excluded.hcas, excluded.rate_gbps)
    ), s_gone AS (
        DELETE FROM filesystems f WHERE {when} AND f.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM s_in i WHERE i.fs_id = f.fs_id)
    ), s_up AS (
        INSERT INTO filesystems AS f (
            node_id, fs_id, mount_point, fs_type, shared, free_bytes, total_bytes, directories)
        SELECT :node_id, fs_id, mount_point, fs_type, shared, free_bytes, total_bytes,
               directories
        FROM s_in WHERE {when} ORDER BY fs_id
        ON CONFLICT (node_id, fs_id) DO UPDATE SET
            mount_point = excluded.mount_point, fs_type = excluded.fs_type,
            shared = excluded.shared, free_bytes = excluded.free_bytes,
            total_bytes = excluded.total_bytes, directories = excluded.directories
        WHERE (f.mount_point, f.fs_type, f.shared, f.free_bytes, f.total_bytes, f.directories)
              IS DISTINCT FROM
              (excluded.mount_point, excluded.fs_type, excluded.shared, excluded.free_bytes,
               excluded.total_bytes, excluded.directories)
    ), w_gone AS (
        DELETE FROM weights w WHERE {when} AND w.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM w_in i WHERE i.path = w.path)
    ), w_up AS (
        -- observed_at is written with what changed, never alone: weights
        -- seen again as they were are not rewritten (reports.py, _NOT_CONTENT).
        INSERT INTO weights AS w (
            node_id, path, size_bytes, revision, state, total_bytes, digest, observed_at)
        SELECT :node_id, path, size_bytes, revision, state, total_bytes, digest,
               coalesce(observed_at, now())
        FROM w_in
        WHERE {when} ORDER BY path
        ON CONFLICT (node_id, path) DO UPDATE SET
            size_bytes = excluded.size_bytes, revision = excluded.revision,
            state = excluded.state, total_bytes = excluded.total_bytes,
            digest = excluded.digest, observed_at = excluded.observed_at
        WHERE {_row("w", WEIGHTS_CONTENT)} IS DISTINCT FROM {_row("excluded", WEIGHTS_CONTENT)}
    ), w_lost AS (
        -- Pinned weights the report says are being evicted or are gone: each
        -- pinning replica is told; its allocation stays (as with a GPU that
        -- fails under it). `w` is the stored row, as before this statement.
        INSERT INTO events (kind, node_id, replica_id, actor, reason, detail)
        SELECT 'weights_lost_under_replica', :node_id, p.replica_id, :actor,
               w.path || CASE WHEN i.path IS NULL THEN ' is gone' ELSE ' is EVICTING' END,
               jsonb_build_object('path', w.path)
        FROM weights w
        LEFT JOIN w_in i ON i.path = w.path
        CROSS JOIN LATERAL unnest({pinned_by("w")}) AS p(replica_id)
        WHERE {when} AND w.node_id = :node_id
          AND (i.path IS NULL OR (i.state = 'evicting' AND w.state IS DISTINCT FROM 'evicting'))
        ORDER BY w.path, p.replica_id
        RETURNING id
    )"""


def rows_json(rows: Sequence[Mapping[str, object]]) -> str:
    return json.dumps(rows, separators=(",", ":"))


def node_parameters(report: NodeReport, digest: str) -> dict[str, Any]:
    """upsert_node's parameters."""
    disks = sum_disks(report.storage)
    return {
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
        "hca_discovery": report.hca_discovery,
        **fact_time_parameters(report),
    }


def fact_time_parameters(report: NodeReport) -> dict[str, Any]:
    """The node row's observedAt columns (tables.nodes), for upsert_node and a re-sent report."""
    times = report.fact_times()
    return {
        "gpus_observed_at": times.gpus,
        "fabrics_observed_at": times.fabrics,
        "storage_observed_at": times.storage,
        "observed_at_correction": times.correction,
    }


def hardware_rows(report: NodeReport) -> dict[str, str]:
    """The report's child rows as REPORTED_ROWS's JSON parameters."""
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
            "recovery_action": g.recovery_action,
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
    weights = [
        {
            "path": w.path,
            "size_bytes": w.size_bytes,
            "revision": w.revision,
            "state": w.state,
            "total_bytes": w.total_bytes,
            "digest": w.digest,
            "observed_at": None if w.observed_at is None else w.observed_at.isoformat(),
        }
        for w in report.weights
    ]
    return {
        "gpus": rows_json(gpus),
        "fabrics": rows_json(fabrics),
        "filesystems": rows_json(filesystems),
        "weights": rows_json(weights),
    }
