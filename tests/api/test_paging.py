"""A list never stops short in silence (issue 22).

A scheduler that asks for free GPUs without `first` on a cluster larger than
one page gets the page and a PAGE_TRUNCATED error at that list, with the
cursor that continues; one that pages with `first`/`after` gets every entry
exactly once. The service here has a page of five, and every request goes
both to the service as deployed (direct execution, with the pages PostgreSQL
builds) and to Strawberry's view alone: the answers must be the same.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from graphql import get_nullable_type, is_list_type
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import tokens
from service.config import Settings
from service.database.connections import Connection
from service.database.transactions import in_transaction
from service.event_log.events import record_event
from service.graphql.operations.subscriptions import REPLAY_PAGE
from service.graphql.schema import schema
from service.web.app import create_app
from tests.support.api import Api
from tests.support.maintenance import SCHEDULE, at, window_input
from tests.support.reports import A100, ALLOCATE, REGISTER, allocation, gpus, node_input, shard
from tests.support.snapshots import Snapshots
from tests.support.statements import StatementCounter
from tests.support.subscriptions import subscribe

PAGE = 5
NODES = 12  # two full pages and a short one
ALLOCATED = 7  # nodes with GPUs taken: five keep all eight free, exactly a page
IB_A = [{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}]


# Placement groups placed (one GPU each, then released): more than two pages.
GROUPS = 11
RESERVATIONS = 11  # two full pages and a short one
PLACE_GROUP = "mutation P($g: PlaceGroupInput!) { placeGroup(input: $g) { __typename } }"


@dataclass(frozen=True)
class Listing:
    """One paged list: how to ask for it, where it sits in the answer, and each entry's cursor."""

    name: str
    query: str  # takes $first and $after
    entries: Callable[[Any], list[Any]]
    path: list[str | int]
    cursor: Callable[[Any], str]
    table: str  # what the database holds, sorted as the list is


LISTINGS = [
    Listing(
        "nodes",
        "query($first: Int, $after: ID) { nodes(first: $first, after: $after) { id } }",
        lambda data: data["nodes"],
        ["nodes"],
        lambda e: e["id"],
        "SELECT id FROM nodes ORDER BY id",
    ),
    Listing(
        "freeGpus",
        """query($first: Int, $after: ID) {
             freeGpus(gpuClass: "H100-80GB", first: $first, after: $after) {
               gpuIndices node { id } } }""",
        lambda data: data["freeGpus"],
        ["freeGpus"],
        lambda e: e["node"]["id"],
        "SELECT DISTINCT node_id FROM gpus WHERE gpu_class = 'H100-80GB' ORDER BY 1",
    ),
    Listing(
        "allocations",
        "query($first: Int, $after: ID) { allocations(first: $first, after: $after) { shardId } }",
        lambda data: data["allocations"],
        ["allocations"],
        lambda e: e["shardId"],
        "SELECT shard_id FROM shards ORDER BY shard_id",
    ),
    Listing(
        "events",
        "query($first: Int, $after: ID) { events(first: $first, after: $after) { id kind } }",
        lambda data: data["events"],
        ["events"],
        lambda e: e["id"],
        "SELECT id::text FROM events ORDER BY events.id",
    ),
    Listing(
        "tokens",
        "query($first: Int, $after: ID) { tokens(first: $first, after: $after) { id } }",
        lambda data: data["tokens"],
        ["tokens"],
        lambda e: e["id"],
        "SELECT id FROM api_tokens ORDER BY id",
    ),
    Listing(
        "groups",
        "query($first: Int, $after: ID) { groups(first: $first, after: $after) { groupId } }",
        lambda data: data["groups"],
        ["groups"],
        lambda e: e["groupId"],
        "SELECT group_id FROM placement_groups ORDER BY group_id",
    ),
    Listing(
        "shardsToMove",
        "query($first: Int, $after: ID) { shardsToMove(first: $first, after: $after) { shardId } }",
        lambda data: data["shardsToMove"],
        ["shardsToMove"],
        lambda e: e["shardId"],
        "SELECT shard_id FROM shards ORDER BY shard_id",
    ),
    Listing(
        "remediations",
        "query($first: Int, $after: ID) { remediations(first: $first, after: $after) { id } }",
        lambda data: data["remediations"],
        ["remediations"],
        lambda e: e["id"],
        "SELECT id::text FROM remediations ORDER BY remediations.id",
    ),
    Listing(
        "maintenanceWindows",
        """query($first: Int, $after: ID) {
             maintenanceWindows(first: $first, after: $after) { id } }""",
        lambda data: data["maintenanceWindows"],
        ["maintenanceWindows"],
        lambda e: e["id"],
        "SELECT id FROM maintenance_windows ORDER BY id",
    ),
    Listing(
        "a fabric's nodes",
        """query($first: Int, $after: ID) {
             fabrics { name nodes(first: $first, after: $after) { id } } }""",
        lambda data: data["fabrics"][0]["nodes"],
        ["fabrics", 0, "nodes"],
        lambda e: e["id"],
        "SELECT node_id FROM fabric_attachments WHERE fabric = 'ib-a' ORDER BY node_id",
    ),
    Listing(
        "reservations",
        "query($first: Int, $after: ID) { reservations(first: $first, after: $after) { id } }",
        lambda data: data["reservations"],
        ["reservations"],
        lambda e: e["id"],
        "SELECT id FROM reservations ORDER BY id",
    ),
]


