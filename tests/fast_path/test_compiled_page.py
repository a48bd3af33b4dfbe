"""A page of nodes built as JSON by PostgreSQL reads exactly like the one graphql-core builds.

Each request goes to the service (direct execution on: a page of supported
fields is compiled, service/graphql/fast/compiled_page.py) and to Strawberry's own
view on the same database; the answers must be equal, and the compiled one
must have been one SQL statement.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks.floor import NODE as BENCH_NODE
from benchmarks.floor import NODE_BY_GRAPHQL_CORE
from benchmarks.questions import FILTERED as BENCH_FILTERED
from benchmarks.questions import PAGE as BENCH_PAGE
from service.ctl.nodes import NODE as CTL_NODE
from service.database import connections
from service.graphql.fast import json_pages
from service.graphql.private_api import core_schema
from service.graphql.schema import schema
from service.metrics import COUNTERS
from service.scheduling.gpu_pools import refresh_pools
from tests.support.reports import (
    A100,
    ALLOCATE,
    GB,
    H100,
    REGISTER,
    allocation,
    gpus,
    node_input,
    shard,
)
from tests.support.statements import StatementCounter
from tests.support.topology import bridged_pairs, hgx_h100, no_nvlink

# Every field the compiled page can build, under aliases, with __typename.
EVERYTHING = """
query Page($first: Int, $after: ID) {
  page: nodes(first: $first, after: $after) {
    __typename id name: hostname mgmtAddr memoryTotalMb state stateReason stateChangedBy
    schedulable agentVersion knowsItsWeights lastSeen registeredAt
    nvlinkGroups largestFreeNvlinkGroup
    labels { __typename key value } engineVersions { name: key value }
    localDisk { __typename freeBytes totalBytes } sharedDisk { freeBytes free: freeBytes }
    gpus { __typename index uuid pciBusId name gpuClass memoryMb healthy healthReasons
           nvlinkPeers nvlinkGroup
           allocation { shardId replicaId nodeId gpuIndices fabric hcas createdAt } }
    storage { id mountPoint fsType shared freeBytes totalBytes directories }
    allocations { __typename shardId replicaId nodeId gpuIndices fabric hcas createdAt }
    fabrics { fabric hcas rateGbps }
    weights { path sizeBytes revision state totalBytes digest observedAt pinnedBy }
  }
}
"""

# The schedulers' question, with every node field the page builds.
FREE = """
query Free($cls: String, $fabric: String, $min: Int, $first: Int, $after: ID) {
  freeGpus(gpuClass: $cls, fabric: $fabric, minFree: $min, first: $first, after: $after) {
    __typename gpuIndices
    node { id hostname state schedulable localDisk { freeBytes } fabrics { fabric hcas }
           gpus { index healthy allocation { shardId } } allocations { shardId gpuIndices } }
  }
}
"""


async def post(client: httpx.AsyncClient, query: str, variables: dict[str, Any]) -> Any:
    response = await client.post("/graphql", json={"query": query, "variables": variables})
    assert response.status_code == 200, response.text
    return response.json()


async def both_ways(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    counter: StatementCounter,
    query: str,
    variables: dict[str, Any] | None = None,
) -> tuple[Any, int]:
    """The answer (equal both ways, keys in the same order) and the compiled side's page reads."""
    before = counter.count
    compiled = await post(both[0], query, variables or {})
    # Reads of the inventory (not the token check, not the notices of earlier writes).
    statements = sum(
        1
        for sql in counter.statements[before:]
        if "api_tokens" not in sql and "pg_notify" not in sql
    )
    reference = await post(both[1], query, variables or {})
    assert json.dumps(_without_request_ids(compiled)) == json.dumps(_without_request_ids(reference))
    return compiled, statements


def _without_request_ids(body: Any) -> Any:
    """The body but the request id of a masked error, which differs by design."""
    for error in body.get("errors") or ():
        error.get("extensions", {}).pop("requestId", None)
    return body


