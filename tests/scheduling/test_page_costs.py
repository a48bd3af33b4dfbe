"""Issue 30: every scheduler-facing read costs what its page holds, whatever the planner knows.

A cluster comes up: its nodes register through registerNode, schedulers
allocate, and they ask at once, before autovacuum has analyzed anything.
The same statements must then cost what they cost after ANALYZE: a plan
that reads the cluster for a page (a nested loop that rescans the page's
GPUs per node, a hash of every pool) is a cliff that a bigger cluster turns
into a timeout. So each read a scheduler, the dashboard or ctl sends is made
through the API on a database just created and loaded through the API, and
every statement it ran is explained (EXPLAIN (ANALYZE, BUFFERS)) with its
own parameters, as the planner plans it then (a custom plan) and as it plans
it for any parameters (the generic plan a prepared statement switches to).
The rows its scans visit and the buffers it touches must stay within a
constant times the page: counts that do not depend on the machine's speed.
Then again after ANALYZE, in three allocation layouts (none, every fifth
node half allocated, the first nodes all allocated).

The cluster is small enough to load in seconds and large enough that a
statement reading every node, pool or GPU exceeds the bound several times.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
import pytest

from service.config import Settings
from service.ctl.capacity import ALLOCATIONS, GPU_CLASSES
from service.ctl.events import EVENTS
from service.ctl.nodes import NODES
from service.database import connections
from service.database.db import create_engine, dispose, libpq_url
from service.database.migrations import upgrade
from service.web.app import create_app
from tests.conftest import create_database, drop_database
from tests.reports import A100, H100, gpus, node_input

NODES_IN_CLUSTER = 1500
PAGE = 10
# A page's statements may visit this many rows per entry (a node's GPUs,
# their allocations, fabrics, pools: a few dozen) and touch this many
# buffers per entry, plus a fixed part (index descents, catalog-free
# overhead). A statement that reads every node (1,500 rows), pool or GPU
# (12,000 rows) of the cluster exceeds it.
ROWS_PER_ENTRY = 40
BUFFERS_PER_ENTRY = 30
FIXED = 150
BOUND_ROWS = ROWS_PER_ENTRY * PAGE + FIXED
BOUND_BUFFERS = BUFFERS_PER_ENTRY * PAGE + FIXED

IB = [{"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}]
REGISTER_BATCH = 50
DASHBOARD = Path(__file__).parents[2] / "service" / "static" / "dashboard.js"


def node_id(i: int) -> str:
    return f"n-{i:05d}"


def dashboard_query(name: str) -> str:
    """A query the dashboard sends, as dashboard.js spells it."""
    found = re.search(rf"const {name} = `([^`]*)`", DASHBOARD.read_text())
    assert found, name
    return found.group(1)


@dataclass(frozen=True)
class Read:
    """A read as its client sends it; `entries` is the page it asks for."""

    name: str
    query: str
    variables: dict[str, Any]
    entries: int = PAGE


MIDDLE = node_id(NODES_IN_CLUSTER // 2)
PLACE_INPUT = {"replicaId": "r-explain", "gpuClass": "H100-80GB", "gpusPerShard": 4, "shards": 2}

READS = (
    Read(
        "freeGpus by class",
        "query($after: ID) { freeGpus(gpuClass: \"H100-80GB\", minFree: 4, first: 10,"
        " after: $after) { node { id } gpuIndices } }",
        {},
    ),
    Read(
        "freeGpus by class from the middle",
        "query($after: ID) { freeGpus(gpuClass: \"H100-80GB\", minFree: 4, first: 10,"
        " after: $after) { node { id } gpuIndices } }",
        {"after": MIDDLE},
    ),
    Read(
        "freeGpus on a fabric",
        "{ freeGpus(gpuClass: \"H100-80GB\", fabric: \"ib-a\", minFree: 4, first: 10)"
        " { node { id state } gpuIndices } }",
        {},
    ),
    Read(
        "freeGpus of any class",
        "query($after: ID) { freeGpus(minFree: 4, first: 10, after: $after)"
        " { node { id } gpuIndices } }",
        {"after": MIDDLE},
    ),
    Read(
        "nodes with their free GPUs",
        "{ nodes(first: 10) { id state freeGpus { index gpuClass } } }",
        {},
    ),
    Read(
        "nodes with filters",
        "query($after: ID) { nodes(first: 10, after: $after, filter: {state: READY,"
        " schedulable: true, gpuClass: \"H100-80GB\", fabric: \"ib-a\"}) { id gpus { index } } }",
        {"after": MIDDLE},
    ),
    Read(
        "nodes by label, weights and disk",
        "query($after: ID) { nodes(first: 10, after: $after, filter: {label: {key: \"zone\","
        " value: \"a\"}, hasWeights: \"/models/x\", minLocalDiskFree: 0}) { id } }",
        {"after": MIDDLE},
    ),
    Read("ctl nodes", NODES, {"first": PAGE}),
    Read("ctl allocations", ALLOCATIONS, {"first": PAGE}),
    Read("ctl events", EVENTS, {"first": PAGE}),
    Read("allocations of a node", ALLOCATIONS, {"nodeId": node_id(5), "first": PAGE}),
    Read("events of a node", EVENTS, {"nodeId": node_id(5), "first": PAGE}),
    # Without `first` the dashboard gets the largest page (max_page_size).
    Read("dashboard nodes", dashboard_query("NODES_QUERY"), {}),
    Read("dashboard node", dashboard_query("NODE_QUERY"), {"id": MIDDLE}, entries=1),
    Read("dashboard xids", dashboard_query("XIDS_QUERY"), {"id": MIDDLE}, entries=PAGE),
    Read(
        "explainPlacement",
        "query($input: PlaceInput!) { explainPlacement(input: $input)"
        " { placeable plan { nodeId gpuCount } verdicts { nodeId code } verdictsOmitted } }",
        {"input": PLACE_INPUT},
    ),
)


def whole_cluster_reads() -> tuple[Read, ...]:
    """Reads whose answer sums or lists the whole cluster: bounded by what they answer."""
    return (
        Read("ctl gpu classes", GPU_CLASSES, {}),
        Read("dashboard summary", dashboard_query("SUMMARY_QUERY"), {}),
    )


@pytest.fixture
def fresh_database(server_url: str) -> Iterator[str]:
    """A database just created and migrated: no statistics yet, as a new cluster's."""
    url = create_database(server_url, prefix="llmgw_pages")
    upgrade(url)
    try:
        yield url
    finally:
        drop_database(server_url, url)