class Both:
    """The same request to both execution routes; the answers must be equal, key order too."""

    def __init__(self, clients: list[httpx.AsyncClient], headers: dict[str, str]) -> None:
        self.clients = clients
        self.headers = headers

    async def __call__(self, query: str, variables: dict[str, Any] | None = None) -> Any:
        answers = []
        for client in self.clients:
            response = await client.post(
                "/graphql",
                json={"query": query, "variables": variables or {}},
                headers=self.headers,
            )
            assert response.status_code == 200, response.text
            answers.append(response.json())
        assert json.dumps(answers[0]) == json.dumps(answers[1]), answers
        return answers[0]


@pytest.fixture
async def cluster(
    engine: AsyncEngine, settings: Settings, snapshots: Snapshots
) -> AsyncIterator[Both]:
    """Twelve registered nodes on ib-a, eleven allocations on seven, twelve tokens; pages of five.

    And two A100 nodes with eleven reservations (their own class: the H100 lists are unchanged).
    Built through the API by the first test that asks, copied back for the others."""
    small = settings.replace(max_page_size=PAGE)
    clients = [
        httpx.AsyncClient(
            transport=httpx.ASGITransport(
                app=create_app(small.replace(fast_path=direct), engine=engine)
            ),
            base_url="http://inventory",
        )
        for direct in (True, False)
    ]

    async def build() -> str:
        async with engine.begin() as conn:
            operator = await tokens.create_token(conn, "operator", description="test")
            for i in range(1, NODES):
                await tokens.create_token(conn, "agent", f"gpu-{i:02d}")
        api = Api(clients[0], {"Authorization": f"Bearer {operator.secret}"})
        for i in range(1, NODES + 1):
            await api(REGISTER, {"input": node_input(f"gpu-{i:02d}", fabrics=IB_A)})
        for i in range(1, NODES + 1):
            # An XID 94 on each node's last GPU: a remediation each (remediations),
            # RESTART_APP, which taints nothing, so the free GPUs stay as they were.
            report = node_input(f"gpu-{i:02d}", fabrics=IB_A)
            report["gpus"][7]["xids"] = [94]
            await api(REGISTER, {"input": report})
        for i in range(1, ALLOCATED + 1):
            node = f"gpu-{i:02d}"
            for gpu in range(1 if i > 4 else 2):
                replica = f"r{i}-{gpu}"
                placed = await api(
                    ALLOCATE, allocation(replica, shard(f"{replica}/{node}", node, gpu))
                )
                assert placed["allocate"]["__typename"] == "Allocated"
            # The held GPUs under a NO_EXECUTE taint: every shard is to move (shardsToMove).
            await api(
                "mutation T($n: ID!, $i: [Int!]!) { taintGpus(nodeId: $n, indices: $i, taint:"
                ' {key: "k", effect: NO_EXECUTE, reason: "r"}) { index } }',
                {"n": node, "i": list(range(1 if i > 4 else 2))},
            )
        for i in range(GROUPS):
            group = {
                "groupId": f"g{i:02d}",
                "roles": [
                    {"role": "r", "replicas": 1,
                     "shape": {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": 1}}
                ],
            }  # fmt: skip
            placed = await api(PLACE_GROUP, {"g": group})
            assert placed["placeGroup"]["__typename"] == "GroupPlaced"
            # Its one member released: the group stays listed, the free GPUs as they were.
            await api(f'mutation {{ releaseReplica(replicaId: "g{i:02d}-r-0") }}')
        for i in range(1, NODES):
            # A maintenance window a day ahead on each node but the last: not in
            # force, so what the other lists show stays as it was.
            await api(SCHEDULE, {"input": window_input(f"m{i:02d}", [f"gpu-{i:02d}"],
                                                       at(86_400), at(90_000))})  # fmt: skip
        # Reservations on two A100 nodes (sorted before the others, on no
        # fabric, of another class): the H100 lists stay as they were.
        for k in range(2):
            await api(REGISTER, {"input": node_input(f"a100-{k}", gpus=gpus(A100))})
        start = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        for i in range(RESERVATIONS):
            spec = {"id": f"res-{i:02d}", "count": 1, "start": start,
                    "shape": {"replicaId": "x", "gpuClass": "A100-40GB", "gpusPerShard": 1}}  # fmt: skip
            made = await api(
                "mutation R($s: ReservationInput!) { reserve(input: $s) { __typename } }",
                {"s": spec},
            )
            assert made["reserve"]["__typename"] == "Reservation", made
        return operator.secret

    try:
        secret = await snapshots.once("paging", engine, build)
        yield Both(clients, {"Authorization": f"Bearer {secret}"})
    finally:
        for client in clients:
            await client.aclose()


async def stored(engine: AsyncEngine, sql: str) -> list[str]:
    async with engine.connect() as conn:
        return [str(v) for v in (await conn.execute(text(sql))).scalars()]


def test_every_list_with_first_and_after_is_covered_here() -> None:
    """A paged list added later must join LISTINGS, so it is held to the same rule and documented."""
    paged = set()
    for type_name, graphql_type in schema._schema.type_map.items():
        for field_name, field in getattr(graphql_type, "fields", {}).items():
            if {"first", "after"} <= set(getattr(field, "args", {})):
                assert is_list_type(get_nullable_type(field.type))
                # Its description tells a client what an unpaged call answers.
                assert "PAGE_TRUNCATED" in (field.description or ""), field_name
                paged.add(f"{type_name}.{field_name}")
    assert paged == {
        "Query.nodes",
        "Query.freeGpus",
        "Query.allocations",
        "Query.events",
        "Query.tokens",
        "Query.groups",
        "Query.shardsToMove",
        "Query.remediations",
        "Query.maintenanceWindows",
        "Query.reservations",
        "Fabric.nodes",
    }
    assert len(LISTINGS) == len(paged)


@pytest.mark.parametrize("listing", LISTINGS, ids=lambda listing: listing.name)
async def test_without_first_a_long_list_answers_one_page_and_says_where_to_go_on(
    cluster: Both, engine: AsyncEngine, listing: Listing
) -> None:
    everything = await stored(engine, listing.table)
    assert len(everything) > 2 * PAGE

    # Follow the cursors the errors give, never passing `first`: each answer
    # is one page plus PAGE_TRUNCATED, until the last, short page says nothing.
    seen: list[str] = []
    after = None
    while True:
        body = await cluster(listing.query, {"after": after})
        entries = [listing.cursor(e) for e in listing.entries(body["data"])]
        seen += entries
        if len(seen) == len(everything):
            assert "errors" not in body, body["errors"]
            break
        assert len(entries) == PAGE
        (error,) = body["errors"]
        assert error["path"] == listing.path
        assert error["extensions"] == {
            "code": "PAGE_TRUNCATED",
            "after": entries[-1],
            "pageSize": PAGE,
        }
        assert "first" in error["message"] and "after" in error["message"]
        after = error["extensions"]["after"]
    assert seen == everything


@pytest.mark.parametrize("listing", LISTINGS, ids=lambda listing: listing.name)
@pytest.mark.parametrize("first", [1, 3, PAGE])
async def test_paging_with_first_returns_every_entry_exactly_once_and_no_error(
    cluster: Both, engine: AsyncEngine, listing: Listing, first: int
) -> None:
    seen: list[str] = []
    after = None
    while True:
        body = await cluster(listing.query, {"first": first, "after": after})
        assert "errors" not in body, body["errors"]
        entries = [listing.cursor(e) for e in listing.entries(body["data"])]
        if not entries:
            break
        assert len(entries) <= first
        seen += entries
        after = entries[-1]
    assert seen == await stored(engine, listing.table)


async def test_a_list_that_fits_in_one_page_says_nothing(cluster: Both) -> None:
    # Exactly a page: five nodes kept all eight GPUs.
    full = await cluster('{ freeGpus(gpuClass: "H100-80GB", minFree: 8) { node { id } } }')
    assert full == {"data": {"freeGpus": [{"node": {"id": f"gpu-{i:02d}"}} for i in range(8, 13)]}}
    # The last page after a cursor, and a filter that leaves a few.
    assert "errors" not in await cluster('{ nodes(after: "gpu-08") { id } }')
    one = await cluster('{ allocations(nodeId: "gpu-06") { shardId } }')
    assert one == {"data": {"allocations": [{"shardId": "r6-0/gpu-06"}]}}


async def test_the_pages_postgresql_builds_say_so_from_the_same_statement(
    cluster: Both, count_statements: StatementCounter
) -> None:
    """nodes and freeGpus on the fast route: one statement reads the page and what follows it."""
    direct = cluster.clients[0]
    for query, field in [
        ("{ nodes { id hostname } }", "nodes"),
        ('{ freeGpus(gpuClass: "H100-80GB") { gpuIndices node { id } } }', "freeGpus"),
    ]:
        before = count_statements.count
        response = await direct.post("/graphql", json={"query": query}, headers=cluster.headers)
        reads = [
            sql
            for sql in count_statements.statements[before:]
            if "api_tokens" not in sql and "pg_notify" not in sql
        ]
        assert len(reads) == 1 and "json_agg" in reads[0], reads
        body = response.json()
        assert len(body["data"][field]) == PAGE
        assert body["errors"][0]["extensions"]["code"] == "PAGE_TRUNCATED"


async def test_an_after_that_names_nothing_continues_from_where_it_would_sort(
    cluster: Both,
) -> None:
    body = await cluster('{ nodes(first: 2, after: "gpu-05x") { id } }')
    assert body == {"data": {"nodes": [{"id": "gpu-06"}, {"id": "gpu-07"}]}}
    body = await cluster('{ nodes(after: "gpu-01x") { id } }')
    assert [n["id"] for n in body["data"]["nodes"]] == [f"gpu-{i:02d}" for i in range(2, 7)]
    assert body["errors"][0]["extensions"]["after"] == "gpu-06"


async def test_an_aliased_list_is_named_by_its_alias(cluster: Both) -> None:
    body = await cluster('{ free: freeGpus(gpuClass: "H100-80GB") { gpuIndices } }')
    assert len(body["data"]["free"]) == PAGE
    assert body["errors"][0]["path"] == ["free"]
    assert body["errors"][0]["locations"] == [{"line": 1, "column": 3}]
    # Two lists in one document: each says so for itself.
    body = await cluster("{ a: nodes { id } b: nodes(first: 2) { id } c: tokens { id } }")
    assert [e["path"] for e in body["errors"]] == [["a"], ["c"]]


@pytest.mark.parametrize("listing", LISTINGS, ids=lambda listing: listing.name)
@pytest.mark.parametrize("first", [0, -1, PAGE + 1])
async def test_a_first_out_of_range_is_bad_input_naming_first(
    cluster: Both, listing: Listing, first: int
) -> None:
    body = await cluster(listing.query, {"first": first})
    (error,) = body["errors"]
    assert error["extensions"] == {"code": "BAD_INPUT", "field": "first", "value": first}
    assert f"between 1 and {PAGE}" in error["message"]


async def test_a_subscriptions_catch_up_reads_every_stored_event_page_by_page(
    live_service_factory: Any, engine: AsyncEngine
) -> None:
    service = await asyncio.to_thread(live_service_factory)
    count = 2 * REPLAY_PAGE + 7  # two full pages of catch-up and a short one
    async with engine.begin() as conn:
        # Interleaved with events the subscription filters out.
        await conn.execute(
            text(
                "INSERT INTO events (kind, node_id, reason)"
                " SELECT 'cordoned', node, 'r' || i FROM generate_series(1, :n) i,"
                " unnest(ARRAY['gpu-01', 'gpu-02']) node ORDER BY i, node"
            ),
            {"n": count},
        )
    stored_ids = await stored(
        engine, "SELECT id::text FROM events WHERE node_id = 'gpu-01' ORDER BY events.id"
    )
    assert len(stored_ids) == count
    resume = 'subscription { events(nodeId: "gpu-01", after: "0") { id reason } }'
    async with subscribe(service.url, resume) as subscriber:
        received = []
        while len(received) < count and (event := await subscriber.next_event(within=30)):
            received.append(event)
        assert [e["id"] for e in received] == stored_ids
        assert [e["reason"] for e in received] == [f"r{i}" for i in range(1, count + 1)]

        # Then live ones, none repeated.
        async def work(conn: Connection) -> None:
            await record_event(conn, "uncordoned", node_id="gpu-01")

        await in_transaction(engine, work)
        live = await subscriber.next_event(within=30)
        assert live is not None and int(live["id"]) > int(stored_ids[-1])
        assert await subscriber.next_event(within=0.3) is None