async def a_varied_cluster(api: Any, engine: AsyncEngine) -> None:
    """Nodes that exercise every value: nulls, unhealthy GPUs, shared disks, shards, states."""
    full = node_input(
        "gpu-01",
        memoryTotalMb=2_000_000,
        gpus=[*gpus(A100, 3),
              {"index": 3, "name": "NVIDIA A100-SXM4-40GB", "healthy": False,
               "pciBusId": "00000000:18:00.0", "healthReasons": ["ecc_uncorrected", "xid_79"]}],
        fabrics=[{"fabric": "ib-b", "hcas": ["mlx5_2"], "rateGbps": 200},
                 {"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}],
        storage=[
            {"id": "nfs:1", "mountPoint": "/mnt/models", "fsType": "nfs4", "shared": True,
             "freeBytes": 9000 * GB, "totalBytes": 10000 * GB},
            {"id": "dev:259:1", "mountPoint": "/data", "fsType": "xfs", "shared": False,
             "freeBytes": 500 * GB, "totalBytes": 2000 * GB,
             "directories": ["/data/models", "/data/cache"]},
        ],
        weights=[{"path": "/data/models/llama-3-70b", "sizeBytes": 140 * GB,
                  "state": "DOWNLOADING", "totalBytes": 150 * GB, "revision": "main",
                  "digest": "sha256:" + "0f" * 32},
                 {"path": "/data/models/a \"quoted\" näme"}],
        agentVersion="1.4.0",
        # Keys Python and a collation would sort differently: by code point here.
        labels=[{"key": "zone", "value": "eu-1"}, {"key": "team", "value": "serving"},
                {"key": "Zone", "value": "é"}, {"key": "équipe", "value": "x"},
                {"key": "_a", "value": ""}, {"key": "z-1", "value": "\"quoted\""},
                {"key": "ß", "value": "\u00e9\u2603"}],
        engineVersions=[{"key": "vllm", "value": "0.6.3"}, {"key": "sglang", "value": "0.4"}],
    )  # fmt: skip
    await api(REGISTER, {"input": full})
    # Nothing known: no memory, disk, fabrics, weights or agent version; no NVLink.
    await api(REGISTER, {"input": node_input("gpu-02", gpus=no_nvlink(H100, 2))})
    # One NVSwitch board (nvlinkGroups "NVLink 8"); gpu-04 bridged pairs.
    await api(REGISTER, {"input": node_input("gpu-03", gpus=hgx_h100(near=False))})
    await api(REGISTER, {"input": node_input("gpu-04", gpus=bridged_pairs(2))})
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE nodes SET liveness = 'lost', liveness_reason = 'no heartbeat for 10m'"
                " WHERE id = 'gpu-04'"
            )
        )
        # Timestamps of each shape the DateTime scalar writes: whole seconds
        # (no fraction), a fraction ending in zeros, one microsecond.
        await conn.execute(
            text(
                "UPDATE nodes SET registered_at = CASE id"
                " WHEN 'gpu-01' THEN timestamptz '2026-01-02 03:04:05+00'"
                " WHEN 'gpu-02' THEN timestamptz '2026-01-02 03:04:05.12+01'"
                " ELSE timestamptz '2026-01-02 03:04:05.000001-03:30' END,"
                " last_seen = date_trunc('second', last_seen)"
                " WHERE id IN ('gpu-01', 'gpu-02', 'gpu-03')"
            )
        )
        # As the liveness sweep does: a lost node's GPUs are no longer free.
        await refresh_pools(conn, ["gpu-04"])
    # A shard whose indices were given out of order, and a second one.
    two = await api(ALLOCATE, allocation("r1", shard("r1-s0", "gpu-01", 2, 0)))
    assert two["allocate"]["__typename"] == "Allocated"
    one = await api(ALLOCATE, allocation("r2", shard("r2-s0", "gpu-03", 5)))
    assert one["allocate"]["__typename"] == "Allocated"
    async with engine.begin() as conn:
        # r1 pins the weights, as a place with `weights` would (Weights.pinnedBy).
        await conn.execute(
            text("UPDATE shards SET weights = '/data/models/llama-3-70b' WHERE replica_id = 'r1'")
        )
    await api('mutation { cordonNode(id: "gpu-03", reason: "burn-in") { id } }')


async def test_every_supported_field_reads_the_same_built_by_postgresql(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    api: Any,
    engine: AsyncEngine,
    count_statements: StatementCounter,
) -> None:
    await a_varied_cluster(api, engine)

    answer, statements = await both_ways(both, count_statements, EVERYTHING)
    assert statements == 1  # the whole page, details included, in one statement
    page = answer["data"]["page"]
    assert [n["id"] for n in page] == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    first = page[0]
    assert first["gpus"][0]["allocation"]["gpuIndices"] == [0, 2]  # sorted, as stored records are
    assert first["gpus"][1]["allocation"] is None
    assert [f["fabric"] for f in first["fabrics"]] == ["ib-a", "ib-b"]
    assert first["localDisk"] == {"__typename": "Disk", "freeBytes": 500 * GB,
                                  "totalBytes": 2000 * GB}  # fmt: skip
    assert page[1]["localDisk"] is None and page[1]["memoryTotalMb"] is None
    assert page[2]["state"] == "CORDONED" and page[2]["stateReason"] == "burn-in"
    assert page[3]["state"] == "LOST" and page[3]["stateReason"] == "no heartbeat for 10m"
    # Timestamps as the DateTime scalar writes them: UTC, six digits or none.
    assert [n["registeredAt"] for n in page[:3]] == [
        "2026-01-02T03:04:05+00:00",
        "2026-01-02T02:04:05.120000+00:00",
        "2026-01-02T06:34:05.000001+00:00",
    ]
    assert all("." not in n["lastSeen"] for n in page[:3])  # whole seconds
    # Topology's words and widths: unknown, none, one board (GPU 5 held), a pair.
    assert [(n["nvlinkGroups"], n["largestFreeNvlinkGroup"]) for n in page] == [
        ("unknown", None), ("none", 1), ("NVLink 8", 7), ("NVLink 2", 2)
    ]  # fmt: skip

    # Paged: first and after, as variables.
    second, statements = await both_ways(
        both, count_statements, EVERYTHING, {"first": 2, "after": "gpu-01"}
    )
    assert statements == 1
    assert [n["id"] for n in second["data"]["page"]] == ["gpu-02", "gpu-03"]

    # The benchmark's page, and an empty one.
    await both_ways(both, count_statements, BENCH_PAGE, {"first": 1000})
    empty, _ = await both_ways(both, count_statements, EVERYTHING, {"after": "gpu-99"})
    assert empty["data"]["page"] == []


