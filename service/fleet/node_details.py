"""A page of nodes' details, one statement per kind however many nodes are asked for.

These are the batch functions behind the per-request DataLoaders: N nodes on a
page cost the same handful of statements as one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, text

from service.database.connections import Connection, cached_text
from service.fleet.health.policy import DriverRecoveryAction, RemediationAction, recommended
from service.fleet.health.taint_rows import gpu_taints_json, taints_from_json
from service.scheduling.allocations import ShardRecord
from service.scheduling.availability import gpu_health_reasons, gpu_healthy
from service.scheduling.generations import replica_generation
from service.scheduling.taints import Taint
from service.scheduling.weights_lifecycle import STATES, WeightsState, pinned_by, unpinned


# GPUs and filesystems are read by the thousand for a page (8,000 GPUs in a
# 1,000-node page): slotted, built positionally, and not frozen, because a
# frozen dataclass sets each field through object.__setattr__, paid per
# field of every record.
# Nothing writes to them after the read: they live for one request.
@dataclass(slots=True)
class GpuRecord:
    node_id: str
    index: int
    uuid: str | None
    pci_bus_id: str | None
    name: str
    gpu_class: str
    memory_mb: int | None
    # availability.gpu_healthy and gpu_health_reasons: the agent's word and
    # the sticky reasons together.
    healthy: bool
    health_reasons: tuple[str, ...]
    held_by: str | None
    # The shard holding it, read with it: every GPU answers its own
    # `allocation` without a second lookup per GPU.
    shard: ShardRecord | None = None
    cordon_reason: str | None = None
    sticky_reasons: tuple[str, ...] = ()
    # Topology as reported (service.fleet.topology); None is unknown.
    numa_node: int | None = None
    nvlink_peers: list[int] | None = None
    nvlink_group: int | None = None
    nvlink_domain: str | None = None
    near_hcas: list[str] | None = None
    # availability.gpu_withheld and gpu_last_resort: a taint on the GPU or its node.
    withheld: bool = False
    last_resort: bool = False
    # The GPU's own taints, its cordon shown as one (fleet/health/taint_rows.py).
    taints: tuple[Taint, ...] = ()
    # The driver's recovery action as last reported, and what the policy
    # recommends for the GPU's sticky faults (fleet/health/policy.recommended).
    recovery_action: DriverRecoveryAction | None = None
    recommended_action: RemediationAction = RemediationAction.NONE
    # The live reservation that sets it aside (gpus.reservation), None: none.
    reservation: str | None = None


@dataclass(frozen=True)
class FabricRecord:
    node_id: str
    fabric: str
    hcas: tuple[str, ...]
    rate_gbps: int


@dataclass(slots=True)
class FilesystemRecord:
    node_id: str
    id: str
    mount_point: str
    fs_type: str | None
    shared: bool
    free_bytes: int
    total_bytes: int
    directories: tuple[str, ...]


@dataclass(frozen=True)
class WeightsRecord:
    node_id: str
    path: str
    size_bytes: int | None
    revision: str | None = None
    state: WeightsState | None = None
    total_bytes: int | None = None
    digest: str | None = None
    observed_at: datetime | None = None
    # Replica ids, sorted (weights_lifecycle.pinned_by).
    pinned_by: tuple[str, ...] = ()


_GPUS = text(
    f"""
    SELECT g.node_id, g.idx, g.uuid, g.pci_bus_id, g.name, g.gpu_class, g.memory_mb,
           {gpu_healthy("g")}, {gpu_health_reasons("g")}, a.shard_id, s.replica_id,
           s.gpu_indices, s.fabric, s.hcas, s.created_at, g.cordon_reason, g.sticky_reasons,
           g.numa_node, g.nvlink_peers, g.nvlink_group, g.nvlink_domain, g.near_hcas,
           s.fence, {replica_generation("s")} AS generation, s.held_since,
           g.withheld, g.last_resort, {gpu_taints_json("g")} AS taints, g.recovery_action,
           s.tenant, s.priority, s.deployment, s.borrowed, g.reservation
    FROM gpus g
    LEFT JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx
    LEFT JOIN shards s ON s.shard_id = a.shard_id
    WHERE g.node_id = ANY(CAST(:ids AS text[]))
    ORDER BY g.node_id, g.idx
    """
)


def recommended_action(sticky: Sequence[str], recovery: str | None) -> RemediationAction:
    """Gpu.recommendedAction of a GPU row (its sticky reasons, its driver's recovery action):
    the policy's word (policy.recommended); NONE for a GPU with neither, without asking it.
    Also the compiled page's (service/graphql/fast/json_pages.py), for the GPUs has_faults_sql picks."""
    return recommended(sticky, recovery) if sticky or recovery else RemediationAction.NONE


def has_faults_sql(g: str) -> str:
    """SQL: the GPU row `g` has what recommended_action asks the policy about."""
    return f"(cardinality({g}.sticky_reasons) > 0 OR {g}.recovery_action IS NOT NULL)"


async def gpus_of(conn: Connection, node_ids: Sequence[str]) -> dict[str, list[GpuRecord]]:
    out: dict[str, list[GpuRecord]] = defaultdict(list)
    shards: dict[str, ShardRecord] = {}
    # By position, in _GPUS's column order: named access on SQLAlchemy rows
    # cost more than building the record, eight thousand times a page.
    for (
        node_id, idx, uuid, pci_bus_id, name, gpu_class, memory_mb, healthy, reasons, held_by,
        replica_id, indices, fabric, hcas, created_at, cordon_reason, sticky, numa_node, peers,
        group, domain, near, fence, generation, held_since, withheld, last_resort, taints,
        recovery, tenant, priority, deployment, borrowed, reservation,
    ) in await conn.execute(_GPUS, {"ids": list(node_ids)}):  # fmt: skip
        shard = None
        if held_by is not None:
            shard = shards.get(held_by)
            if shard is None:
                shard = shards[held_by] = ShardRecord(
                    shard_id=held_by,
                    replica_id=replica_id,
                    node_id=node_id,
                    gpu_indices=tuple(sorted(indices)),
                    fabric=fabric,
                    hcas=tuple(hcas),
                    created_at=created_at,
                    fence=fence,
                    generation=generation,
                    held_since=held_since,
                    tenant=tenant,
                    priority=priority,
                    deployment=deployment,
                    borrowed=borrowed,
                )
        # Positionally, in GpuRecord's field order.
        gpu = GpuRecord(
            node_id, idx, uuid, pci_bus_id, name, gpu_class, memory_mb, healthy,
            tuple(reasons), held_by, shard, cordon_reason, tuple(sticky), numa_node, peers, group,
            domain, near, withheld, last_resort, taints_from_json(taints, idx),
            None if recovery is None else DriverRecoveryAction(recovery),
            recommended_action(sticky, recovery), reservation,
        )  # fmt: skip
        out[node_id].append(gpu)
    return out


async def fabrics_of(conn: Connection, node_ids: Sequence[str]) -> dict[str, list[FabricRecord]]:
    out: dict[str, list[FabricRecord]] = defaultdict(list)
    rows = await conn.execute(
        cached_text(
            "SELECT node_id, fabric, hcas, rate_gbps FROM fabric_attachments"
            " WHERE node_id = ANY(CAST(:ids AS text[])) ORDER BY node_id, fabric"
        ),
        {"ids": list(node_ids)},
    )
    for r in rows:
        out[r.node_id].append(FabricRecord(r.node_id, r.fabric, tuple(r.hcas), r.rate_gbps))
    return out


async def filesystems_of(
    conn: Connection, node_ids: Sequence[str]
) -> dict[str, list[FilesystemRecord]]:
    out: dict[str, list[FilesystemRecord]] = defaultdict(list)
    rows = await conn.execute(
        cached_text(
            "SELECT node_id, fs_id, mount_point, fs_type, shared, free_bytes, total_bytes,"
            " directories FROM filesystems WHERE node_id = ANY(CAST(:ids AS text[]))"
            " ORDER BY node_id, mount_point, fs_id"
        ),
        {"ids": list(node_ids)},
    )
    # By position, in the statement's column order (named access on a row is
    # a Python-level lookup, two thousand times a page).
    for node_id, fs_id, mount_point, fs_type, shared, free, total, directories in rows:
        out[node_id].append(
            FilesystemRecord(
                node_id, fs_id, mount_point, fs_type, shared, free, total, tuple(directories)
            )
        )
    return out


async def weights_of(conn: Connection, node_ids: Sequence[str]) -> dict[str, list[WeightsRecord]]:
    out: dict[str, list[WeightsRecord]] = defaultdict(list)
    rows = await conn.execute(
        cached_text(
            "SELECT w.node_id, w.path, w.size_bytes, w.revision, w.state, w.total_bytes,"
            f" w.digest, w.observed_at, {pinned_by('w')} AS pinned_by FROM weights w"
            " WHERE w.node_id = ANY(CAST(:ids AS text[])) ORDER BY w.node_id, w.path"
        ),
        {"ids": list(node_ids)},
    )
    for r in rows:
        out[r.node_id].append(weights_from_row(r))
    return out


def weights_from_row(r: Row[Any]) -> WeightsRecord:
    return WeightsRecord(
        r.node_id,
        r.path,
        r.size_bytes,
        r.revision,
        None if r.state is None else STATES[r.state],
        r.total_bytes,
        r.digest,
        r.observed_at,
        tuple(r.pinned_by),
    )


# The node's weights that nothing pins: what an eviction tool may delete.
_EVICTABLE = text(
    "SELECT w.node_id, w.path, w.size_bytes, w.revision, w.state, w.total_bytes, w.digest,"
    " w.observed_at, CAST('{}' AS text[]) AS pinned_by FROM weights w"
    f" WHERE w.node_id = :node_id AND {unpinned('w')} ORDER BY w.path"
)


async def weights_evictable(conn: Connection, node_id: str) -> list[WeightsRecord]:
    """The node's weights no replica pins, by path (empty for an unknown node)."""
    return [weights_from_row(r) for r in await conn.execute(_EVICTABLE, {"node_id": node_id})]
