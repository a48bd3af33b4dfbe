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
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy import text

from service.ctl.capacity import ALLOCATIONS, GPU_CLASSES, SHARDS_TO_MOVE
from service.ctl.events import EVENTS
from service.ctl.nodes import NODES
from service.database.connections import compile_text
from service.scheduling.groups.placing import requests_of
from service.scheduling.groups.reads import (
    board_census_sql,
    window_size,
    window_sql,
)
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement.explanation import MAX_VERDICTS
from service.scheduling.placement.fit import census_facts_sql
from service.scheduling.placement.statements import request_params
from service.scheduling.pool_census import MOST_KINDS
from tests.support.page_costs import (
    BIG_PROFILE,
    BOARD,
    FIXED,
    GROUP,
    PAGE,
    PER_POOL,
    PER_POOL_ROWS,
    PLACE_INPUT,
    REGISTER_BATCH,
    Cluster,
    Read,
    Template,
    Templates,
    api_on,
    as_built,
    dashboard_query,
    explain,
    no_autovacuum,
    node_id,
    over_bound,
)

# The three layouts share one cluster as registered (page_cost_templates): one
# worker builds it and runs them (pytest-xdist's --dist loadgroup).
pytestmark = pytest.mark.xdist_group("page_costs_reads")

NODES_IN_CLUSTER = 1500
# What one entry of a page may cost: rows its statements visit and buffers
# they touch. A node with its details (eight GPUs, their holders, fabrics,
# free GPUs, NVLink groups) costs a few dozen rows; a flat entry (a pool,
# a shard, an event, a verdict) a few. Plus a fixed part per statement
# (index descents, a few-page table hashed once). A statement that reads
# every node (1,500 rows), pool (1,500) or GPU (12,000) of the cluster for a
# page of ten exceeds it.
NODE_ENTRY = (80, 120)


MIDDLE = node_id(NODES_IN_CLUSTER // 2)
FREE_BY_CLASS = (
    'query($after: ID) { freeGpus(gpuClass: "H100-80GB", minFree: 4, first: 10, after: $after)'
    " { node { id } gpuIndices } }"
)
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


def census_request(shape: dict[str, Any]) -> PlaceRequest:
    return PlaceRequest(
        "", "H100-80GB", shape["gpusPerShard"], nvlink_shards=shape.get("nvlinkShards", False)
    )


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


def _first_nodes_held(i: int) -> list[int]:
    # The first third of the nodes fully held (their healthy H100s).
    return list(range(8)) if i < NODES_IN_CLUSTER // 3 and i % 97 and i % 10 != 9 else []


LAYOUTS: dict[str, Callable[[int], list[int]]] = {
    "none": lambda i: [],
    "every fifth node half allocated": lambda i: [4, 5, 6, 7] if i % 5 == 0 else [],
    "the first nodes all allocated": _first_nodes_held,
}


async def registered(url: str) -> None:
    """What every layout starts from, built once (page_cost_templates): autovacuum off for
    TABLES, the hardware profile set and the cluster's nodes registered, through the API."""
    async with api_on(url, Cluster, PAGE) as (cluster, dsn):
        raw = await asyncpg.connect(dsn)
        try:
            await no_autovacuum(raw, TABLES)
        finally:
            await raw.close()
        await cluster.send(
            "mutation($p: HardwareProfileInput!) { setHardwareProfile(input: $p) { name } }",
            {"p": BIG_PROFILE},
        )
        ids = list(range(NODES_IN_CLUSTER))
        batches = [ids[k : k + REGISTER_BATCH] for k in range(0, len(ids), REGISTER_BATCH)]
        for k in range(0, len(batches), 4):
            await asyncio.gather(*(cluster.register(b) for b in batches[k : k + 4]))


async def load(cluster: Cluster, layout: str) -> None:
    """The layout's allocations, a placement group and the operators' taints, on a clone of `registered`."""
    ids = list(range(NODES_IN_CLUSTER))
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


@pytest.fixture
def case_database(page_cost_templates: Templates) -> Iterator[tuple[str, Template]]:
    with page_cost_templates.clone("reads", registered) as both:
        yield both


@pytest.fixture
async def cluster(
    case_database: tuple[str, Template],
) -> AsyncIterator[tuple[Cluster, str, Template]]:
    url, template = case_database
    async with api_on(url, Cluster, PAGE) as (api, dsn):
        yield api, dsn, template


# The statistics a cluster may have when a scheduler asks: none (just
# registered), some (autovacuum analyzes a table once enough of it changed:
# the big ones first), all. Autovacuum is off for the test's tables, so each
# state is the one named, not whatever autovacuum did meanwhile (no_autovacuum).
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
    cluster: tuple[Cluster, str, Template], layout: str
) -> None:
    api, dsn, template = cluster
    raw = await asyncpg.connect(dsn)
    try:
        await as_built(raw, template)
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