async def test_a_nodes_free_gpus_are_built_by_postgresql_from_the_one_definition(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    api: Any,
    engine: AsyncEngine,
    count_statements: StatementCounter,
) -> None:
    # The dashboard's question: Node.freeGpus without gpuClass, in the page's statement.
    await a_varied_cluster(api, engine)
    query = """{ nodes { id gpus { index } free: freeGpus { __typename index gpuClass
                                                            allocation { shardId } } } }"""
    answer, statements = await both_ways(both, count_statements, query)
    assert statements == 1
    first = answer["data"]["nodes"][0]
    free = [g["index"] for g in first["free"]]
    assert 0 not in free and 2 not in free and 1 in free  # gpu-01's 0 and 2 are held
    assert all(g["allocation"] is None for g in first["free"])


async def test_the_schedulers_free_gpu_question_reads_the_same_built_by_postgresql(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    api: Any,
    engine: AsyncEngine,
    count_statements: StatementCounter,
) -> None:
    await a_varied_cluster(api, engine)

    # The benchmark's question, with literals: one statement, nodes included.
    bench = "query Free($cls: String!) { freeGpus(gpuClass: $cls, minFree: 4, first: 50) { gpuIndices node { id } } }"
    answer, statements = await both_ways(both, count_statements, bench, {"cls": "H100-80GB"})
    assert statements == 1
    assert answer["data"]["freeGpus"] == []  # gpu-02 has 2 H100s, gpu-03 is cordoned, gpu-04 lost

    everything, statements = await both_ways(both, count_statements, FREE, {})
    assert statements == 1
    entries = everything["data"]["freeGpus"]
    # gpu-01: 3 healthy A100s, one taken by r1 (indices 0 and 2): 1 free; gpu-02: 2 H100s.
    assert [(e["node"]["id"], e["gpuIndices"]) for e in entries] == [
        ("gpu-01", [1]),
        ("gpu-02", [0, 1]),
    ]
    for variables in (
        {"cls": "A100-40GB", "fabric": "ib-a"},
        {"cls": "H100-80GB", "min": 2},
        {"min": None, "first": 1, "after": "gpu-01"},
        {"fabric": "ib-z"},
    ):
        _, statements = await both_ways(both, count_statements, FREE, variables)
        assert statements == 1

    # A node selected by its id alone is the entry's own node id (no row read
    # per entry): the same answer, aliases and __typename included.
    for query in (
        "{ freeGpus { gpuIndices node { id } } }",
        '{ f: freeGpus(first: 1, after: "gpu-01") { node { __typename nodeId: id } } }',
        "{ freeGpus { node { id hostname } } }",
    ):
        answer, statements = await both_ways(both, count_statements, query)
        assert statements == 1
        entries = next(iter(answer["data"].values()))
        assert [e["node"].get("id", e["node"].get("nodeId")) for e in entries] == (
            ["gpu-02"] if "after" in query else ["gpu-01", "gpu-02"]
        )


# A filter as one variable, the way a scheduler's client sends it.
FILTERED = """
query Filtered($filter: NodeFilter, $first: Int) {
  nodes(filter: $filter, first: $first) { id state localDisk { freeBytes } fabrics { fabric } }
}
"""


