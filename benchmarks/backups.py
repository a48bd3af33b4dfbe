"""Backups at size: the backup's effect on place and heartbeat rates, archive size per hour, restore time.

Not part of `python -m benchmarks` (it needs Docker and takes about
15 minutes at 100,000 nodes); run by hand and copy its printout into
BENCHMARKS.md's "Backups and restores":

    .venv/bin/python -m benchmarks.backups --nodes 100000

It brings docker-compose.yml up under its own project (images as
deploy/base-images.sh gives them), registers the nodes through the API
(nginx, 16 concurrent reporters, 8 GPUs each), then weighs the backup's
cost on the hot path: windows of 16 heartbeating agents and 8 placing and
releasing schedulers at once, alternately without a backup (--seconds) and
exactly as long as a full backup runs (started with the window, taken as
--variants says: "schedule" is the image's own `llmgw-backup backup full`),
each backup window against the mean of the windows on either side of it
(--rounds of each variant; each window's load and the cores each container
used are printed). Then the WAL the service's own batched heartbeat writes for every node once
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
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

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
        # Tagged by project: a later run on a stack kept with --keep finds its images
        # and leaves its containers as they are.
        LLMGW_IMAGE=f"llmgw-inventory:{PROJECT}",
        LLMGW_POSTGRES_IMAGE=f"llmgw-postgres-pgbackrest:{PROJECT}",
        # No scheduled incremental inside a window: only the backups the run takes.
        LLMGW_BACKUP_INCR_EVERY="86400",
        INVENTORY_BOOTSTRAP_TOKEN=TOKEN,
        INVENTORY_PUBLISH_PORT=str(port),
        LLMGW_SUBNET_PREFIX="172.29.250",
    )
    return env


async def rate(
    url: str, workers: int, stop: asyncio.Event, work: Callable[[Connection, int], Awaitable[int]]
) -> float:
    """Operations per second of `workers` connections each calling `work` until `stop` is set.

    Counted up to the moment `stop` is set: an operation still in flight then
    is not counted, and the window's length is the time until then."""
    done = 0
    started = time.monotonic()

    async def worker(n: int) -> None:
        nonlocal done
        connection = Connection(url, {"Authorization": f"Bearer {TOKEN}"})
        try:
            while not stop.is_set():
                ops = await work(connection, n)
                if not stop.is_set():
                    done += ops
        finally:
            await connection.close()

    stopped = started

    async def until_stop() -> None:
        nonlocal stopped
        await stop.wait()
        stopped = time.monotonic()

    await asyncio.gather(until_stop(), *(worker(n) for n in range(workers)))
    return done / (stopped - started)


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


# How a full backup is taken in the cost phase (--variants), in the database
# container. "schedule" is exactly what the image's schedule runs (under the
# repository's lock, at the compose file's LLMGW_BACKUP_PACE); "paced-N" the same
# at a pace of N% (docs/operations/backup.md, "The backup's cost"); the others run
# pgBackRest directly, under the same lock (never two backups at once).
LOCKED = ["flock", "/var/lib/pgbackrest/llmgw-backup.lock"]
FULL = ["pgbackrest", "--stanza=llmgw", "--type=full"]
IDLE = ["nice", "-n", "19", "ionice", "-c", "3"]
SCHEDULE = ["llmgw-backup", "backup", "full"]
VARIANTS: dict[str, list[str]] = {
    "schedule": SCHEDULE,
    **{f"paced-{n}": ["env", f"LLMGW_BACKUP_PACE={n / 100:g}", *SCHEDULE] for n in (10, 25, 50)},
    "plain-2": [*LOCKED, *FULL, "--process-max=2", "backup"],
    "idle-1": [*LOCKED, *IDLE, *FULL, "--process-max=1", "backup"],
    "idle-1-uncompressed": [
        *LOCKED,
        *IDLE,
        *FULL,
        "--process-max=1",
        "--compress-type=none",
        "backup",
    ],
}