class Cluster:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def send(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        response = await self.client.post("/graphql", json={"query": query, "variables": variables})
        body: dict[str, Any] = response.json()
        assert "data" in body and body["data"] is not None, body
        return body

    async def register(self, ids: Sequence[int]) -> None:
        """Register nodes as agents do, many registerNode mutations to a request."""
        signature = ", ".join(f"$i{k}: NodeInput!" for k in range(len(ids)))
        fields = " ".join(f"r{k}: registerNode(input: $i{k}) {{ id }}" for k in range(len(ids)))
        variables = {f"i{k}": self.report(i) for k, i in enumerate(ids)}
        body = await self.send(f"mutation({signature}) {{ {fields} }}", variables)
        assert not body.get("errors"), body

    @staticmethod
    def report(i: int) -> dict[str, Any]:
        # Every tenth node is an A100 node, one in 97 has a sick GPU.
        model = A100 if i % 10 == 9 else H100
        entries = gpus(model)
        if i % 97 == 0:
            entries[2] = {**entries[2], "healthy": False, "healthReasons": ["ecc"]}
        return node_input(
            node_id(i),
            gpus=entries,
            fabrics=IB if i % 2 == 0 else [],
            labels=[{"key": "zone", "value": "a"}],
        )

    async def allocate(self, holds: Sequence[tuple[int, list[int]]]) -> None:
        fields = []
        variables: dict[str, Any] = {}
        for k, (i, indices) in enumerate(holds):
            shard = {"shardId": f"s-{i}", "nodeId": node_id(i), "gpuIndices": indices}
            variables[f"a{k}"] = {"replicaId": f"r-{i}", "shards": [shard]}
            fields.append(f"a{k}: allocate(input: $a{k}) {{ __typename }}")
        signature = ", ".join(f"$a{k}: AllocateInput!" for k in range(len(holds)))
        body = await self.send(f"mutation({signature}) {{ {' '.join(fields)} }}", variables)
        assert not body.get("errors"), body
        assert {v["__typename"] for v in body["data"].values()} == {"Allocated"}, body


LAYOUTS = {
    "none": lambda i: [],
    "every fifth node half allocated": lambda i: [4, 5, 6, 7] if i % 5 == 0 else [],
    "the first nodes all allocated": lambda i: list(range(8))
    if i < NODES_IN_CLUSTER // 3 and i % 97 and i % 10 != 9
    else [],
}


async def load(cluster: Cluster, layout: str) -> None:
    ids = list(range(NODES_IN_CLUSTER))
    batches = [ids[k : k + REGISTER_BATCH] for k in range(0, len(ids), REGISTER_BATCH)]
    for k in range(0, len(batches), 4):
        await asyncio.gather(*(cluster.register(b) for b in batches[k : k + 4]))
    holds = [(i, LAYOUTS[layout](i)) for i in ids]
    holds = [(i, h) for i, h in holds if h]
    for k in range(0, len(holds), REGISTER_BATCH):
        await cluster.allocate(holds[k : k + REGISTER_BATCH])


@dataclass(frozen=True)
class Cost:
    statement: str
    plan: str  # "custom" or "generic"
    rows: int
    buffers: int


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def rows_visited(plan: dict[str, Any]) -> int:
    """Rows the plan's scans produced or filtered away, over all their loops."""
    total = 0.0
    for node in _nodes(plan):
        if "Relation Name" not in node:
            continue
        per_loop = (
            node.get("Actual Rows", 0)
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
        total += per_loop * node.get("Actual Loops", 1)
    return round(total)


def buffers(plan: dict[str, Any]) -> int:
    """Shared buffers hit or read, the whole plan (a node's counts include its children's)."""
    return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))