async def test_a_filtered_page_reads_the_same_built_by_postgresql(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    api: Any,
    engine: AsyncEngine,
    count_statements: StatementCounter,
) -> None:
    await a_varied_cluster(api, engine)

    # The benchmark's question: a literal filter object holding a variable.
    answer, statements = await both_ways(both, count_statements, BENCH_FILTERED, {"disk": 100 * GB})
    assert statements == 1
    # gpu-01 is on ib-a with 500 GB free; the others are on no fabric.
    assert [n["id"] for n in answer["data"]["nodes"]] == ["gpu-01"]

    expected = {
        "state: CORDONED": ({"state": "CORDONED"}, ["gpu-03"]),
        "schedulable": ({"schedulable": True}, ["gpu-01", "gpu-02"]),
        "not schedulable": ({"schedulable": False}, ["gpu-03", "gpu-04"]),
        "gpu class": ({"gpuClass": "A100-40GB"}, ["gpu-01"]),
        "fabric": ({"fabric": "ib-b"}, ["gpu-01"]),
        "label": ({"label": {"key": "zone", "value": "eu-1"}}, ["gpu-01"]),
        "label, other value": ({"label": {"key": "zone", "value": "us-2"}}, []),
        # Nodes that were not asked to look for weights are not excluded.
        "weights": ({"hasWeights": "/data/models/llama-3-70b"}, ["gpu-01", "gpu-02", "gpu-03",
                                                                 "gpu-04"]),
        # Unknown disk is not a full disk: only gpu-01's known 500 GB is too little.
        "disk": ({"minLocalDiskFree": 600 * GB}, ["gpu-02", "gpu-03", "gpu-04"]),
        "several": ({"schedulable": True, "gpuClass": "H100-80GB", "minLocalDiskFree": 0},
                    ["gpu-02"]),
        "empty filter": ({}, ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]),
        "null filter": (None, ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]),
    }  # fmt: skip
    for case, (node_filter, ids) in expected.items():
        answer, statements = await both_ways(
            both, count_statements, FILTERED, {"filter": node_filter}
        )
        assert statements == 1, case
        assert [n["id"] for n in answer["data"]["nodes"]] == ids, case

    # Paged through a filter.
    answer, _ = await both_ways(
        both, count_statements, FILTERED, {"filter": {"schedulable": False}, "first": 1}
    )
    assert [n["id"] for n in answer["data"]["nodes"]] == ["gpu-03"]


@pytest.mark.parametrize(
    "query, variables",
    [
        # Filters graphql-core refuses: its errors, word for word.
        (FILTERED, {"filter": {"state": "SLEEPY"}}),
        (FILTERED, {"filter": {"minLocalDiskFree": -1}}),
        (FILTERED, {"filter": {"minLocalDiskFree": "5"}}),
        (FILTERED, {"filter": {"minLocalDiskFree": True}}),
        (FILTERED, {"filter": {"fabrik": "ib-a"}}),
        (FILTERED, {"filter": {"label": {"key": "zone"}}}),
        (FILTERED, {"filter": "fabric=ib-a"}),
        (FILTERED, {"filter": {"schedulable": True}, "first": 0}),
        (BENCH_FILTERED, {}),
        (BENCH_FILTERED, {"disk": None}),
        (BENCH_FILTERED, {"disk": 2**63}),
        ("{ nodes(filter: {state: SLEEPY}) { id } }", {}),
        ('{ nodes(filter: {schedulable: true, fabric: "ib-a"}) { id labels { key } } }', {}),
        ("{ nodes { id engineVersions { key value } } }", {}),
        # The schedulers' question with what graphql-core must judge or build.
        ("{ freeGpus(minFree: 0) { gpuIndices } }", {}),
        ("query($min: Int) { freeGpus(minFree: $min) { gpuIndices } }", {"min": 1.5}),
        ('{ freeGpus { node { id freeGpus(gpuClass: "A100-40GB") { index } } } }', {}),
        # Built by the page since 4 December (timestamps, key-value lists): alike.
        ("{ freeGpus { node { id registeredAt } } }", {}),
        ("{ nodes { id labels { key value } engineVersions { key, v: value } } }", {}),
        ("{ nodes { id lastSeen } }", {}),
        # Fields the page does not build: graphql-core answers, as before.
        ('{ nodes { id freeGpus(gpuClass: "H100-80GB") { index } } }', {}),
        ("query($on: Boolean!) { nodes { id gpus @include(if: $on) { index } } }", {"on": False}),
        ("{ nodes { id ...F } } fragment F on Node { hostname }", {}),
        ("{ nodes { id id } }", {}),
        # Arguments graphql-core must judge: out of range, wrong type, missing.
        ("{ nodes(first: 0) { id } }", {}),
        ("query($first: Int) { nodes(first: $first) { id } }", {"first": 5000}),
        ("query($first: Int) { nodes(first: $first) { id } }", {"first": "2"}),
        ("query($first: Int!) { nodes(first: $first) { id } }", {}),
        ("query($after: ID) { nodes(after: $after) { id } }", {"after": 7}),
        # One node by id: what graphql-core must judge or build.
        # An ID sent as a number, null, left out, or a text PostgreSQL cannot store.
        (BENCH_NODE, {"id": 3}),
        (BENCH_NODE, {"id": None}),
        (BENCH_NODE, {}),
        (BENCH_NODE, {"id": "gpu\x0001"}),
        ("{ node(id: 3) { id } }", {}),
        ('query($id: ID = "gpu-01") { node(id: $id) { id } }', {}),
        ("query($id: ID!) { node(id: $id) { id labels { key key } } }", {"id": "gpu-01"}),
        ('{ node(id: "gpu-01") { id freeGpus(gpuClass: "A100-40GB") { index } } }', {}),
        ('{ node(id: "gpu-01") { ...F } } fragment F on Node { id }', {}),
        ('{ node(id: "gpu-01") { id hcasFor(fabric: "ib-a") } }', {}),
        ('{ node(id: "gpu-01") { id } nodes { id } }', {}),
        ("query($id: ID!) { node(id: $id) { id } }", {"id": ["gpu-01"]}),
    ],
)
async def test_anything_else_is_answered_as_before(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    api: Any,
    engine: AsyncEngine,
    count_statements: StatementCounter,
    query: str,
    variables: dict[str, Any],
) -> None:
    await a_varied_cluster(api, engine)
    await both_ways(both, count_statements, query, variables)


