"""A synthetic cluster: reports as agents send them, and a bulk load of the same into the tables.

Node i is fully determined by i (and a `version` that moves its disk free
space), so a re-registration can send exactly what was loaded (the digest skip
applies) or a changed report (it does not).

Bulk-loading with COPY rather than registering through the API keeps a
100k-node setup to seconds; the stored digest is the one registerNode would
compute, which the churn figure checks (no report_changed events for an
unchanged burst).
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from service.fleet.reports import (
    FabricReport,
    FilesystemReport,
    GpuReport,
    NodeReport,
    WeightsReport,
    gpu_class_of,
    sum_disks,
)
from service.fleet.topology import nvlink_groups
from service.scheduling.availability import node_schedulable, pool_counts
from service.scheduling.gpu_pools import (
    POOL_INSERT_COLUMNS,
    POOL_UPSERT,
    attached_fabrics,
    counted,
    node_attachments,
)

TB = 10**12
GB = 10**9

# (driver name, MiB, share out of 5): 2/5 H100, 2/5 A100, 1/5 L40S.
MODELS = (
    ("NVIDIA H100 80GB HBM3", 81559),
    ("NVIDIA H100 80GB HBM3", 81559),
    ("NVIDIA A100-SXM4-40GB", 40960),
    ("NVIDIA A100-SXM4-40GB", 40960),
    ("NVIDIA L40S", 46068),
)
GPUS_PER_NODE = 8


def nvlink_peers(i: int, g: int) -> list[int]:
    """Node i's topology: H100 nodes alternate an NVSwitch board and bridged pairs
    (H100 NVL style), A100 nodes are boards, L40S nodes have no NVLink."""
    name = MODELS[i % len(MODELS)][0]
    if "L40S" in name:
        return []
    if i % len(MODELS) == 1:
        return [g ^ 1]
    return [k for k in range(GPUS_PER_NODE) if k != g]


def node_id(i: int) -> str:
    return f"node-{i:06d}"


def node_input(i: int, version: int = 0) -> dict[str, Any]:
    """The GraphQL NodeInput an agent on node i sends; `version` moves its local disk's free space."""
    name, memory = MODELS[i % len(MODELS)]
    unhealthy = i % 50 == 7
    gpus = [
        {
            "index": g,
            "uuid": f"GPU-{i:06d}-{g}",
            "name": name,
            "memoryMb": memory,
            "healthy": not (unhealthy and g == 7),
            "healthReasons": ["ecc_uncorrected"] if unhealthy and g == 7 else [],
            "nvlinkPeers": nvlink_peers(i, g),
        }
        for g in range(GPUS_PER_NODE)
    ]
    fabric = "ib-a" if i % 2 == 0 else "ib-b"
    free = ((i * 7919 + version * 104729) % 97 + 1) * 40 * GB
    report: dict[str, Any] = {
        "id": node_id(i),
        "hostname": f"{node_id(i)}.cluster.local",
        "mgmtAddr": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
        "labels": [{"key": "rack", "value": f"r{i // 32}"}, {"key": "zone", "value": f"z{i % 4}"}],
        "memoryTotalMb": 2_063_000,
        "gpus": gpus,
        "fabrics": [{"fabric": fabric, "hcas": [f"mlx5_{k}" for k in range(4)], "rateGbps": 400}],
        "storage": [
            {
                "id": "dev:259:1",
                "mountPoint": "/data",
                "fsType": "xfs",
                "shared": False,
                "freeBytes": free,
                "totalBytes": 4 * TB,
                "directories": ["/data/models"],
            },
            {
                "id": "nfs:filer1:/models",
                "mountPoint": "/mnt/filer",
                "fsType": "nfs4",
                "shared": True,
                "freeBytes": 50 * TB,
                "totalBytes": 100 * TB,
                "directories": ["/mnt/filer/models"],
            },
        ],
        "weights": [{"path": "/data/models/llama-70b", "sizeBytes": 140 * GB}]
        if i % 4 == 0
        else [],
        "agentVersion": "0.1.0",
        "engineVersions": [{"key": "vllm", "value": "0.11.0"}],
    }
    return report


def to_report(data: dict[str, Any]) -> NodeReport:
    """What service.graphql.inputs.NodeInput.to_report makes of the same input."""
    return NodeReport(
        id=data["id"],
        hostname=data["hostname"],
        mgmt_addr=data["mgmtAddr"],
        labels=tuple((kv["key"], kv["value"]) for kv in data.get("labels") or ()),
        memory_total_mb=data.get("memoryTotalMb"),
        gpus=tuple(
            GpuReport(
                index=g["index"],
                uuid=g.get("uuid"),
                name=g["name"],
                gpu_class=g.get("gpuClass"),
                memory_mb=g.get("memoryMb"),
                healthy=g["healthy"],
                health_reasons=tuple(g.get("healthReasons") or ()),
                nvlink_peers=None if g.get("nvlinkPeers") is None else tuple(g["nvlinkPeers"]),
            )
            for g in data["gpus"]
        ),
        fabrics=tuple(
            FabricReport(fabric=f["fabric"], hcas=tuple(f["hcas"]), rate_gbps=f["rateGbps"])
            for f in data.get("fabrics") or ()
        ),
        storage=tuple(
            FilesystemReport(
                id=fs["id"],
                mount_point=fs["mountPoint"],
                fs_type=fs.get("fsType"),
                shared=fs["shared"],
                free_bytes=fs["freeBytes"],
                total_bytes=fs["totalBytes"],
                directories=tuple(fs.get("directories") or ()),
            )
            for fs in data.get("storage") or ()
        ),
        weights=tuple(
            WeightsReport(path=w["path"], size_bytes=w.get("sizeBytes"))
            for w in data.get("weights") or ()
        ),
        agent_version=data.get("agentVersion"),
        engine_versions=tuple((kv["key"], kv["value"]) for kv in data.get("engineVersions") or ()),
    )


