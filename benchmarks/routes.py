"""What each route of the fast path buys: the same requests against Strawberry's view alone.

The fast path (service/graphql/fast/) is kept only for what it saves, so each
of its routes is measured against the path it replaces: two service processes
on the same database, one with INVENTORY_FAST_PATH=true, one with it false,
the same requests to each, round by round and alternately, so a busier moment
of the machine weighs on both. Per route the row gives each process's CPU per
request (from /proc, which the machine's load moves far less than rates;
PostgreSQL's CPU per request and the rates are in its note), and the target (results.py) is that the route costs
at most 0.9x what Strawberry's view costs for the same request: a route that
stops paying for itself can be deleted, and Strawberry's view then answers
what it answered.

- heartbeat: the agents' beat (compiled_heartbeat.py);
- registration: an agent's unchanged report, registerNode (compiled_registration.py);
- place: a scheduler's one-GPU place (compiled_place.py); the benchmark's
  replicas are released by SQL between rounds, so only places are counted;
- page: a page of 100 nodes with their GPUs, built as JSON by PostgreSQL
  (compiled_page.py, json_pages.py);
- node: node(id) with its GPUs, the same builder (compiled_node.py);
- graphql_core: that node(id) with a directive no compiled route takes,
  which the fast path answers by graphql-core on the cached document
  (direct.py) with plain-field completion (execution.py).

`python -m benchmarks --only routes` runs this section alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from benchmarks.allocation import PLACE, PLACE_CLASS, check_and_release
from benchmarks.bench import Bench, close_all
from benchmarks.client import Connection, cycling, request_body
from benchmarks.cluster import node_id, node_input
from benchmarks.floor import HEARTBEAT, NODE, NODE_BY_GRAPHQL_CORE, cpu_seconds
from benchmarks.measure import Exhausted, Figure, throughput
from benchmarks.results import ROUTE_ROW, Row, fmt
from benchmarks.services import HEADERS, Service
from benchmarks.writes import REGISTER

CONNECTIONS = 16
PAGE = "query Page { nodes(first: 100) { id state gpus { index healthy gpuClass } } }"
STRAWBERRY = "Strawberry's view alone (INVENTORY_FAST_PATH=false)"

Worker = Callable[[], Awaitable[int]]


@dataclass
class Side:
    """One process and what its rounds measured for one route."""

    service: Service
    rate: Figure = field(default_factory=Figure)
    cpu: Figure = field(default_factory=Figure)  # ms per request
    # PostgreSQL's CPU per request, ms: a route may move work there (the
    # page route has PostgreSQL build the JSON). The rounds run one at a
    # time, so the server's CPU in a round is that round's.
    postgres: Figure = field(default_factory=Figure)
    failures: int = 0


async def _round(bench: Bench, side: Side, workers: Callable[[list[Connection]], list[Worker]],
                 seconds: float, record: bool = True) -> None:  # fmt: skip
    connections = [Connection(side.service.url, HEADERS) for _ in range(CONNECTIONS)]
    before = cpu_seconds(side.service.pid)
    postgres_before = bench.postgres_cpu()
    try:
        rate, failed = await throughput(workers(connections), seconds)
    finally:
        await close_all(connections)
    if not record:
        return
    used = cpu_seconds(side.service.pid) - before
    postgres = bench.postgres_cpu() - postgres_before
    side.rate.add(rate)
    side.failures += failed
    if rate:
        side.cpu.add(used / (rate * seconds) * 1000)
        if postgres == postgres:  # not nan: the server runs on this machine
            side.postgres.add(postgres / (rate * seconds) * 1000)


def _cycling(bodies: list[bytes]) -> Callable[[list[Connection]], list[Worker]]:
    def workers(connections: list[Connection]) -> list[Worker]:
        return [cycling(c, bodies[i::CONNECTIONS] or bodies) for i, c in enumerate(connections)]

    return workers


def _places(prefix: str) -> Callable[[list[Connection]], list[Worker]]:
    """Workers placing one GPU each under new replica ids, until no GPU of the class is free."""
    counter = itertools.count()

    def workers(connections: list[Connection]) -> list[Worker]:
        def worker(connection: Connection) -> Worker:
            async def call() -> int:
                replica = f"bench-{prefix}-{next(counter)}"
                body = request_body(
                    PLACE,
                    {"input": {"replicaId": replica, "gpuClass": PLACE_CLASS, "gpusPerShard": 1}},
                )
                answer = await connection.graphql(body)
                if answer["data"]["place"]["__typename"] != "Allocated":
                    raise Exhausted
                return 1

            return call

        return [worker(c) for c in connections]

    return workers


async def _released(bench: Bench, route: str) -> int:
    """After a round of places: double bookings and wrong pools found, the places released."""
    return await check_and_release(bench) if route == "place" else 0


async def measure_routes(bench: Bench) -> int:
    """Each route's rate and CPU per request, fast path against Strawberry's view; wrong results."""
    ids = [node_id(i) for i in range(min(bench.size, 1024))]
    indices = list(range(min(bench.size, 1024)))
    routes: list[tuple[str, str, Callable[[str], Callable[[list[Connection]], list[Worker]]]]] = [
        ("heartbeat", "the agents' beat",
         lambda _: _cycling([request_body(HEARTBEAT, {"id": n}) for n in ids])),
        ("registration", "an unchanged report", lambda _: _cycling(
            [request_body(REGISTER, {"input": node_input(i, bench.versions.get(i, 0))})
             for i in indices])),
        ("place", f"1 GPU of {PLACE_CLASS}", _places),
        ("page", "100 nodes with their GPUs", lambda _: _cycling([request_body(PAGE)])),
        ("node", "one node with its GPUs",
         lambda _: _cycling([request_body(NODE, {"id": n}) for n in ids])),
        ("graphql_core", "that node with a directive no compiled route takes",
         lambda _: _cycling([request_body(NODE_BY_GRAPHQL_CORE, {"id": n}) for n in ids])),
    ]  # fmt: skip
    rounds = 1 if bench.quick else bench.rounds
    wrong = 0
    fast = Service(bench.url, {"INVENTORY_FAST_PATH": "true"})
    strawberry = Service(bench.url, {"INVENTORY_FAST_PATH": "false"})
    fast.start()
    strawberry.start()
    try:
        for route, what, workload in routes:
            sides = {"fast": Side(fast), "strawberry": Side(strawberry)}
            # Warm: each process's pool opens its connections on first use.
            for name, side in sides.items():
                await _round(bench, side, workload(f"warm-{route}-{name}"), 0.3, record=False)
                wrong += await _released(bench, route)
            for r in range(rounds):
                # Alternately, so that a busier moment weighs on both.
                for name, side in sides.items():
                    await _round(bench, side, workload(f"{route}-{name}-{r}"), bench.seconds)
                    wrong += await _released(bench, route)
            on, off = sides["fast"], sides["strawberry"]
            note = (
                f"PostgreSQL's CPU per request: fast path {fmt(on.postgres.median)} ms, "
                f"Strawberry's view {fmt(off.postgres.median)} ms; rate: fast path "
                f"{fmt(on.rate.median)}/s, Strawberry's view {fmt(off.rate.median)}/s; "
                f"{CONNECTIONS} connections, 1 process each"
            )
            if on.failures or off.failures:
                note += f"; {on.failures + off.failures} failed requests"
            bench.results.add(
                Row(bench.size, f"{ROUTE_ROW}{route} route: {what}", "ms CPU/request", on.cpu,
                    STRAWBERRY, off.cpu, "", note, better="lower")
            )  # fmt: skip
    finally:
        fast.stop()
        strawberry.stop()
    return wrong