async def test_a_caller_without_the_role_is_refused_the_same_way(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    api: Any,
    engine: AsyncEngine,
    api_as: Any,
) -> None:
    await a_varied_cluster(api, engine)
    agent = await api_as("agent", node_id="gpu-01")
    assert agent.headers is not None
    answers = []
    for client in both:
        response = await client.post(
            "/graphql", json={"query": BENCH_PAGE, "variables": {"first": 10}},
            headers=agent.headers,
        )  # fmt: skip
        answers.append(response.json())
    assert answers[0] == answers[1]
    assert answers[0]["data"] is None
    assert answers[0]["errors"][0]["extensions"]["code"] == "FORBIDDEN"


# node(id), compiled (service/graphql/fast/compiled_node.py): the same selection
# as a page's node, by id.
ONE_NODE = EVERYTHING.replace(
    "query Page($first: Int, $after: ID) {", "query One($id: ID!) {"
).replace("page: nodes(first: $first, after: $after)", "one: node(id: $id)")


def answered(route: str) -> int:
    return COUNTERS.snapshot()[2].get((route, "answered", ""), 0)


async def test_one_node_by_id_reads_the_same_built_by_postgresql(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    api: Any,
    engine: AsyncEngine,
    count_statements: StatementCounter,
) -> None:
    await a_varied_cluster(api, engine)
    before = answered("node")
    for node_id in ("gpu-01", "gpu-02", "gpu-03", "gpu-04"):
        answer, statements = await both_ways(both, count_statements, ONE_NODE, {"id": node_id})
        assert statements == 1  # the node and its details in one statement
        assert answer["data"]["one"]["id"] == node_id
    # No such node: null, as the resolver answers.
    missing, statements = await both_ways(both, count_statements, ONE_NODE, {"id": "gpu-99"})
    assert missing == {"data": {"one": None}} and statements == 1
    # The benchmark's question, a literal id, and `ctl node`'s question.
    await both_ways(both, count_statements, BENCH_NODE, {"id": "gpu-03"})
    await both_ways(both, count_statements, '{ node(id: "gpu-01") { __typename id lastSeen } }')
    ctl, _ = await both_ways(both, count_statements, CTL_NODE, {"id": "gpu-01"})
    assert [label["key"] for label in ctl["data"]["node"]["labels"]] == [
        "Zone", "_a", "team", "z-1", "zone", "ß", "équipe"
    ]  # fmt: skip
    assert answered("node") - before == 8
    # The benchmark's comparison row goes to graphql-core, with the same answer.
    core = answered("graphql_core")
    await both_ways(both, count_statements, NODE_BY_GRAPHQL_CORE, {"id": "gpu-03"})
    assert (answered("node") - before, answered("graphql_core") - core) == (8, 1)
    metrics = (await both[0].get("/metrics")).text
    assert (
        'inventory_fast_path_requests_total{route="node",outcome="answered",reason=""}' in metrics
    )