@dataclass
class Window:
    """One window of the hot path: heartbeats and places at once, with or without a backup."""

    backup: str | None  # the variant running through the window, None for none
    seconds: float
    beats: float  # heartbeats/s
    places: float  # place+release/s
    load: float  # the machine's 1-minute load average at the window's end
    cpu: dict[str, float]  # CPU seconds used during the window, by whom


def containers(env: dict[str, str]) -> dict[str, str]:
    """The stack's running containers: service name -> full container id."""
    out = sh("docker", "ps", "--no-trunc", "--filter", f"label=com.docker.compose.project={PROJECT}",
             "--format", '{{.ID}} {{.Label "com.docker.compose.service"}}', env=env)  # fmt: skip
    return {name: cid for cid, name in (line.split() for line in out.splitlines() if line)}


def cpu_seconds(ids: dict[str, str]) -> dict[str, float]:
    """CPU seconds used so far: each container (its cgroup's cpuacct), this load generator,
    and the whole machine (/proc/stat); empty for a container whose cgroup is not found."""
    used: dict[str, float] = {}
    for name, cid in ids.items():
        for path in (
            Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage"),
            Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"),
        ):
            if path.exists():
                text = path.read_text()
                if path.name == "cpu.stat":  # cgroup v2: usage_usec
                    stat = dict(line.split() for line in text.splitlines())
                    used[name] = int(stat["usage_usec"]) / 1e6
                else:
                    used[name] = int(text) / 1e9
                break
    used["load generator"] = time.process_time()
    ticks = os.sysconf("SC_CLK_TCK")
    jiffies = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    used["machine"] = (sum(jiffies) - jiffies[3] - jiffies[4]) / ticks  # less idle and iowait
    return used


