"""Backups at size: the backup's effect on place and heartbeat rates, archive size per hour, restore time.

Not part of `python -m benchmarks` (it needs Docker and takes about
15 minutes at 100,000 nodes); run by hand and copy its printout into
BENCHMARKS.md's "Backups and restores":

    .venv/bin/python -m benchmarks.backups --nodes 100000

It brings docker-compose.yml up under its own project (images as
deploy/base-images.sh gives them), registers the nodes through the API
(nginx, 16 concurrent reporters, 8 GPUs each), then, each for --seconds:
heartbeats alone (16 workers, one node each per call) and places with
releases (8 schedulers) without a backup; the same while a full backup runs
(`llmgw-backup backup full` on the database container, as the schedule
takes it, started just before); the WAL the service's own batched heartbeat writes for every node once
(run in the service's container: right after a checkpoint, with full-page
images, and once more without) and what the repository's archive grew by
(compressed and encrypted), scaled to an hour of every node heartbeating every
10 s with a checkpoint every 5 minutes; and `deploy/restore.sh -f docker-compose.yml --to latest`, timed. Each
ratio is against the same run's rate without the backup.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from benchmarks.client import Connection, request_body
from tests.support.reports import PLACE, REGISTER, node_input

REPO = Path(__file__).resolve().parents[1]
PROJECT = os.environ.get("LLMGW_BENCH_PROJECT", f"llmgw-bench-backups-{os.getpid()}")
TOKEN = "bench-backups-token-0123456789"
HEARTBEAT = "mutation Beat($id: ID!) { heartbeat(nodeId: $id) { id } }"
RELEASE = "mutation Release($id: ID!) { releaseReplica(replicaId: $id) }"


def sh(*command: str, env: dict[str, str], timeout: float = 1800) -> str:
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: {done.stderr[-2000:] or done.stdout[-2000:]}")
    return done.stdout


def environment(port: int) -> dict[str, str]:
    env = dict(os.environ)
    for line in sh("bash", "deploy/base-images.sh", env=env).splitlines():
        name, _, value = line.partition("=")
        env[name] = value
    env.update(
        LLMGW_IMAGE=f"llmgw-inventory:bench-{os.getpid()}",
        LLMGW_POSTGRES_IMAGE=f"llmgw-postgres-pgbackrest:bench-{os.getpid()}",
        INVENTORY_BOOTSTRAP_TOKEN=TOKEN,
        INVENTORY_PUBLISH_PORT=str(port),
        LLMGW_SUBNET_PREFIX="172.29.250",
    )
    return env


async def rate(
    url: str, workers: int, seconds: float, work: Callable[[Connection, int], Awaitable[int]]
) -> float:
    """Operations per second of `workers` connections each calling `work` until time is up."""
    done = 0
    deadline = time.monotonic() + seconds

    async def worker(n: int) -> None:
        nonlocal done
        connection = Connection(url, {"Authorization": f"Bearer {TOKEN}"})
        try:
            while time.monotonic() < deadline:
                done += await work(connection, n)
        finally:
            await connection.close()

    started = time.monotonic()
    await asyncio.gather(*(worker(n) for n in range(workers)))
    return done / (time.monotonic() - started)


async def register(url: str, nodes: int, workers: int = 16) -> float:
    """Seconds to register `nodes` nodes through the API, `workers` reporters at once."""
    queue = iter(range(nodes))
    started = time.monotonic()

    async def reporter() -> None:
        connection = Connection(url, {"Authorization": f"Bearer {TOKEN}"})
        try:
            for i in queue:
                body = request_body(REGISTER, {"input": node_input(f"n{i:06d}")})
                await connection.graphql(body)
        finally:
            await connection.close()

    await asyncio.gather(*(reporter() for _ in range(workers)))
    return time.monotonic() - started


def heartbeats(nodes: int) -> Callable[[Connection, int], Awaitable[int]]:
    async def work(connection: Connection, _: int) -> int:
        node = f"n{random.randrange(nodes):06d}"
        await connection.graphql(request_body(HEARTBEAT, {"id": node}))
        return 1

    return work


def places() -> Callable[[Connection, int], Awaitable[int]]:
    counter = 0

    async def work(connection: Connection, n: int) -> int:
        nonlocal counter
        counter += 1
        replica = f"bench-{n}-{counter}"
        body = {"replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": 1}
        await connection.graphql(request_body(PLACE, {"input": body}))
        await connection.graphql(request_body(RELEASE, {"id": replica}))
        return 1

    return work


# Run in the service's container (its code and DATABASE_URL), twice: `warmup`, a cycle
# that brings every node back alive; then `measure`, a cycle more, a CHECKPOINT and a cycle
# (full-page images), then a cycle (none): WAL bytes of each, written by the service's own
# batched heartbeat.
HEARTBEAT_CYCLES = r"""
import asyncio, json, os, sys
from sqlalchemy import text
from service.config import Settings
from service.database.db import create_engine, dispose
from service.database.transactions import in_transaction
from service.fleet import node_writes

async def main():
    engine = create_engine(os.environ["DATABASE_URL"], Settings())
    async with engine.connect() as conn:
        ids = [r[0] for r in await conn.execute(text("SELECT id FROM nodes ORDER BY id"))]

    async def lsn():
        async with engine.connect() as conn:
            return (await conn.execute(text("SELECT pg_current_wal_lsn() - '0/0'"))).scalar()

    async def cycle():
        for i in range(0, len(ids), 100):
            batch = ids[i:i + 100]
            await in_transaction(engine, lambda conn, b=batch: node_writes.heartbeat_many(conn, b))

    await cycle()  # every node back alive (events for those the sweep had declared lost)
    if sys.argv[1:] == ["warmup"]:
        await dispose(engine)
        return
    started = await lsn()
    async with engine.connect() as conn:
        await conn.execute(text("CHECKPOINT"))
    first = await lsn()
    await cycle()
    second = await lsn()
    await cycle()
    third = await lsn()
    out = {"after_checkpoint": int(second - first), "steady": int(third - second),
           "written": int(third - started)}
    await dispose(engine)
    print(json.dumps(out))