async def test_looks_at_one_node_that_arrive_together_are_read_together(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    api: Any,
    engine: AsyncEngine,
    count_statements: StatementCounter,
) -> None:
    """Concurrent node(id) requests share statements (service/batches.py), each answered as
    alone: repeated and missing ids, and a batch that fails (an id PostgreSQL cannot store)
    declines to graphql-core, which answers each request as the reference does."""
    await a_varied_cluster(api, engine)

    async def together(ids: list[str]) -> tuple[list[Any], int]:
        before = count_statements.count
        answers = await asyncio.gather(*(post(both[0], BENCH_NODE, {"id": i}) for i in ids))
        reads = sum(1 for sql in count_statements.statements[before:] if "FROM nodes n" in sql)
        return answers, reads

    ids = ["gpu-01", "gpu-02", "gpu-99", "gpu-01", "gpu-03", "gpu-04", "", "gpu-02"]
    answers, reads = await together(ids)
    assert reads < len(ids)
    for node_id, answer in zip(ids, answers, strict=True):
        assert answer == await post(both[1], BENCH_NODE, {"id": node_id})
    assert [a["data"]["node"] and a["data"]["node"]["id"] for a in answers] == [
        "gpu-01", "gpu-02", None, "gpu-01", "gpu-03", "gpu-04", None, "gpu-02"
    ]  # fmt: skip

    ids = ["gpu-01", "gpu\x0001", "gpu-02"]
    answers, _ = await together(ids)
    for node_id, answer in zip(ids, answers, strict=True):
        assert _without_request_ids(answer) == _without_request_ids(
            await post(both[1], BENCH_NODE, {"id": node_id})
        )


@pytest.mark.parametrize("role", ["agent", "none"])
async def test_one_node_for_a_refused_caller_is_refused_the_same_way(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    api: Any,
    engine: AsyncEngine,
    api_as: Any,
    role: str,
) -> None:
    await a_varied_cluster(api, engine)
    headers = {"Authorization": "Bearer llmgw_not_a_token_at_all_000000"}
    if role == "agent":
        agent = await api_as("agent", node_id="gpu-01")
        headers = agent.headers
    answers = []
    for client in both:
        response = await client.post(
            "/graphql", json={"query": BENCH_NODE, "variables": {"id": "gpu-02"}}, headers=headers
        )
        answers.append((response.status_code, response.json()))
    assert answers[0] == answers[1]
    assert answers[0][1]["errors"] and not (answers[0][1].get("data") or {}).get("node")


async def test_timestamps_are_written_as_the_datetime_scalar_writes_them(
    engine: AsyncEngine,
) -> None:
    """json_pages.timestamp against the schema's own DateTime serializer, on what asyncpg
    decodes, for each shape of value and whatever the session's time zone."""
    serialize = core_schema(schema).get_type("DateTime").serialize  # type: ignore[union-attr]
    values = [
        "2026-12-04 07:58:29.123456+00", "2026-12-04 07:58:29+00", "2026-12-04 07:58:29.1+00",
        "2026-12-04 07:58:29.000001+00", "2026-03-29 01:30:00.5+01", "1850-03-01 12:00:00+00",
        "0999-01-01 00:00:00.25+00", "infinity", "-infinity",
    ]  # fmt: skip
    expression = json_pages.timestamp("t.at")
    for zone in ("UTC", "Europe/Paris", "America/St_Johns", "Asia/Kathmandu"):
        async with connections.autocommit(engine) as conn, conn.raw.transaction():
            await conn.raw.execute(f"SET LOCAL TIME ZONE '{zone}'")
            rows = await conn.raw.fetch(
                f"SELECT t.at, {expression} AS built, to_json(t.at)::text AS to_json"
                " FROM unnest(CAST($1 AS text[])) AS v(text),"
                " LATERAL (SELECT CAST(v.text AS timestamptz) AS at) t",
                values,
            )
        assert [r["built"] for r in rows] == [serialize(r["at"]) for r in rows], zone
    # PostgreSQL's own JSON would not do: another zone, a trimmed fraction.
    assert any(json.loads(r["to_json"]) != r["built"] for r in rows)


# Fleet health's marks (issue 38): taints on nodes and GPUs, drift, open remediations,
# each GPU's recommended action; every field of each, under aliases, with __typename.
TAINT_FIELDS = "__typename key value effect source reason actor since"
HEALTH = f"""
query Health($first: Int, $after: ID) {{
  page: nodes(first: $first, after: $after) {{
    id state
    taints {{ {TAINT_FIELDS} }}
    drift {{ __typename kind expected observed since gpuIndices remediationId }}
    open: remediations {{ __typename id nodeId gpuIndices gpuClass action state scope cause
                         trigger taintKey attempts failures createdAt since }}
    gpus {{ index stickyReasons cordonReason recommendedAction
           marks: taints {{ {TAINT_FIELDS} }} }}
  }}
}}
"""
START_REMEDIATION = "mutation S($id: ID!) { startRemediation(id: $id) { state } }"
VALIDATE = "mutation V($v: ValidationInput!) { recordValidation(input: $v) { state } }"
PROFILE = "mutation P($p: HardwareProfileInput!) { setHardwareProfile(input: $p) { name } }"