async def window(
    env: dict[str, str], url: str, nodes: int, ids: dict[str, str], variant: str | None,
    seconds: float,
) -> Window:  # fmt: skip
    """The hot path (16 heartbeating agents and 8 placing-and-releasing schedulers at once)
    for `seconds` without a backup, or exactly as long as a full backup (`variant`) runs:
    the load starts with the backup and is counted until the backup ends, so no part of
    the window is without it, and no part of the backup is outside the window.

    A checkpoint comes first either way: the backup starts with one (start-fast), and
    the full-page images each page's first write after it brings are then paid in both."""
    psql(env, "CHECKPOINT")
    stop = asyncio.Event()
    before = cpu_seconds(ids)
    started = time.monotonic()
    failure: str | None = None

    async def until_end() -> None:
        nonlocal failure
        if variant is None:
            await asyncio.sleep(seconds)
        else:
            command = ["docker", "exec", ids["postgres"], *VARIANTS[variant]]
            backup = await asyncio.create_subprocess_exec(
                *command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            out, _ = await backup.communicate()
            if backup.returncode != 0:
                failure = f"{variant} backup failed: {out.decode()[-2000:]}"
        stop.set()

    _, beats, placed = await asyncio.gather(
        until_end(), rate(url, 16, stop, heartbeats(nodes)), rate(url, 8, stop, places())
    )
    elapsed = time.monotonic() - started
    if failure:
        raise SystemExit(failure)
    after = cpu_seconds(ids)
    cpu = {name: after[name] - before[name] for name in after if name in before}
    return Window(variant, elapsed, beats, placed, os.getloadavg()[0], cpu)


def describe(w: Window) -> str:
    containers_cpu = sum(v for k, v in w.cpu.items() if k not in ("machine", "load generator"))
    rest = w.cpu.get("machine", 0.0) - containers_cpu - w.cpu.get("load generator", 0.0)
    share = ", ".join(
        f"{name} {w.cpu[name] / w.seconds:.2f}"
        for name in sorted(w.cpu)
        if name != "machine" and w.cpu[name] / w.seconds >= 0.01
    )
    return (
        f"{w.backup or 'no backup':>20}: {w.seconds:5.1f} s, heartbeats/s {w.beats:6.1f}, "
        f"place+release/s {w.places:5.1f}, load {w.load:4.1f}; cores used: {share}, "
        f"rest of the machine {rest / w.seconds:.2f}"
    )


async def backup_cost(env: dict[str, str], url: str, args: argparse.Namespace) -> list[Window]:
    """Windows without a backup and with one, alternating (A B A B ... A): each window
    with a backup lies between two without, and is judged against their mean, so a
    load that rises or falls on this shared machine over the run weighs on both sides.
    With several variants, each round runs each of them once, in turn."""
    ids = containers(env)
    variants = args.variants.split(",")
    for variant in variants:
        if variant not in VARIANTS:
            raise SystemExit(f"--variants: {variant!r} is none of {', '.join(VARIANTS)}")
    windows = [await window(env, url, args.nodes, ids, None, args.seconds)]
    print(describe(windows[-1]), flush=True)
    for _ in range(args.rounds):
        for variant in variants:
            for kind in (variant, None):
                windows.append(await window(env, url, args.nodes, ids, kind, args.seconds))
                print(describe(windows[-1]), flush=True)
    return windows


def report_cost(windows: list[Window]) -> None:
    """Per variant: each backup window against the mean of the windows without a backup
    on either side of it, and the variant's rates over all its windows against theirs."""
    by_variant: dict[str, list[tuple[Window, Window, Window]]] = {}
    for i, w in enumerate(windows):
        if w.backup is not None:
            by_variant.setdefault(w.backup, []).append((windows[i - 1], w, windows[i + 1]))
    for variant, triples in by_variant.items():
        beats_ratios = [(a.beats + c.beats) / 2 / b.beats for a, b, c in triples]
        places_ratios = [(a.places + c.places) / 2 / b.places for a, b, c in triples]
        alone_beats = mean([(a.beats + c.beats) / 2 for a, _, c in triples])
        alone_places = mean([(a.places + c.places) / 2 for a, _, c in triples])
        during_beats = mean([b.beats for _, b, _ in triples])
        during_places = mean([b.places for _, b, _ in triples])
        loads = [w.load for t in triples for w in t]
        print(
            f"{variant}: heartbeats x{alone_beats / during_beats:.2f} slower during a full "
            f"backup ({alone_beats:.0f}/s without, {during_beats:.0f}/s during; each window "
            f"{', '.join(f'x{r:.2f}' for r in beats_ratios)}), place+release "
            f"x{alone_places / during_places:.2f} ({alone_places:.1f}/s without, "
            f"{during_places:.1f}/s during; {', '.join(f'x{r:.2f}' for r in places_ratios)}); "
            f"the backup took {', '.join(f'{b.seconds:.0f}' for _, b, _ in triples)} s; "
            f"load {min(loads):.1f}-{max(loads):.1f}"
        )


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
        # The schedule's first full backup (and the stanza) before any load: until then
        # archiving fails and the repository has nothing a window's backup could follow.
        postgres = containers(env)["postgres"]
        for _ in range(300):
            look = ["docker", "exec", postgres, "llmgw-backup", "range"]
            answer = await asyncio.to_thread(subprocess.run, look, capture_output=True, text=True)
            if answer.returncode == 0 and answer.stdout.strip() not in ("", "null"):
                break
            await asyncio.sleep(1)
        else:
            raise SystemExit("no first full backup within 300 s")
        if args.skip_register:
            print(f"{args.nodes} nodes registered before (--skip-register)")
        else:
            took = await register(url, args.nodes)
            print(f"registered {args.nodes} nodes through the API in {took:.0f} s")
        size = psql(env, "SELECT pg_size_pretty(pg_database_size('llmgw'))")
        print(f"database size: {size}")
        windows = await backup_cost(env, url, args)
        report_cost(windows)
        if args.cost_only:
            return
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
    parser.add_argument("--seconds", type=float, default=40.0, help="each window without a backup")
    parser.add_argument("--rounds", type=int, default=2, help="windows with each backup variant")
    parser.add_argument(
        "--variants",
        default="schedule",
        help=f"comma-separated backup variants to weigh, of {', '.join(VARIANTS)}",
    )
    parser.add_argument(
        "--cost-only",
        action="store_true",
        help="only the backup's cost (no WAL per heartbeat, no restore)",
    )
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
