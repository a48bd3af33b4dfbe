"""PostGraphile 5 (on Node 22, both from npm) as an optional peer serving the same tables.

Started only when `npm` is on PATH; the suite says so when it is not, or when
the install or the start fails. PostGraphile connects as a read-only role
(SELECT on every table), so the peer can read what the service wrote but never
write. The `nodes` table is renamed for it by a smart-tag comment: its type
would otherwise collide with Relay's `Node` interface and be dropped.

Its answer to the full-page question has the same nodes, GPUs (with which
shard holds each), filesystems and shards as the service's, in its own naming.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx

from benchmarks.bench import Bench, close_all
from benchmarks.client import Connection, request_body
from benchmarks.measure import Figure, latencies, percentile, throughput
from benchmarks.questions import PAGE, PAGE_SIZE
from benchmarks.results import Row
from benchmarks.services import free_port

INSTALL_DIR = Path("/tmp/llmgw-bench-postgraphile")
PACKAGES = ("node@22", "postgraphile@5")
READER = "bench_reader"

PEER_PAGE = """
query Page($first: Int!) {
  allInventoryNodes(first: $first, orderBy: PRIMARY_KEY_ASC) {
    nodes {
      rowId hostname state
      gpusesByNodeId(orderBy: PRIMARY_KEY_ASC) { nodes { idx gpuClass healthy } }
      allocatedGpusesByNodeId { nodes { gpuIndex shardId } }
      filesystemsByNodeId { nodes { fsId mountPoint freeBytes totalBytes } }
      shardsByNodeId { nodes { shardId replicaId gpuIndices } }
    }
  }
}
"""


def install(wait_seconds: float) -> str | None:
    """The postgraphile executable's folder, installing on first use; None with a note if not."""
    bin_dir = INSTALL_DIR / "node_modules" / ".bin"
    if (bin_dir / "postgraphile").exists() and (bin_dir / "node").exists():
        return str(bin_dir)
    INSTALL_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(INSTALL_DIR), *PACKAGES],
        check=True,
        timeout=wait_seconds,
        capture_output=True,
    )
    return str(bin_dir)


async def read_only_role(url: str) -> str:
    """A connection string for PostGraphile as a role that may only read."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            f"DO $$BEGIN CREATE ROLE {READER} LOGIN; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END$$"
        )
        await conn.execute(f"GRANT USAGE ON SCHEMA public TO {READER}")
        await conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READER}")
        await conn.execute("COMMENT ON TABLE nodes IS E'@name inventory_node'")
    finally:
        await conn.close()
    parts = urlsplit(url)
    return urlunsplit(("postgres", f"{READER}@", parts.path, parts.query, ""))


@contextlib.contextmanager
def running(bin_dir: str, connection: str, port: int, wait_seconds: float):  # type: ignore[no-untyped-def]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GRAPHILE_ENV": "production"}
    process = subprocess.Popen(
        ["postgraphile", "-P", "postgraphile/presets/amber", "-c", connection, "-s", "public",
         "-p", str(port), "-n", "127.0.0.1"],
        env=env,
        cwd=INSTALL_DIR,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + wait_seconds
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"postgraphile exited with {process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                reply = httpx.post(
                    f"http://127.0.0.1:{port}/graphql", json={"query": "{ __typename }"}, timeout=2
                )
                if reply.status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("postgraphile did not answer in time")
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/graphql"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def measure_peer(bench: Bench, wait_seconds: float) -> None:
    if shutil.which("npm") is None:
        bench.results.note("PostGraphile peer skipped: npm is not on PATH")
        return
    try:
        bin_dir = await asyncio.to_thread(install, wait_seconds)
    except (subprocess.SubprocessError, OSError) as error:
        bench.results.note(f"PostGraphile peer skipped: installing {PACKAGES} failed ({error})")
        return
    assert bin_dir is not None
    first = min(PAGE_SIZE, bench.size)
    connection = await read_only_role(bench.url)
    try:
        with running(bin_dir, connection, free_port(), wait_seconds) as url:
            peer_body = request_body(PEER_PAGE, {"first": first})
            own_body = request_body(PAGE, {"first": first})
            peer = Connection(url)
            (own,) = bench.connections(1)
            reply = await peer.graphql(peer_body)
            got = len(reply["data"]["allInventoryNodes"]["nodes"])
            if got != first:
                bench.results.note(f"PostGraphile answered {got} nodes, expected {first}")
            calls = max(3, bench.calls // 20)
            p50, peer_p50, rate, peer_rate = Figure(), Figure(), Figure(), Figure()
            for _ in range(bench.rounds):
                samples = await latencies(lambda: own.graphql(own_body), calls)
                p50.add(percentile(samples, 50) * 1000)
                samples = await latencies(lambda: peer.graphql(peer_body), calls)
                peer_p50.add(percentile(samples, 50) * 1000)
                for body, figure, make in (
                    (own_body, rate, lambda: bench.connections(16)),
                    (peer_body, peer_rate, lambda: [Connection(url) for _ in range(16)]),
                ):
                    clients = make()

                    def worker(c: Connection, body: bytes = body):  # type: ignore[no-untyped-def]
                        async def call() -> int:
                            await c.graphql(body)
                            return 1

                        return call

                    value, _ = await throughput([worker(c) for c in clients], bench.seconds)
                    figure.add(value)
                    await close_all(clients)
            await close_all([own, peer])
    except (RuntimeError, OSError, KeyError) as error:
        bench.results.note(f"PostGraphile peer failed: {error}")
        return
    add = bench.results.add
    add(Row(bench.size, f"nodes(first {first}) full page p50, 1 client (vs PostGraphile 5)", "ms",
            p50, "PostGraphile 5, Node 22", peer_p50, better="lower"))  # fmt: skip
    add(Row(bench.size, f"nodes(first {first}) full page req/s, 16 clients (vs PostGraphile 5)",
            "req/s", rate, "PostGraphile 5, Node 22", peer_rate))  # fmt: skip