def with_faults(count: int, faults: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**g, **faults.get(g["index"], {})} for g in gpus(H100, count)]


async def a_cluster_with_marks(api: Any) -> None:
    """Every kind of mark, through the API as agents and operators make them: XIDs whose
    remediations are PENDING, IN_PROGRESS, AWAITING_VALIDATION, DONE and ESCALATED; a
    driver's recovery action alone; operators' taints of each effect on GPUs and on a node,
    beside cordons and a drain; a node drifting from its hardware profile in three ways."""
    # gpu-01: XIDs 48 and 79 on GPU 3 (REBOOT_NODE, PENDING), XID 95 on GPU 5 with the
    # driver asking for a reboot (then started), XID 94 on GPU 6 (RESTART_APP: no taint, nothing sticks), the driver asking GPU 1 for a
    # reset with no XID, GPU 2 cordoned and tainted, GPU 3 tainted by an operator too.
    faults = {3: {"xids": [48, 79]}, 5: {"xids": [95], "recoveryAction": "NODE_REBOOT"},
              6: {"xids": [94]}, 1: {"recoveryAction": "GPU_RESET"}}  # fmt: skip
    await api(REGISTER, {"input": node_input("gpu-01", gpus=with_faults(8, {}), bootId="a")})
    await api(REGISTER, {"input": node_input("gpu-01", gpus=with_faults(8, faults), bootId="a")})
    listed = await api("{ remediations { id gpuIndices } }")
    [reset] = [r["id"] for r in listed["remediations"] if r["gpuIndices"] == [5]]
    await api(START_REMEDIATION, {"id": reset})
    await api('mutation { cordonGpu(nodeId: "gpu-01", index: 2, reason: "fan") { index } }')
    for indices, key, effect in (([2, 3], "burn-in", "PREFER_NO_SCHEDULE"),
                                 ([2], "dedicated", "NO_EXECUTE")):  # fmt: skip
        await api(
            "mutation T($i: [Int!]!, $t: TaintInput!) "
            '{ taintGpus(nodeId: "gpu-01", indices: $i, taint: $t) { index } }',
            {"i": indices, "t": {"key": key, "effect": effect, "reason": f'{key} "quoted"'}},
        )
    # gpu-02: XID 48 on GPU 0, a reboot (AWAITING_VALIDATION), a failed validation; XID 48
    # on GPU 1, a reboot and a pass (DONE), and again within 7 days (ESCALATED).
    await api(REGISTER, {"input": node_input("gpu-02", gpus=with_faults(8, {}), bootId="a")})
    await api(REGISTER, {"input": node_input("gpu-02", bootId="a",
                                             gpus=with_faults(8, {1: {"xids": [48]}}))})  # fmt: skip
    await api(REGISTER, {"input": node_input("gpu-02", gpus=with_faults(8, {}), bootId="b")})
    passed = {"nodeId": "gpu-02", "gpuIndices": [1], "test": "dcgm_diag", "passed": True}
    await api(VALIDATE, {"v": passed})
    await api(REGISTER, {"input": node_input("gpu-02", bootId="b",
                                             gpus=with_faults(8, {0: {"xids": [48]},
                                                                  1: {"xids": [48]}}))})  # fmt: skip
    await api(REGISTER, {"input": node_input("gpu-02", gpus=with_faults(8, {}), bootId="c")})
    failed = {"nodeId": "gpu-02", "gpuIndices": [0], "test": "dcgm_diag", "passed": False}
    await api(VALIDATE, {"v": failed})
    # gpu-03: tainted whole by an operator, and cordoned; gpu-04 draining.
    await api(REGISTER, {"input": node_input("gpu-03")})
    await api(
        'mutation { taintNode(nodeId: "gpu-03", taint: {key: "dedicated", value: "infer",'
        ' effect: NO_EXECUTE, reason: "inference only"}) { id } }'
    )
    await api('mutation { cordonNode(id: "gpu-03", reason: "kernel upgrade") { id } }')
    await api(REGISTER, {"input": node_input("gpu-04")})
    await api('mutation { drainNode(id: "gpu-04", reason: "RMA") { id } }')
    # hgx-1: a profile of eight GPUs, 2 TB and 400 Gb/s rails; it reports seven, 1 TB,
    # and a rail at 200.
    profile = {"name": "hgx", "selector": {"key": "profile", "value": "hgx"}, "gpuCount": 8,
               "hcaRateGbps": 400, "memoryTotalMb": 2_000_000}  # fmt: skip
    await api(PROFILE, {"p": profile})
    rails = [{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400},
             {"fabric": "ib-b", "hcas": ["mlx5_1"], "rateGbps": 200}]  # fmt: skip
    near = [{**g, "nearHcas": ["mlx5_0" if g["index"] < 4 else "mlx5_1"]} for g in gpus(H100, 7)]
    await api(REGISTER, {"input": node_input(
        "hgx-1", gpus=near, fabrics=rails, memoryTotalMb=1_000_000,
        labels=[{"key": "profile", "value": "hgx"}])})  # fmt: skip