asyncio.run(main())
"""


def psql(env: dict[str, str], sql: str) -> str:
    return sh(
        "docker-compose", "-p", PROJECT, "exec", "-T", "postgres",
        "psql", "-U", "llmgw", "-d", "llmgw", "-qAt", "-c", sql, env=env,
    ).strip()  # fmt: skip


def archive_bytes(env: dict[str, str]) -> int:
    out = sh("docker-compose", "-p", PROJECT, "exec", "-T", "postgres",
             "du", "-sb", "/var/lib/pgbackrest/archive", env=env)  # fmt: skip
    return int(out.split()[0])


async def main_async(args: argparse.Namespace) -> None:
    env = environment(args.port)
    url = f"http://127.0.0.1:{args.port}/graphql"
    sh("docker-compose", "-p", PROJECT, "up", "-d", "--build", env=env)
    try:
        for _ in range(180):
            probe = ["curl", "-fsS", "-o", "/dev/null", f"http://127.0.0.1:{args.port}/readyz"]
            ready = await asyncio.to_thread(subprocess.run, probe, capture_output=True)
            if ready.returncode == 0:
                break
            await asyncio.sleep(1)
        if args.skip_register:
            print(f"{args.nodes} nodes registered before (--skip-register)")
        else:
            took = await register(url, args.nodes)
            print(f"registered {args.nodes} nodes through the API in {took:.0f} s")
        size = psql(env, "SELECT pg_size_pretty(pg_database_size('llmgw'))")
        print(f"database size: {size}")
        # Each window starts right after a checkpoint, as the backup's does (start-fast):
        # the full-page images every first touch of a page then writes are paid in both,
        # and the ratio is the backup's own cost.
        psql(env, "CHECKPOINT")
        beats = await rate(url, 16, args.seconds, heartbeats(args.nodes))
        psql(env, "CHECKPOINT")
        placed = await rate(url, 8, args.seconds, places())
        backup = await asyncio.create_subprocess_exec(
            "docker-compose", "-p", PROJECT, "exec", "-T", "postgres",
            "llmgw-backup", "backup", "full",
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        started = time.monotonic()
        beats_during = await rate(url, 16, args.seconds, heartbeats(args.nodes))
        placed_during = await rate(url, 8, args.seconds, places())
        await backup.wait()
        backup_seconds = time.monotonic() - started
        print(
            f"heartbeats/s {beats:.0f} alone, {beats_during:.0f} during a full backup "
            f"(x{beats / beats_during:.2f}); place+release/s {placed:.1f} alone, "
            f"{placed_during:.1f} during it (x{placed / placed_during:.2f}); the full backup "
            f"took {backup_seconds:.0f} s (at least: it ran under the measurement)"
        )
        cycle_command = ["docker-compose", "-p", PROJECT, "exec", "-T", "inventory-1", "python",
                         "-c", HEARTBEAT_CYCLES]  # fmt: skip
        sh(*cycle_command, "warmup", env=env, timeout=1800)
        psql(env, "SELECT pg_switch_wal()")
        await asyncio.sleep(70)  # the warm-up's WAL archived before the count starts
        archived_before = archive_bytes(env)
        cycles = json.loads(sh(*cycle_command, "measure", env=env, timeout=1800))
        psql(env, "SELECT pg_switch_wal()")
        await asyncio.sleep(70)  # archive_timeout, and the push
        archived = archive_bytes(env) - archived_before
        ratio = archived / max(1, cycles["written"])
        # Every node every 10 s: 360 cycles an hour; a checkpoint every 5 min
        # (checkpoint_timeout) makes 12 of them pay full-page images.
        per_hour = 12 * cycles["after_checkpoint"] + 348 * cycles["steady"]
        print(
            f"heartbeat cycles of all {args.nodes} nodes (the batched path, 100 per "
            f"statement): {cycles['after_checkpoint'] / args.nodes:.0f} bytes of WAL per "
            f"heartbeat right after a checkpoint, {cycles['steady'] / args.nodes:.0f} after; "
            f"archived at x{ratio:.2f} of the WAL (lz4, encrypted): an hour of every node "
            f"heartbeating every 10 s writes {per_hour / 2**30:.1f} GiB of WAL and archives "
            f"{per_hour * ratio / 2**30:.1f} GiB"
        )
        started = time.monotonic()
        sh("bash", "deploy/restore.sh", "-p", PROJECT, "-f", "docker-compose.yml", "--to",
           "latest", env=env, timeout=3600)  # fmt: skip
        print(f"restore to latest ({size}): {time.monotonic() - started:.0f} s")
    finally:
        if not args.keep:
            sh("docker-compose", "-p", PROJECT, "down", "-v", env=env)
            # The tags, not the layers (docker's build cache for the next run).
            tags = [env["LLMGW_IMAGE"], env["LLMGW_POSTGRES_IMAGE"]]
            await asyncio.to_thread(
                subprocess.run, ["docker", "image", "rm", "--no-prune", *tags], capture_output=True
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=18180)
    parser.add_argument("--keep", action="store_true", help="leave the stack up")
    parser.add_argument(
        "--skip-register",
        action="store_true",
        help="the stack (LLMGW_BENCH_PROJECT, kept by --keep) holds the nodes already",
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