def allocated_indices(i: int) -> list[list[int]]:
    """Shards already on node i: a third hold half the node, a tenth all of it."""
    if i % 10 == 3:
        return [[0, 1, 2, 3], [4, 5, 6, 7]]
    if i % 3 == 1:
        return [[0, 1, 2, 3]]
    return []


def cordoned(i: int) -> bool:
    return i % 20 == 11


# Every node's pools recounted as refresh_pools recounts them (availability's
# partition, free GPU indices included), in one statement.
RECOUNT_POOLS = f"""
INSERT INTO gpu_pools AS p ({POOL_INSERT_COLUMNS})
SELECT c.node_id, c.gpu_class, {counted("c")}, {node_schedulable("n")},
       {attached_fabrics(node_attachments("c.node_id"))}
FROM (
    SELECT g.node_id, g.gpu_class, {pool_counts("g", "a.gpu_index IS NOT NULL")}
    FROM gpus g
    LEFT JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx
    GROUP BY g.node_id, g.gpu_class
) c JOIN nodes n ON n.id = c.node_id
{POOL_UPSERT}
"""


async def load(conn: asyncpg.Connection, count: int) -> None:
    """COPY `count` nodes, their hardware and some allocations; then pools, then ANALYZE."""
    nodes, gpus, fabrics, filesystems, weights, shards, held = [], [], [], [], [], [], []
    classes: dict[tuple[str, int | None, str | None], str] = {}
    for i in range(count):
        data = node_input(i)
        report = to_report(data)
        disks = sum_disks(report.storage)
        nid = report.id
        admin = ("cordoned", "benchmark: cordoned", "bench") if cordoned(i) else (None, None, None)
        nodes.append(
            (
                nid, report.hostname, report.mgmt_addr, json.dumps(dict(report.labels)),
                report.memory_total_mb, report.agent_version,
                json.dumps(dict(report.engine_versions)), *admin,
                disks.local.free_bytes if disks.local else None,
                disks.local.total_bytes if disks.local else None,
                disks.shared.free_bytes if disks.shared else None,
                disks.shared.total_bytes if disks.shared else None,
                bool(report.weights), report.digest(),
            )
        )  # fmt: skip
        groups = nvlink_groups({g.index: g.nvlink_peers for g in report.gpus})
        class_of: dict[int, str] = {}
        for g in report.gpus:
            reasons = sorted(set(g.health_reasons)) or ([] if g.healthy else ["unhealthy"])
            key = (g.name, g.memory_mb, g.gpu_class)
            if key not in classes:
                classes[key] = gpu_class_of(g)
            class_of[g.index] = classes[key]
            gpus.append(
                (nid, g.index, g.uuid, g.name, classes[key], g.memory_mb, g.healthy, reasons,
                 None if g.nvlink_peers is None else sorted(g.nvlink_peers), groups[g.index])
            )  # fmt: skip
        for f in report.fabrics:
            fabrics.append((nid, f.fabric, list(f.hcas), f.rate_gbps))
        for fs in report.storage:
            filesystems.append(
                (nid, fs.id, fs.mount_point, fs.fs_type, fs.shared, fs.free_bytes,
                 fs.total_bytes, sorted(set(fs.directories)))
            )  # fmt: skip
        for w in report.weights:
            weights.append((nid, w.path, w.size_bytes))
        for k, indices in enumerate(allocated_indices(i)):
            shard = f"seed-{i:06d}-{k}"
            shards.append((shard, f"seed-replica-{i:06d}-{k}", nid, indices))
            held.extend((nid, idx, shard, class_of[idx]) for idx in indices)

    await conn.copy_records_to_table(
        "nodes",
        records=nodes,
        columns=[
            "id", "hostname", "mgmt_addr", "labels", "memory_total_mb", "agent_version",
            "engine_versions", "admin_state", "admin_reason", "admin_actor", "local_disk_free",
            "local_disk_total", "shared_disk_free", "shared_disk_total", "knows_its_weights",
            "report_digest",
        ],
    )  # fmt: skip
    await conn.copy_records_to_table(
        "gpus",
        records=gpus,
        columns=["node_id", "idx", "uuid", "name", "gpu_class", "memory_mb", "healthy",
                 "health_reasons", "nvlink_peers", "nvlink_group"],
    )  # fmt: skip
    await conn.copy_records_to_table(
        "fabric_attachments", records=fabrics, columns=["node_id", "fabric", "hcas", "rate_gbps"]
    )
    await conn.copy_records_to_table(
        "filesystems",
        records=filesystems,
        columns=["node_id", "fs_id", "mount_point", "fs_type", "shared", "free_bytes",
                 "total_bytes", "directories"],
    )  # fmt: skip
    await conn.copy_records_to_table(
        "weights", records=weights, columns=["node_id", "path", "size_bytes"]
    )
    await conn.copy_records_to_table(
        "shards", records=shards, columns=["shard_id", "replica_id", "node_id", "gpu_indices"]
    )
    await conn.copy_records_to_table(
        "allocated_gpus", records=held, columns=["node_id", "gpu_index", "shard_id", "gpu_class"]
    )
    # The same counts service.scheduling.gpu_pools.refresh_pools keeps, for every node at once.
    await conn.execute(RECOUNT_POOLS)
    await conn.execute("VACUUM ANALYZE")
