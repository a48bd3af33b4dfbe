"""Issue 30: every scheduler-facing read costs what its page holds, whatever the planner knows.

A cluster comes up: its nodes register through registerNode, schedulers
allocate, and they ask at once, before any table is analyzed.
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
Then again with some tables analyzed and after ANALYZE (STATES), in three
allocation layouts (none, every fifth node half allocated, the first nodes
all allocated).

The cluster is small enough to load in seconds and large enough that a
statement reading every node, pool or GPU exceeds the bound several times.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]
import httpx
import pytest
from sqlalchemy import text

from service.config import Settings
from service.ctl.capacity import ALLOCATIONS, GPU_CLASSES, SHARDS_TO_MOVE
from service.ctl.events import EVENTS
from service.ctl.nodes import NODES
from service.database import connections
from service.database.connections import compile_text
from service.database.db import create_engine, dispose, libpq_url
from service.database.migrations import upgrade
from service.scheduling.capacity import CLASS_SUMMARY, FABRIC_MEMBERS
from service.scheduling.groups import GroupRequest, GroupRole, Locality, LocalityLevel
from service.scheduling.groups.placing import requests_of
from service.scheduling.groups.reads import (
    board_census_sql,
    board_sql,
    window_size,
    window_sql,
)
from service.scheduling.placement.explanation import MAX_VERDICTS
from service.scheduling.placement.fit import census_facts_sql
from service.scheduling.placement.statements import SURVEY_COUNT, request_params
from service.scheduling.pool_census import MOST_KINDS
from service.scheduling.verdicts import PlaceRequest
from service.web.app import create_app
from tests.support.databases import create_database, drop_database
from tests.support.reports import A100, H100, gpus, node_input

NODES_IN_CLUSTER = 1500
PAGE = 10
# What one entry of a page may cost: rows its statements visit and buffers
# they touch. A node with its details (eight GPUs, their holders, fabrics,
# free GPUs, NVLink groups) costs a few dozen rows; a flat entry (a pool,
# a shard, an event, a verdict) a few. Plus a fixed part per statement
# (index descents, a few-page table hashed once). A statement that reads
# every node (1,500 rows), pool (1,500) or GPU (12,000) of the cluster for a
# page of ten exceeds it.
NODE_ENTRY = (80, 120)
FLAT_ENTRY = (10, 20)
FIXED = 150

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
    """A read as its client sends it; `entries` is the size of the page it shows."""

    name: str
    query: str
    variables: dict[str, Any]
    entries: int = PAGE
    entry: tuple[int, int] = FLAT_ENTRY  # (rows, buffers) per entry


MIDDLE = node_id(NODES_IN_CLUSTER // 2)
FREE_BY_CLASS = (
    'query($after: ID) { freeGpus(gpuClass: "H100-80GB", minFree: 4, first: 10, after: $after)'
    " { node { id } gpuIndices } }"
)
PLACE_INPUT = {"replicaId": "r-explain", "gpuClass": "H100-80GB", "gpusPerShard": 4, "shards": 2}
# 2 prefill TP-4 + 4 decode TP-2, prefill sending KV cache to decode, NODE preferred.
GROUP: dict[str, Any] = {
    "roles": [
        {"role": role, "replicas": n, "shape": {**PLACE_INPUT, "shards": 1, "gpusPerShard": per}}
        for role, n, per in (("prefill", 2, 4), ("decode", 4, 2))
    ],
    "locality": {"level": "NODE"},
    "kvFrom": "prefill",
    "kvTo": "decode",
}
# Issue 38: one node in thirteen has a GPU tainted NO_SCHEDULE (key xid-79), one in
# a hundred is tainted whole (key dedicated=infer, NO_EXECUTE), and one in
# seventeen prefers no new work on two GPUs: requests with tolerations read the
# tainted pools besides the others.
TOLERATIONS = [{"key": "xid-79", "operator": "EXISTS"}, {"key": "dedicated", "value": "infer"}]
FREE_TOLERATING = (
    'query($after: ID, $t: [TolerationInput!]) { freeGpus(gpuClass: "H100-80GB", minFree: 4,'
    " first: 10, after: $after, tolerations: $t) { node { id } gpuIndices } }"
)

# fit's shapes that the pool census counts (service/scheduling/pool_census.py).
CENSUS_SHAPES: list[dict[str, Any]] = [
    {"gpusPerShard": 8},
    {"gpusPerShard": 4, "nvlinkShards": True},
]

READS = (
    Read("freeGpus by class", FREE_BY_CLASS, {}),
    Read("freeGpus by class from the middle", FREE_BY_CLASS, {"after": MIDDLE}),
    Read(
        "freeGpus on a fabric",
        '{ freeGpus(gpuClass: "H100-80GB", fabric: "ib-a", minFree: 4, first: 10)'
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
        "{ nodes(first: 10) { id freeGpus { index } } }",
        {},
        entry=NODE_ENTRY,
    ),
    Read(
        "nodes with filters",
        "query($after: ID) { nodes(first: 10, after: $after, filter: {state: READY,"
        ' schedulable: true, gpuClass: "H100-80GB", fabric: "ib-a",'
        ' hasWeights: "/models/x", minLocalDiskFree: 0}) { id gpus { index } } }',
        {"after": MIDDLE},
        entry=NODE_ENTRY,
    ),
    Read("ctl nodes", NODES, {"first": PAGE}, entry=NODE_ENTRY),
    Read("ctl allocations", ALLOCATIONS, {"first": PAGE, "held": False}),
    Read("ctl events", EVENTS, {"first": PAGE}),
    Read("ctl stale allocations: shards to move", SHARDS_TO_MOVE, {"first": PAGE}),
    Read(
        "allocations of a node", ALLOCATIONS, {"nodeId": node_id(5), "first": PAGE, "held": False}
    ),
    Read("events of a node", EVENTS, {"nodeId": node_id(5), "first": PAGE}),
    # Without `first`, the largest page (max_page_size, PAGE here).
    Read("dashboard nodes", dashboard_query("NODES_QUERY"), {}, entry=NODE_ENTRY),
    # One node's view: its eight GPUs and their holders.
    Read(
        "dashboard node",
        dashboard_query("NODE_QUERY"),
        {"id": node_id(5)},
        entries=8,
        entry=NODE_ENTRY,
    ),
    Read("dashboard xids", dashboard_query("XIDS_QUERY"), {"id": MIDDLE}),
    Read("freeGpus tolerating taints", FREE_TOLERATING, {"t": TOLERATIONS}),
    Read(
        "freeGpus tolerating taints from the middle",
        FREE_TOLERATING,
        {"t": TOLERATIONS, "after": MIDDLE},
    ),
    Read(
        "freeGpus of any class tolerating taints",
        "query($after: ID, $t: [TolerationInput!]) { freeGpus(minFree: 4, first: 10,"
        " after: $after, tolerations: $t) { node { id } gpuIndices } }",
        {"t": TOLERATIONS, "after": MIDDLE},
    ),
    Read(
        "explainPlacement tolerating taints",
        "query($input: PlaceInput!) { explainPlacement(input: $input)"
        " { placeable plan { nodeId gpuCount } verdicts { nodeId code } verdictsOmitted } }",
        {"input": {**PLACE_INPUT, "tolerations": TOLERATIONS}},
        entries=MAX_VERDICTS,
    ),
    Read(
        "explainPlacement",
        "query($input: PlaceInput!) { explainPlacement(input: $input)"
        " { placeable plan { nodeId gpuCount } verdicts { nodeId code } verdictsOmitted } }",
        {"input": PLACE_INPUT},
        entries=MAX_VERDICTS,
    ),
    # A placement group read back: six members, a shard each, where each shard is.
    Read(
        "group",
        "query($id: ID!) { group(groupId: $id) { generation"
        " members { replicaId allocations { nodeId gpuIndices } } kvPaths { from to kind } } }",
        {"id": "pg"},
        entries=6,
        entry=NODE_ENTRY,
    ),
    # fitGroup reads the board placeGroup plans on: one pass over the class's
    # pools per role (PER_POOL), whatever the statistics.
    Read(
        "fitGroup",
        "query($g: PlaceGroupInput!) { fitGroup(group: $g) { groups limitedBy } }",
        {"g": {**GROUP, "groupId": "fit"}},
    ),
    # fit of a shape the pool census counts (CENSUS): one pass over the
    # class's entries of ix_gpu_pools_census, whatever the statistics.
    *(
        Read(
            f"fit {shape}",
            "query($s: PlaceInput!) { fit(shape: $s, first: 10)"
            " { replicas nodes { nodeId } nodesOmitted limitedBy { code nodes } } }",
            {"s": {**PLACE_INPUT, "shards": 1, **shape}},
        )
        for shape in CENSUS_SHAPES
    ),
    # gpuClasses and fabrics: answers about the whole cluster (WHOLE_CLUSTER).
    Read("ctl gpu classes", GPU_CLASSES, {}),
    Read("dashboard summary", dashboard_query("SUMMARY_QUERY"), {}),
)

# Statements whose answer sums or lists every node: bounded by one pass over
# the one narrow table they read (service/scheduling/capacity.py), not by a page.
# (As the service sends them: compile_text's numbered parameters.)
WHOLE_CLUSTER = {
    compile_text(CLASS_SUMMARY)[0]: "gpu_pools",
    compile_text(FABRIC_MEMBERS)[0]: "fabric_attachments",
    # explainPlacement's count of the class's nodes, for verdictsOmitted.
    compile_text(SURVEY_COUNT)[0]: "gpu_pools",
}
# placeGroup's and fitGroup's board (service/scheduling/groups/reads.py): per
# role, every pool of the class with its node's fabrics, NVLink domain (NODE
# falls back to NVLINK_DOMAIN) and GPUs' facts: a few rows per pool of the
# class, the same before and after ANALYZE, never a page's bound.
PER_POOL_ROWS = 16
BOARD = GroupRequest(
    "fit",
    tuple(
        GroupRole(
            r["role"], r["replicas"], PlaceRequest("", "H100-80GB", r["shape"]["gpusPerShard"])
        )
        for r in GROUP["roles"]
    ),
    Locality(LocalityLevel.NODE),
    "prefill",
    "decode",
)


def census_request(shape: dict[str, Any]) -> PlaceRequest:
    return PlaceRequest(
        "", "H100-80GB", shape["gpusPerShard"], nvlink_shards=shape.get("nvlinkShards", False)
    )


PER_POOL = {
    compile_text(text(board_sql(BOARD, request)))[0]: PER_POOL_ROWS
    for request in requests_of(BOARD).values()
}
# The same board from the pool census (what fitGroup reads for such a group):
# every kind of pool of the class with all its members.
PER_POOL.update(
    {
        compile_text(text(board_census_sql(BOARD, request)))[0]: PER_POOL_ROWS
        for request in requests_of(BOARD).values()
    }
)
# The pool census (fit's count by kind of pool): the class's index entries
# counted once, plus a few per kind of pool.
PER_POOL.update(
    {compile_text(text(census_facts_sql(census_request(shape))))[0]: 4 for shape in CENSUS_SHAPES}
)


async def window_over_bound(raw: Any) -> list[str]:
    """placeGroup's window (reads.read_window) read for BOARD: a page of its kinds of pool, whatever the cluster.

    A mutation, so not among READS: its statement is explained here with the
    parameters placeGroup sends. Each kind of pool it returns may cost one
    descent, the first window_size ids and a few lookups; nothing else.
    """
    requests = requests_of(BOARD)
    keep = window_size(requests, BOARD)
    need = min(r.gpus_per_shard for r in requests.values())
    found = []
    for request in requests.values():
        sql, names = compile_text(text(window_sql(BOARD, request)))
        params = {**request_params(request), "ids": keep, "most": MOST_KINDS + 1, "need": need}
        args = [params[n] for n in names]
        kinds = len(await raw.fetch(sql, *args))
        bound = kinds * (keep + 8) + FIXED
        for c in await explain(raw, sql, args):
            if c.rows > bound or c.buffers > bound:
                found.append(
                    f"placeGroup's window ({c.plan} plan): {c.rows} rows, {c.buffers} buffers"
                    f" for {kinds} kinds (bound {bound})"
                )
    return found


# A table this small is read whole by a plan that costs no more than index
# descents would (shards and events on a cluster with few allocations): its
# rows do not count, its buffers do.
SMALL_TABLE_PAGES = 10


@dataclass(frozen=True)
class Cost:
    statement: str
    plan: str  # "custom" or "generic"
    rows: int
    buffers: int
    tables: frozenset[str]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def rows_visited(plan: dict[str, Any], small: frozenset[str]) -> int:
    """Rows the plan's scans produced or filtered away and its joins compared, over all loops.

    Scans of the `small` tables aside (SMALL_TABLE_PAGES).
    """
    total = 0.0
    for node in _nodes(plan):
        per_loop = node.get("Rows Removed by Join Filter", 0)
        relation = node.get("Relation Name")
        if relation is not None and relation not in small:
            per_loop += (
                node.get("Actual Rows", 0)
                + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0)
            )
        total += per_loop * node.get("Actual Loops", 1)
    return round(total)


def buffers(plan: dict[str, Any]) -> int:
    """Shared buffers hit or read by the whole plan (a node's counts include its children's)."""
    return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))


async def explain(raw: Any, statement: str, args: Sequence[Any]) -> list[Cost]:
    """The statement as planned for these values, and as planned for any (generic)."""
    costs = []
    for mode in ("custom", "generic"):
        await raw.execute(f"SET plan_cache_mode = force_{mode}_plan")
        prepared = await raw.prepare(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}")
        result = await prepared.fetchval(*args)
        plan = (json.loads(result) if isinstance(result, str) else result)[0]["Plan"]
        tables = frozenset(n["Relation Name"] for n in _nodes(plan) if "Relation Name" in n)
        small = frozenset(
            await raw.fetchval(
                "SELECT coalesce(array_agg(t), '{}') FROM unnest(CAST($1 AS text[])) t"
                " WHERE pg_relation_size(t) < $2 * current_setting('block_size')::int",
                sorted(tables),
                SMALL_TABLE_PAGES,
            )
        )
        costs.append(Cost(statement, mode, rows_visited(plan, small), buffers(plan), tables))
    await raw.execute("RESET plan_cache_mode")
    return costs


class Cluster:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def send(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        response = await self.client.post("/graphql", json={"query": query, "variables": variables})
        body: dict[str, Any] = response.json()
        assert body.get("data") is not None, body
        return body

    async def register(self, ids: Sequence[int]) -> None:
        """Register nodes as agents do: registerNode, many to a request."""
        signature = ", ".join(f"$i{k}: NodeInput!" for k in range(len(ids)))
        fields = " ".join(f"r{k}: registerNode(input: $i{k}) {{ id }}" for k in range(len(ids)))
        variables = {f"i{k}": self.report(i) for k, i in enumerate(ids)}
        body = await self.send(f"mutation({signature}) {{ {fields} }}", variables)
        assert not body.get("errors"), body

    @staticmethod
    def report(i: int) -> dict[str, Any]:
        # Every tenth node is an A100 node, one in 97 has a sick GPU, every
        # other one is on the fabric. Issue 38: every other such GPU reports XID 79
        # too (a taint, a remediation) and its node has less memory than its
        # profile (BIG_PROFILE) says (drift, a taint). Few: at this size a taints
        # table of a few pages is one the planner rightly reads whole once
        # analyzed, which says nothing of a fleet's (moves.py's index is for that).
        model = A100 if i % 10 == 9 else H100
        entries = gpus(model)
        if i % 97 == 0:
            entries[2] = {**entries[2], "healthy": False, "healthReasons": ["ecc"]}
        more: dict[str, Any] = {}
        if i % 194 == 0:
            entries[2]["xids"] = [79]
            more = {"labels": [BIG_PROFILE["selector"]], "memoryTotalMb": 1_000_000}
        return node_input(node_id(i), gpus=entries, fabrics=IB if i % 2 == 0 else [], **more)

    async def taint(self, ids: Sequence[int]) -> None:
        """Taints as operators set them (TOLERATIONS' keys), many to a request."""
        fields = []
        for i in ids:
            if i % 13 == 0:
                fields.append(
                    f'g{i}: taintGpus(nodeId: "{node_id(i)}", indices: [3], taint: {{key: "xid-79",'
                    ' effect: NO_SCHEDULE, reason: "fell off the bus"}) { index }'
                )
            if i % 100 == 7:
                fields.append(
                    f'n{i}: taintNode(nodeId: "{node_id(i)}", taint: {{key: "dedicated",'
                    ' value: "infer", effect: NO_EXECUTE, reason: "inference"}) { id }'
                )
            if i % 17 == 5:
                fields.append(
                    f'p{i}: taintGpus(nodeId: "{node_id(i)}", indices: [0, 1], taint: {{key:'
                    ' "burn-in", effect: PREFER_NO_SCHEDULE, reason: "new"}) { index }'
                )
        for k in range(0, len(fields), REGISTER_BATCH):
            body = await self.send(
                "mutation { " + " ".join(fields[k : k + REGISTER_BATCH]) + " }", {}
            )
            assert not body.get("errors"), body

    async def allocate(self, holds: Sequence[tuple[int, list[int]]]) -> None:
        """Allocate as schedulers do: allocate, many to a request."""
        fields = []
        variables: dict[str, Any] = {}
        for k, (i, indices) in enumerate(holds):
            shard = {"shardId": f"s-{i}", "nodeId": node_id(i), "gpuIndices": indices}
            variables[f"a{k}"] = {"replicaId": f"r-{i}", "shards": [shard]}
            fields.append(f"a{k}: allocate(input: $a{k}) {{ __typename }}")
        signature = ", ".join(f"$a{k}: AllocateInput!" for k in range(len(holds)))
        body = await self.send(f"mutation({signature}) {{ {' '.join(fields)} }}", variables)
        assert {v["__typename"] for v in body["data"].values()} == {"Allocated"}, body

    async def costs(self, raw: Any, read: Read) -> list[Cost]:
        """Every statement `read` ran through the API, explained."""
        ran: list[tuple[str, tuple[Any, ...]]] = []

        def observe(sql: str, args: Sequence[Any]) -> None:
            # Transaction control (fit's and fitGroup's read-only transaction) costs no rows.
            if sql not in ("BEGIN", "BEGIN READ ONLY", "SAVEPOINT", "COMMIT", "ROLLBACK"):
                ran.append((sql, tuple(args)))

        connections.statement_observers.append(observe)
        try:
            await self.send(read.query, read.variables)
        finally:
            connections.statement_observers.remove(observe)
        assert ran, read.name
        found = []
        for sql, args in ran:
            found.extend(await explain(raw, sql, args))
        return found


C = TypeVar("C", bound=Cluster)


def _first_nodes_held(i: int) -> list[int]:
    # The first third of the nodes fully held (their healthy H100s).
    return list(range(8)) if i < NODES_IN_CLUSTER // 3 and i % 97 and i % 10 != 9 else []


LAYOUTS: dict[str, Callable[[int], list[int]]] = {
    "none": lambda i: [],
    "every fifth node half allocated": lambda i: [4, 5, 6, 7] if i % 5 == 0 else [],
    "the first nodes all allocated": _first_nodes_held,
}


BIG_PROFILE = {"name": "big", "selector": {"key": "profile", "value": "big"},
               "memoryTotalMb": 2_000_000}  # fmt: skip


async def load(cluster: Cluster, layout: str) -> None:
    ids = list(range(NODES_IN_CLUSTER))
    await cluster.send(
        "mutation($p: HardwareProfileInput!) { setHardwareProfile(input: $p) { name } }",
        {"p": BIG_PROFILE},
    )
    batches = [ids[k : k + REGISTER_BATCH] for k in range(0, len(ids), REGISTER_BATCH)]
    for k in range(0, len(batches), 4):
        await asyncio.gather(*(cluster.register(b) for b in batches[k : k + 4]))
    holds = [(i, LAYOUTS[layout](i)) for i in ids]
    held = [(i, h) for i, h in holds if h]
    for k in range(0, len(held), REGISTER_BATCH):
        await cluster.allocate(held[k : k + REGISTER_BATCH])
    placed = await cluster.send(
        "mutation($g: PlaceGroupInput!) { placeGroup(input: $g) { __typename } }",
        {"g": {**GROUP, "groupId": "pg"}},
    )
    assert placed["data"]["placeGroup"]["__typename"] == "GroupPlaced", placed
    await cluster.taint(ids)


@contextmanager
def unanalyzed_database(server_url: str, prefix: str) -> Iterator[str]:
    """A database just created and migrated: no statistics, as a new cluster's."""
    url = create_database(server_url, prefix=prefix)
    upgrade(url)
    try:
        yield url
    finally:
        drop_database(server_url, url)


@asynccontextmanager
async def api_on(url: str, kind: type[C], page: int) -> AsyncIterator[tuple[C, str]]:
    """The service on `url` (pages up to `page`) as a `kind` of Cluster, and a libpq DSN."""
    settings = Settings(max_page_size=page)
    engine = create_engine(url, settings)
    app = create_app(settings, engine=engine)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
            yield kind(client), libpq_url(url)
    finally:
        await dispose(engine)


@pytest.fixture
def fresh_database(server_url: str) -> Iterator[str]:
    with unanalyzed_database(server_url, "llmgw_pages") as url:
        yield url


@pytest.fixture
async def cluster(fresh_database: str) -> AsyncIterator[tuple[Cluster, str]]:
    async with api_on(fresh_database, Cluster, PAGE) as both:
        yield both


async def table_rows(raw: Any, table: str) -> int:
    count: int = await raw.fetchval(f"SELECT count(*) FROM {table}")
    return count


async def over_bound(raw: Any, read: Read, costs: Sequence[Cost]) -> list[str]:
    """What in `costs` reads more than `read`'s page allows, described."""
    found = []
    for c in costs:
        table = WHOLE_CLUSTER.get(c.statement)
        if c.statement in PER_POOL:
            pools = await table_rows(raw, "gpu_pools")
            rows_bound = buffers_bound = pools * PER_POOL[c.statement] + FIXED
            ok = c.rows <= rows_bound and c.buffers <= buffers_bound
        elif table is not None:
            # One pass over its one table.
            rows_bound = await table_rows(raw, table) + FIXED
            buffers_bound = rows_bound
            ok = c.tables == {table} and c.rows <= rows_bound
        else:
            rows_bound = read.entry[0] * read.entries + FIXED
            buffers_bound = read.entry[1] * read.entries + FIXED
            ok = c.rows <= rows_bound and c.buffers <= buffers_bound
        if not ok:
            found.append(
                f"{read.name} ({c.plan} plan): {c.rows} rows, {c.buffers} buffers of"
                f" {sorted(c.tables)} (bound {rows_bound}, {buffers_bound}):"
                f" {' '.join(c.statement.split())[:400]}"
            )
    return found


# The statistics a cluster may have when a scheduler asks: none (just
# registered), some (autovacuum analyzes a table once enough of it changed:
# the big ones first), all. Autovacuum is off for the test's tables, so each
# state is the one named, not whatever autovacuum did meanwhile.
STATES = {
    "before ANALYZE": "",
    "with only nodes and gpus analyzed": "ANALYZE nodes, gpus",
    "after ANALYZE": "ANALYZE",
}
TABLES = (
    "nodes", "gpus", "gpu_pools", "allocated_gpus", "shards", "fabric_attachments", "filesystems",
    "weights", "events", "taints", "remediations", "drift_findings",
)  # fmt: skip


@pytest.mark.parametrize("layout", list(LAYOUTS))
async def test_every_scheduler_read_costs_its_page_before_and_after_analyze(
    cluster: tuple[Cluster, str], layout: str
) -> None:
    api, dsn = cluster
    raw = await asyncpg.connect(dsn)
    try:
        for table in TABLES:
            await raw.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        await load(api, layout)
        found: list[str] = []
        for state, analyze in STATES.items():
            if analyze:
                await raw.execute(analyze)
            for read in READS:
                costs = await api.costs(raw, read)
                found.extend(f"{state}: {o}" for o in await over_bound(raw, read, costs))
            found.extend(f"{state}: {o}" for o in await window_over_bound(raw))
        assert not found, "\n".join(found)
    finally:
        await raw.close()