async def test_fleet_health_marks_read_the_same_built_by_postgresql(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    api: Any,
    count_statements: StatementCounter,
) -> None:
    """Taints, drift, open remediations and the policy's recommended action: one statement
    per page and per node, the same JSON as Strawberry's resolvers give, on marks of every
    kind (the recommended action written by the policy itself, json_pages.recommend)."""
    await a_cluster_with_marks(api)
    before = answered("page")
    answer, statements = await both_ways(both, count_statements, HEALTH)
    assert statements == 1 and answered("page") - before == 1
    page = {n["id"]: n for n in answer["data"]["page"]}

    gpu_01 = page["gpu-01"]["gpus"]
    assert [g["recommendedAction"] for g in gpu_01] == [
        "NONE", "RESET_GPU", "NONE", "REBOOT_NODE", "NONE", "REBOOT_NODE", "NONE", "NONE"
    ]  # fmt: skip
    assert gpu_01[3]["stickyReasons"] == ["xid_48", "xid_79"]
    # The cordon first, then by key; the operator's beside the policy's.
    assert [(t["key"], t["effect"], t["source"]) for t in gpu_01[2]["marks"]] == [
        ("cordon", "NO_SCHEDULE", "OPERATOR"),
        ("burn-in", "PREFER_NO_SCHEDULE", "OPERATOR"),
        ("dedicated", "NO_EXECUTE", "OPERATOR"),
    ]
    # XID 79 joined XID 48's remediation (raising its action), with its own taint.
    assert [(t["key"], t["source"]) for t in gpu_01[3]["marks"]] == [
        ("burn-in", "OPERATOR"), ("xid-48", "XID"), ("xid-79", "XID")
    ]  # fmt: skip
    assert [(r["gpuIndices"], r["action"], r["state"]) for r in page["gpu-01"]["open"]] == [
        ([3], "REBOOT_NODE", "PENDING"), ([5], "RESET_GPU", "IN_PROGRESS"),
        ([6], "RESTART_APP", "PENDING"),
    ]  # fmt: skip
    # DONE and ESCALATED are not open; the escalated GPU keeps its taint.
    assert [(r["gpuIndices"], r["state"]) for r in page["gpu-02"]["open"]] == [
        ([0], "AWAITING_VALIDATION")
    ]
    assert page["gpu-02"]["open"][0]["failures"] == 1
    assert [t["key"] for t in page["gpu-02"]["gpus"][1]["marks"]] == ["xid-48"]
    # A node's own taints: an operator's and its cordon or drain, by key.
    assert [(t["key"], t["value"], t["effect"]) for t in page["gpu-03"]["taints"]] == [
        ("cordon", None, "NO_SCHEDULE"), ("dedicated", "infer", "NO_EXECUTE")
    ]  # fmt: skip
    assert [(t["key"], t["reason"]) for t in page["gpu-04"]["taints"]] == [("drain", "RMA")]
    assert [(d["kind"], d["gpuIndices"]) for d in page["hgx-1"]["drift"]] == [
        ("GPU_MISSING", None), ("HCA_RATE_LOW", [4, 5, 6]), ("MEMORY_LOW", None)
    ]  # fmt: skip
    assert page["gpu-04"]["drift"] == [] and page["gpu-04"]["open"] == []

    # Pages by `first`, and each node by id through the compiled node route.
    for after in (None, "gpu-02"):
        _, statements = await both_ways(
            both, count_statements, HEALTH, {"first": 2, "after": after}
        )
        assert statements == 1
    one = HEALTH.replace("query Health($first: Int, $after: ID)", "query One($id: ID!)").replace(
        "page: nodes(first: $first, after: $after)", "one: node(id: $id)"
    )
    nodes = answered("node")
    for node_id in page:
        _, statements = await both_ways(both, count_statements, one, {"id": node_id})
        assert statements == 1
    assert answered("node") - nodes == len(page)
    # The schedulers' question with its nodes' marks: the same builder, one statement.
    free = (
        "{ freeGpus(minFree: 1) { gpuIndices node { id drift { kind } remediations { state }"
        " gpus { index recommendedAction taints { key effect } } } } }"
    )
    answer, statements = await both_ways(both, count_statements, free)
    assert statements == 1
    assert "REBOOT_NODE" in json.dumps(answer)
