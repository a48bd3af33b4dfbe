"""Agents writing: registerNode with 16 agents and heartbeat with 64, against raw asyncpg."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from benchmarks.bench import Bench, close_all
from benchmarks.client import Connection, cycling, request_body
from benchmarks.cluster import node_id, node_input, to_report
from benchmarks.measure import Figure, throughput
from benchmarks.results import Row, fmt
from service.access_control import tokens
from service.config import Settings
from service.database.db import create_engine, dispose
from service.fleet.reports import gpu_class_of, sum_disks

REGISTER = """
mutation Register($input: NodeInput!) { registerNode(input: $input) { id state } }
"""
HEARTBEAT = "mutation Beat($id: ID!) { heartbeat(nodeId: $id) { id state } }"

# Agents re-register a working set this big; enough that two agents never
# write one node at once and small enough to keep the prepared bodies cheap.
WORKING_SET = 4096

# The same writes as registerNode, in the fewest round trips: one statement
# upserts the node and replaces each child table, rewriting only rows that
# changed. No gpu_pools, no events: a plain schema has neither.
RAW_REGISTER = """
WITH n AS (
    INSERT INTO nodes AS n (id, hostname, mgmt_addr, labels, memory_total_mb, agent_version,
        engine_versions, local_disk_free, local_disk_total, shared_disk_free, shared_disk_total,
        knows_its_weights, report_digest)
    VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7::jsonb, $8, $9, $10, $11, $12, $13)
    ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, mgmt_addr = excluded.mgmt_addr,
        labels = excluded.labels, memory_total_mb = excluded.memory_total_mb,
        agent_version = excluded.agent_version, engine_versions = excluded.engine_versions,
        local_disk_free = excluded.local_disk_free, local_disk_total = excluded.local_disk_total,
        shared_disk_free = excluded.shared_disk_free,
        shared_disk_total = excluded.shared_disk_total,
        knows_its_weights = excluded.knows_its_weights, report_digest = excluded.report_digest,
        last_seen = now()
    RETURNING n.id
), g_in AS (
    SELECT * FROM jsonb_to_recordset($14::jsonb) AS r(idx int, uuid text, name text,
        gpu_class text, memory_mb int, healthy boolean, health_reasons text[])
), g_gone AS (
    DELETE FROM gpus g WHERE g.node_id = $1 AND g.idx NOT IN (SELECT idx FROM g_in)
), g_up AS (
    INSERT INTO gpus AS g (node_id, idx, uuid, name, gpu_class, memory_mb, healthy, health_reasons)
    SELECT n.id, i.idx, i.uuid, i.name, i.gpu_class, i.memory_mb, i.healthy, i.health_reasons
    FROM g_in i, n ORDER BY i.idx
    ON CONFLICT (node_id, idx) DO UPDATE SET uuid = excluded.uuid, name = excluded.name,
        gpu_class = excluded.gpu_class, memory_mb = excluded.memory_mb,
        healthy = excluded.healthy, health_reasons = excluded.health_reasons
    WHERE (g.uuid, g.name, g.gpu_class, g.memory_mb, g.healthy, g.health_reasons)
          IS DISTINCT FROM (excluded.uuid, excluded.name, excluded.gpu_class, excluded.memory_mb,
                            excluded.healthy, excluded.health_reasons)
), f_in AS (
    SELECT * FROM jsonb_to_recordset($15::jsonb) AS r(fabric text, hcas text[], rate_gbps int)
), f_gone AS (
    DELETE FROM fabric_attachments f WHERE f.node_id = $1
      AND f.fabric NOT IN (SELECT fabric FROM f_in)
), f_up AS (
    INSERT INTO fabric_attachments AS f (node_id, fabric, hcas, rate_gbps)
    SELECT n.id, i.fabric, i.hcas, i.rate_gbps FROM f_in i, n ORDER BY i.fabric
    ON CONFLICT (node_id, fabric) DO UPDATE SET hcas = excluded.hcas,
        rate_gbps = excluded.rate_gbps
    WHERE (f.hcas, f.rate_gbps) IS DISTINCT FROM (excluded.hcas, excluded.rate_gbps)
), s_in AS (
    SELECT * FROM jsonb_to_recordset($16::jsonb) AS r(fs_id text, mount_point text,
        fs_type text, shared boolean, free_bytes bigint, total_bytes bigint, directories text[])
), s_gone AS (
    DELETE FROM filesystems f WHERE f.node_id = $1 AND f.fs_id NOT IN (SELECT fs_id FROM s_in)
), s_up AS (
    INSERT INTO filesystems AS f (node_id, fs_id, mount_point, fs_type, shared, free_bytes,
        total_bytes, directories)
    SELECT n.id, i.fs_id, i.mount_point, i.fs_type, i.shared, i.free_bytes, i.total_bytes,
           i.directories
    FROM s_in i, n ORDER BY i.fs_id
    ON CONFLICT (node_id, fs_id) DO UPDATE SET mount_point = excluded.mount_point,
        fs_type = excluded.fs_type, shared = excluded.shared, free_bytes = excluded.free_bytes,
        total_bytes = excluded.total_bytes, directories = excluded.directories
    WHERE (f.mount_point, f.fs_type, f.shared, f.free_bytes, f.total_bytes, f.directories)
          IS DISTINCT FROM (excluded.mount_point, excluded.fs_type, excluded.shared,
                            excluded.free_bytes, excluded.total_bytes, excluded.directories)
), w_in AS (
    SELECT * FROM jsonb_to_recordset($17::jsonb) AS r(path text, size_bytes bigint)
), w_gone AS (
    DELETE FROM weights w WHERE w.node_id = $1 AND w.path NOT IN (SELECT path FROM w_in)
), w_up AS (
    INSERT INTO weights AS w (node_id, path, size_bytes)
    SELECT n.id, i.path, i.size_bytes FROM w_in i, n ORDER BY i.path
    ON CONFLICT (node_id, path) DO UPDATE SET size_bytes = excluded.size_bytes
    WHERE w.size_bytes IS DISTINCT FROM excluded.size_bytes
)
SELECT id FROM n
"""


def raw_register_args(data: dict[str, Any]) -> tuple[Any, ...]:
    report = to_report(data)
    disks = sum_disks(report.storage)
    gpus = [
        {"idx": g.index, "uuid": g.uuid, "name": g.name, "gpu_class": gpu_class_of(g),
         "memory_mb": g.memory_mb, "healthy": g.healthy,
         "health_reasons": sorted(set(g.health_reasons)) or ([] if g.healthy else ["unhealthy"])}
        for g in report.gpus
    ]  # fmt: skip
    fabrics = [{"fabric": f.fabric, "hcas": list(f.hcas), "rate_gbps": f.rate_gbps}
               for f in report.fabrics]  # fmt: skip
    storage = [
        {"fs_id": fs.id, "mount_point": fs.mount_point, "fs_type": fs.fs_type,
         "shared": fs.shared, "free_bytes": fs.free_bytes, "total_bytes": fs.total_bytes,
         "directories": sorted(set(fs.directories))}
        for fs in report.storage
    ]  # fmt: skip
    weights = [{"path": w.path, "size_bytes": w.size_bytes} for w in report.weights]
    return (
        report.id, report.hostname, report.mgmt_addr, json.dumps(dict(report.labels)),
        report.memory_total_mb, report.agent_version, json.dumps(dict(report.engine_versions)),
        disks.local.free_bytes if disks.local else None,
        disks.local.total_bytes if disks.local else None,
        disks.shared.free_bytes if disks.shared else None,
        disks.shared.total_bytes if disks.shared else None,
        bool(report.weights), report.digest(), json.dumps(gpus), json.dumps(fabrics),
        json.dumps(storage), json.dumps(weights),
    )  # fmt: skip


def agent_nodes(size: int, agents: int, agent: int) -> list[int]:
    return list(range(agent, min(size, WORKING_SET), agents))


class ReportSource:
    """Report bodies per (node, version), made once: the client's CPU is the service's too."""

    def __init__(self) -> None:
        self._bodies: dict[tuple[int, int], bytes] = {}
        self._raw: dict[tuple[int, int], tuple[Any, ...]] = {}

    def body(self, i: int, version: int) -> bytes:
        key = (i, version)
        if key not in self._bodies:
            self._bodies[key] = request_body(REGISTER, {"input": node_input(i, version)})
        return self._bodies[key]

    def raw(self, i: int, version: int) -> tuple[Any, ...]:
        key = (i, version)
        if key not in self._raw:
            self._raw[key] = raw_register_args(node_input(i, version))
        return self._raw[key]


def changed_reporter(
    bench: Bench, nodes: list[int], send: Callable[[int, int], Awaitable[None]]
) -> Callable[[], Awaitable[int]]:
    """Each call sends the next node's report with its local disk's free space moved."""
    position = 0

    async def call() -> int:
        nonlocal position
        i = nodes[position % len(nodes)]
        position += 1
        version = (bench.versions.get(i, 0) + 1) % 3
        await send(i, version)
        bench.versions[i] = version
        return 1

    return call


def unchanged_reporter(
    bench: Bench, nodes: list[int], send: Callable[[int, int], Awaitable[None]]
) -> Callable[[], Awaitable[int]]:
    position = 0

    async def call() -> int:
        nonlocal position
        i = nodes[position % len(nodes)]
        position += 1
        await send(i, bench.versions.get(i, 0))
        return 1

    return call


async def measure_registration(bench: Bench, statements: dict[str, str]) -> None:
    agents = 16
    source = ReportSource()
    changed, unchanged, raw = Figure(), Figure(), Figure()
    cpu_changed, cpu_unchanged = Figure(), Figure()
    # PostgreSQL's CPU per report, each way (the server's own processes).
    db_changed, db_unchanged, db_raw = Figure(), Figure(), Figure()
    failures = 0
    for _ in range(bench.rounds):
        clients = bench.connections(agents)

        def via_service(c: Connection) -> Callable[[int, int], Awaitable[None]]:
            async def send(i: int, version: int) -> None:
                await c.graphql(source.body(i, version))

            return send

        workers = [
            changed_reporter(bench, agent_nodes(bench.size, agents, a), via_service(c))
            for a, c in enumerate(clients)
        ]
        value, failed = await bench.throughput(workers, cpu_changed, db_changed)
        changed.add(value)
        failures += failed
        workers = [
            unchanged_reporter(bench, agent_nodes(bench.size, agents, a), via_service(c))
            for a, c in enumerate(clients)
        ]
        value, failed = await bench.throughput(workers, cpu_unchanged, db_unchanged)
        unchanged.add(value)
        failures += failed
        await close_all(clients)

        async with bench.pool(agents) as pool:

            def via_raw(pool: asyncpg.Pool) -> Callable[[int, int], Awaitable[None]]:
                async def send(i: int, version: int) -> None:
                    await pool.fetchval(RAW_REGISTER, *source.raw(i, version))

                return send

            workers = [
                changed_reporter(bench, agent_nodes(bench.size, agents, a), via_raw(pool))
                for a in range(agents)
            ]
            value, _ = await bench.throughput(workers, None, db_raw)
            raw.add(value)
    failed_note = f"; {failures} failed requests" if failures else ""
    add = bench.results.add
    add(Row(bench.size, "registerNode, changed report (disk free moved), 16 agents", "req/s",
            changed, "raw asyncpg, 1 statement", raw, statements.get("changed", ""),
            f"CPU per request: service {fmt(cpu_changed.median)} ms, PostgreSQL "
            f"{fmt(db_changed.median)} ms (raw: PostgreSQL {fmt(db_raw.median)} ms)"
            f"{failed_note}"))  # fmt: skip
    add(Row(bench.size, "registerNode, unchanged report (digest skip), 16 agents", "req/s",
            unchanged, "raw asyncpg, 1 statement (changed)", raw,
            statements.get("unchanged", ""),
            f"CPU per request: service {fmt(cpu_unchanged.median)} ms, PostgreSQL "
            f"{fmt(db_unchanged.median)} ms"))  # fmt: skip


async def measure_heartbeats(bench: Bench, statements: str) -> None:
    agents = 64
    service, raw, cpu = Figure(), Figure(), Figure()
    failures = 0
    ids = [node_id(i) for i in range(bench.size)]
    bodies = [request_body(HEARTBEAT, {"id": n}) for n in ids[:WORKING_SET]]
    for _ in range(bench.rounds):
        clients = bench.connections(agents)

        workers = [cycling(c, bodies[a::agents]) for a, c in enumerate(clients)]
        value, failed = await bench.throughput(workers, cpu)
        service.add(value)
        failures += failed
        await close_all(clients)

        async with bench.pool(agents) as pool:

            def raw_beat(a: int) -> Callable[[], Awaitable[int]]:
                mine = ids[: len(bodies)][a::agents]
                position = 0

                async def call() -> int:
                    nonlocal position
                    await pool.execute(
                        "UPDATE nodes SET last_seen = now() WHERE id = $1",
                        mine[position % len(mine)],
                    )
                    position += 1
                    return 1

                return call

            value, _ = await throughput([raw_beat(a) for a in range(agents)], bench.seconds)
            raw.add(value)
    note = f"service CPU {fmt(cpu.median)} ms/request"
    note += f"; {failures} failed requests" if failures else ""
    bench.results.add(
        Row(bench.size, "heartbeat, 64 agents", "req/s", service,
            "raw asyncpg, 1 UPDATE per beat", raw, statements, note)
    )  # fmt: skip

    # As real agents send them: each agent beats its own node with the token
    # bound to that node, which the service looks up in api_tokens on every
    # request (no cache: revocation takes effect at once). The rows above use
    # the bootstrap token, compared in memory.
    secrets = await agent_tokens(bench, ids[:agents])
    own, own_cpu = Figure(), Figure()
    own_failures = 0
    for _ in range(bench.rounds):
        clients = bench.connections(
            agents, [{"Authorization": f"Bearer {secret}"} for secret in secrets]
        )

        def own_beat(c: Connection, body: bytes) -> Callable[[], Awaitable[int]]:
            async def call() -> int:
                await c.graphql(body)
                return 1

            return call

        workers = [own_beat(c, bodies[a]) for a, c in enumerate(clients)]
        value, failed = await bench.throughput(workers, own_cpu)
        own.add(value)
        own_failures += failed
        await close_all(clients)
    note = f"service CPU {fmt(own_cpu.median)} ms/request"
    note += f"; {own_failures} failed requests" if own_failures else ""
    bench.results.add(
        Row(bench.size, "heartbeat with agents' own node tokens, 64 agents", "req/s", own,
            "raw asyncpg, 1 UPDATE per beat", raw, "", note)
    )  # fmt: skip


async def agent_tokens(bench: Bench, node_ids: list[str]) -> list[str]:
    """An agent token bound to each node, made as `ctl tokens create --role agent` makes them."""
    engine = create_engine(bench.url, Settings())
    try:
        async with engine.begin() as conn:
            return [
                (await tokens.create_token(conn, "agent", node_id=n, description="bench")).secret
                for n in node_ids
            ]
    finally:
        await dispose(engine)