async def explain(raw: Any, statement: str, args: Sequence[Any]) -> list[Cost]:
    costs = []
    for mode in ("force_custom_plan", "force_generic_plan"):
        await raw.execute(f"SET plan_cache_mode = {mode}")
        prepared = await raw.prepare(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}")
        result = await prepared.fetchval(*args)
        plan = (json.loads(result) if isinstance(result, str) else result)[0]["Plan"]
        costs.append(Cost(statement, mode.split("_")[1], rows_visited(plan), buffers(plan)))
        import os
        if os.environ.get("COSTS"):
            with open("/tmp/plans30.txt", "a") as f:
                f.write(f"=== {mode} {rows_visited(plan)} {buffers(plan)}\n{statement}\n{json.dumps(plan, indent=1)}\n")
    await raw.execute("RESET plan_cache_mode")
    return costs


async def costs_of(
    cluster: Cluster, raw: Any, read: Read
) -> list[Cost]:
    """Every statement `read` ran through the API, explained."""
    ran: list[tuple[str, tuple[Any, ...]]] = []

    def observe(sql: str, args: Sequence[Any]) -> None:
        if sql not in ("BEGIN", "SAVEPOINT", "COMMIT", "ROLLBACK"):
            ran.append((sql, tuple(args)))

    connections.statement_observers.append(observe)
    try:
        await cluster.send(read.query, read.variables)
    finally:
        connections.statement_observers.remove(observe)
    assert ran, read.name
    found = []
    for sql, args in ran:
        found.extend(await explain(raw, sql, args))
    import os
    if os.environ.get("COSTS"):
        for c in found:
            print(read.name, c.plan, c.rows, c.buffers, " ".join(c.statement.split())[:120])
    return found


@pytest.fixture
async def cluster_client(fresh_database: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    settings = Settings(max_page_size=PAGE)
    engine = create_engine(fresh_database, settings)
    app = create_app(settings, engine=engine)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
            yield client, libpq_url(fresh_database)
    finally:
        await dispose(engine)


def over_bound(read: Read, costs: Sequence[Cost]) -> list[str]:
    rows_bound = ROWS_PER_ENTRY * read.entries + FIXED
    buffers_bound = BUFFERS_PER_ENTRY * read.entries + FIXED
    return [
        f"{read.name} ({c.plan} plan): {c.rows} rows, {c.buffers} buffers"
        f" (bound {rows_bound}, {buffers_bound}): {' '.join(c.statement.split())[:300]}"
        for c in costs
        if c.rows > rows_bound or c.buffers > buffers_bound
    ]


@pytest.mark.parametrize("layout", list(LAYOUTS))
async def test_every_scheduler_read_costs_its_page_before_and_after_analyze(
    cluster_client: tuple[httpx.AsyncClient, str], layout: str
) -> None:
    client, dsn = cluster_client
    cluster = Cluster(client)
    await load(cluster, layout)
    raw = await asyncpg.connect(dsn)
    try:
        found: list[str] = []
        for state in ("before ANALYZE", "after ANALYZE"):
            if state == "after ANALYZE":
                await raw.execute("ANALYZE")
            for read in READS:
                found.extend(f"{state}: {o}" for o in over_bound(read, await costs_of(cluster, raw, read)))
        assert not found, "\n".join(found)
    finally:
        await raw.close()
