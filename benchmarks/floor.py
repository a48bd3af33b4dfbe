"""The floor: what one process of this stack costs before the inventory does anything.

A bare Starlette endpoint that reads the request's JSON body, parses it, and
answers a fixed GraphQL-shaped body, served by uvicorn with the service's own
options (service.cli.uvicorn_options) and driven by the same load generator
(wrk when installed, else benchmarks/client.py: benchmarks/wrk.py says why;
32 keep-alive connections). One service process is
measured against it in the same run, round by round, so the ratio says how
much of the stack's ceiling the inventory keeps:

- the agents' heartbeat (the compiled route), with the bootstrap token;
- `node(id) { id state gpus { index healthy } }`, a scheduler's or the
  dashboard's look at one node (the compiled node route); and, for
  comparison in the same rounds, the same answer through graphql-core (an
  `@include(if: true)` the compiled route declines), as node(id) went before.

`python -m benchmarks.floor --port N` serves the floor alone (for py-spy or wrk).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from benchmarks import wrk
from benchmarks.bench import TICKS, Bench, close_all
from benchmarks.client import Connection, cycling, request_body
from benchmarks.cluster import node_id
from benchmarks.measure import Figure, throughput
from benchmarks.results import Row, fmt
from benchmarks.services import HEADERS, REPO, Service, free_port

CONNECTIONS = 32
HEARTBEAT = "mutation Beat($id: ID!) { heartbeat(nodeId: $id) { id state } }"
NODE = "query Node($id: ID!) { node(id: $id) { id state gpus { index healthy } } }"
# The same answer, which the compiled node route declines (a directive): graphql-core's.
NODE_BY_GRAPHQL_CORE = NODE.replace("gpus {", "gpus @include(if: true) {")
# The answer the floor gives every request: the shape of a heartbeat's.
ANSWER = json.dumps({"data": {"heartbeat": {"id": "node-000001", "state": "READY"}}}).encode()


async def graphql(request: Request) -> Response:
    body = json.loads(await request.body())
    if not isinstance(body, dict) or not isinstance(body.get("query"), str):
        return Response(b'{"errors":[{"message":"no query"}]}', 400, media_type="application/json")
    return Response(ANSWER, media_type="application/json")


def floor_app() -> Starlette:
    return Starlette(routes=[Route("/graphql", graphql, methods=["POST"])])


@contextlib.contextmanager
def floor_process(timeout: float = 30.0) -> Iterator[tuple[str, int]]:
    """The floor in its own process; yields its /graphql URL and its pid."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.floor", "--port", str(port)], cwd=REPO
    )
    url = f"http://127.0.0.1:{port}/graphql"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the floor exited with {process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.post(url, json={"query": "{ ping }"}, timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the floor did not start in time")
            time.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(timeout=15)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Target:
    """Where a workload goes: a URL, and the process whose CPU it costs."""

    url: str
    pid: int
    rate: Figure = field(default_factory=Figure)
    cpu: Figure = field(default_factory=Figure)  # ms per request
    # The share of the round's time its process was on a CPU. The ratio of
    # two rates is the ratio of their CPU a request times the ratio of these:
    # a process waiting on PostgreSQL with every connection's request in one
    # batch idles meanwhile (docs/history/benchmarks-journal.md, "why the heartbeat's process
    # idles"); the floor never does.
    busy: Figure = field(default_factory=Figure)
    failures: int = 0


async def _round(target: Target, bodies: list[bytes], seconds: float, record: bool = True) -> None:
    """CONNECTIONS connections to the target for `seconds`: wrk's when installed, else client.py's."""
    if wrk.WRK is not None:
        before = cpu_seconds(target.pid)
        done = await asyncio.to_thread(wrk.run, target.url, bodies, HEADERS, CONNECTIONS, seconds)
        if record:
            target.rate.add(done.rate)
            target.failures += done.failures
            used = cpu_seconds(target.pid) - before
            if done.requests:
                target.cpu.add(used / done.requests * 1000)
            if done.seconds:
                target.busy.add(used / done.seconds)
        return
    clients = [Connection(target.url, HEADERS) for _ in range(CONNECTIONS)]

    workers = [cycling(c, bodies[i::CONNECTIONS] or bodies) for i, c in enumerate(clients)]
    before = cpu_seconds(target.pid)
    start = time.perf_counter()
    try:
        rate, failed = await throughput(workers, seconds)
    finally:
        await close_all(clients)
    if not record:
        return
    used = cpu_seconds(target.pid) - before
    elapsed = time.perf_counter() - start
    done = rate * elapsed
    target.rate.add(rate)
    target.failures += failed
    target.busy.add(used / elapsed)
    if done:
        target.cpu.add(used / done * 1000)


async def measure_floor(bench: Bench) -> None:
    """Heartbeat and node(id) of one service process, as ratios of the floor."""
    ids = [node_id(i) for i in range(min(bench.size, 1024))]
    beats = [request_body(HEARTBEAT, {"id": n}) for n in ids]
    looks = [request_body(NODE, {"id": n}) for n in ids]
    core_looks = [request_body(NODE_BY_GRAPHQL_CORE, {"id": n}) for n in ids]
    # One process of its own: the suite's others stay idle meanwhile.
    single = Service(bench.url)
    single.start()
    try:
        with floor_process() as (floor_url, floor_pid):
            floor = Target(floor_url, floor_pid)
            beat = Target(single.url, single.pid)
            look = Target(single.url, single.pid)
            core_look = Target(single.url, single.pid)
            work = ((floor, beats), (beat, beats), (look, looks), (core_look, core_looks))
            # Warm: the service's pool opens its connections on first use.
            for target, bodies in work:
                await _round(target, bodies, 0.3, record=False)
            # Three rounds even in the quick run (CI, 0.7 s each, about 6 s
            # more than one): a single round there moved the heartbeat's
            # ratio from 0.5 to 0.97x with whatever else the host ran.
            for _ in range(max(3, bench.rounds)):
                # Interleaved, so that a busier moment of the machine weighs on all three.
                for target, bodies in work:
                    await _round(target, bodies, bench.seconds)
    finally:
        single.stop()
    name = f"bare Starlette floor, {CONNECTIONS} connections"
    driver = (
        "driven by wrk (benchmarks/wrk.py)"
        if wrk.WRK is not None
        else "driven by benchmarks/client.py: wrk is not installed"
    )
    for target, label, goal in (
        (beat, "heartbeat (compiled)", 0.6),
        (look, "node(id) { id state gpus { index healthy } }", 0.3),
        (core_look, "the same node(id) through graphql-core", None),
    ):
        cpu_ratio = floor.cpu.median / target.cpu.median if target.cpu.values else float("nan")
        note = (
            ("" if goal is None else f"target {goal}; ")
            + f"CPU per request: service {fmt(target.cpu.median)} ms, floor "
            f"{fmt(floor.cpu.median)} ms (ratio {cpu_ratio:.2f}); process busy: service "
            f"{target.busy.median:.0%}, floor {floor.busy.median:.0%}; {driver}"
        )
        if target.failures or floor.failures:
            note += f"; {target.failures + floor.failures} failed requests"
        bench.results.add(
            Row(bench.size, f"{label}, {CONNECTIONS} connections, 1 process", "req/s",
                target.rate, name, floor.rate, "", note)
        )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from service.cli import uvicorn_options
    from service.config import Settings

    parser = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(floor_app(), host="127.0.0.1", port=args.port, **uvicorn_options(Settings()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
