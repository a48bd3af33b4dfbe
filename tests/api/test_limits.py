"""A bounded API: every oversized or abusive request gets a clear error, never a hang or a 500.

Limits and their defaults are in docs/security/limits.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
import pytest
import strawberry
from graphql import get_nullable_type, is_list_type
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.database import connections
from service.database.db import create_engine, dispose
from service.graphql.masking import MaskUnexpected
from service.graphql.schema import MAX_ALIASES, MAX_QUERY_DEPTH, MAX_TOKENS, schema
from service.web.app import create_app
from tests.support.api import Api
from tests.support.reports import H100, REGISTER, gpus, node_input


@pytest.fixture
async def strict(engine: AsyncEngine, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A service with small limits, so a test can cross them cheaply."""
    small = settings.replace(max_body_bytes=20_000, request_timeout=0.5, max_page_size=50)
    app = create_app(small, engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as c:
        yield c


def first_error(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["errors"][0]
    return error


# --- the document: depth, aliases, tokens ---------------------------------------------


async def test_an_alias_flood_is_refused_before_it_runs(api: Api) -> None:
    flood = "{ " + " ".join(f"a{i}: nodes {{ id }}" for i in range(MAX_ALIASES + 1)) + " }"
    error = await api.fails(flood)
    assert error["message"] == f"{MAX_ALIASES + 1} aliases found. Allowed: {MAX_ALIASES}"
    assert await api("{ " + " ".join(f"a{i}: nodes {{ id }}" for i in range(5)) + " }")


async def test_a_document_with_too_many_tokens_is_refused_while_parsing(api: Api) -> None:
    error = await api.fails("{ " + "__typename " * (MAX_TOKENS + 1) + "}")
    assert f"more than {MAX_TOKENS} tokens" in error["message"]


async def test_deep_nesting_is_refused(api: Api) -> None:
    # The deepest path this schema allows is far inside the depth limit
    # (MAX_QUERY_DEPTH): fabrics -> nodes -> gpus -> allocation -> shardId.
    assert await api("{ fabrics { nodes { gpus { allocation { shardId } } } } }") == {"fabrics": []}
    assert MAX_QUERY_DEPTH >= 5
    # The one way to nest without bound is introspection recursion, where each
    # level multiplies the answer by the number of types.
    recursion = (
        "{ __schema { types { fields { type { fields { type { fields { type { fields { name }"
        " } } } } } } } } }"
    )
    error = await api.fails(recursion)
    assert error["message"] == "Maximum introspection depth exceeded"


# --- page sizes -------------------------------------------------------------------------

# Lists bounded by something other than the cluster's size.
NOT_GROWING = {
    "fabrics": "one entry per fabric",
    "gpuClasses": "one entry per GPU class",
    "weightsEvictable": "one node's weights: at most reports.MAX_WEIGHTS",
    "validationsToRun": "one node's: a test per required validation of its few remediations",
    "hardwareProfiles": "one entry per profile an operator wrote",
    "tenants": "one entry per tenant an operator made (and default)",
    "disruptionBudgets": "one entry per deployment a scheduler gave a budget",
}


def test_every_root_list_that_grows_with_the_cluster_is_paged() -> None:
    query = schema._schema.query_type
    assert query is not None
    lists = [
        name for name, field in query.fields.items() if is_list_type(get_nullable_type(field.type))
    ]
    assert "nodes" in lists
    unpaged = [
        name
        for name in lists
        if name not in NOT_GROWING and not {"first", "after"} <= set(query.fields[name].args)
    ]
    assert unpaged == []


@pytest.mark.parametrize("field", ["nodes", "freeGpus", "allocations", "events", "tokens"])
async def test_a_page_larger_than_the_maximum_is_refused_naming_first(
    strict: httpx.AsyncClient, field: str
) -> None:
    if field not in schema._schema.query_type.fields:  # type: ignore[union-attr]
        pytest.skip(f"{field} is not in the schema yet")
    selection = "{ __typename }"
    response = await strict.post(
        "/graphql", json={"query": f"{{ {field}(first: 51) {selection} }}"}
    )
    error = first_error(response)
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == "first" and error["extensions"]["value"] == 51
    assert "between 1 and 50" in error["message"]


async def test_without_first_a_list_returns_at_most_the_maximum(
    strict: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    api = Api(strict)
    async with engine.begin() as conn:
        await conn.execute(text(
            "INSERT INTO nodes (id, hostname, mgmt_addr) "
            "SELECT 'n' || lpad(i::text, 3, '0'), 'h', '10.0.0.1' FROM generate_series(1, 60) i"
        ))  # fmt: skip
    # The page, and an error that says so (tests/api/test_paging.py has the whole story).
    body = await api.raw("{ nodes { id } }")
    page = body["data"]["nodes"]
    assert len(page) == 50
    assert body["errors"][0]["extensions"]["code"] == "PAGE_TRUNCATED"
    rest = (await api("query($a: ID) { nodes(after: $a) { id } }", {"a": page[-1]["id"]}))["nodes"]
    assert len(rest) == 10


async def test_a_fabrics_nodes_are_paged_too(
    strict: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    api = Api(strict)
    async with engine.begin() as conn:
        await conn.execute(text(
            "INSERT INTO nodes (id, hostname, mgmt_addr) "
            "SELECT 'n' || lpad(i::text, 3, '0'), 'h', '10.0.0.1' FROM generate_series(1, 60) i"
        ))  # fmt: skip
        await conn.execute(text(
            "INSERT INTO fabric_attachments (node_id, fabric, hcas, rate_gbps) "
            "SELECT id, 'ib-a', '{mlx5_0}', 400 FROM nodes"
        ))  # fmt: skip
    body = await api.raw("{ fabrics { nodes { id } } }")
    page = body["data"]["fabrics"][0]["nodes"]
    assert len(page) == 50
    assert body["errors"][0]["path"] == ["fabrics", 0, "nodes"]
    rest = await api("query($a: ID) { fabrics { nodes(after: $a) { id } } }", {"a": page[-1]["id"]})
    assert [n["id"] for n in rest["fabrics"][0]["nodes"]] == [f"n{i:03d}" for i in range(51, 61)]
    error = await api.fails("{ fabrics { nodes(first: 51) { id } } }")
    assert error["extensions"]["field"] == "first"


# --- the HTTP request: size, time, shape ---------------------------------------------------


async def test_an_oversized_body_gets_413_before_it_is_parsed(
    strict: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    big = node_input("gpu-07", hostname="h" * 30_000)
    response = await strict.post("/graphql", json={"query": REGISTER, "variables": {"input": big}})
    assert response.status_code == 413
    error = first_error(response)
    assert error["extensions"]["code"] == "BODY_TOO_LARGE"
    assert "20000 bytes" in error["message"] and "INVENTORY_MAX_BODY_BYTES" in error["message"]
    async with engine.connect() as conn:
        assert await conn.scalar(text("SELECT count(*) FROM nodes")) == 0


async def test_an_oversized_body_without_a_length_is_refused_too(strict: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"query": "{ nodes { id } }", "variables": {"pad": "'
        for _ in range(30):
            yield b"x" * 1000
        yield b'"}}'

    response = await strict.post(
        "/graphql", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413


async def test_a_body_trickled_in_slowly_is_stopped_by_the_time_limit(
    strict: httpx.AsyncClient,
) -> None:
    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"query": "{ nodes { id } }", "variables": {"pad": "'
        while True:  # never finishes; the service must not wait for it forever
            await asyncio.sleep(0.1)
            yield b"x"

    response = await strict.post(
        "/graphql", content=trickle(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 503
    assert first_error(response)["extensions"]["code"] == "REQUEST_TIMEOUT"


async def until_no_backend_waits_for_a_lock(conn: Any) -> None:
    """Return once no other backend of this database waits for a lock; fail after 10 s."""
    waiting = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND state = 'active'"
    )
    for _ in range(100):
        if (await conn.execute(waiting)).scalar_one() == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("a backend still runs the stopped request's statement")


async def test_the_service_statements_stop_in_postgresql_before_the_request_limit(
    database_url: str, settings: Settings
) -> None:
    """Each statement carries a statement_timeout below the request's limit.

    Even where nothing in Python cancels it (here no request wraps the
    statement at all), PostgreSQL stops it, on both of the engine's pools.
    """
    limited = settings.replace(request_timeout=0.5)
    engine = create_engine(database_url, limited)
    try:
        async with engine.connect() as conn:
            shown = (await conn.execute(text("SHOW statement_timeout"))).scalar_one()
            assert shown == "450ms"
            assert limited.statement_timeout < limited.request_timeout
        async with connections.autocommit(engine) as native:
            with pytest.raises(asyncpg.QueryCanceledError, match="statement timeout"):
                await native.execute(text("SELECT pg_sleep(5)"))
    finally:
        await dispose(engine)


async def test_a_request_stuck_behind_a_lock_is_stopped_and_leaves_nothing(
    strict: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    api = Api(strict)
    await api(REGISTER, {"input": node_input("gpu-07")})
    async with engine.connect() as holder:
        await holder.begin()
        await holder.execute(text("SELECT 1 FROM nodes WHERE id = 'gpu-07' FOR UPDATE"))
        cordon = asyncio.create_task(strict.post("/graphql", json={
            "query": 'mutation { cordonNode(id: "gpu-07", reason: "fan") { state } }'}))  # fmt: skip
        # Others keep being answered meanwhile.
        assert await api("{ nodes { id } }") == {"nodes": [{"id": "gpu-07"}]}
        response = await cordon
        # Issue 30: stopped in PostgreSQL too, while the lock is still held:
        # no backend is left waiting to run the cordon for a gone request.
        # (This engine's statement_timeout is the default 27 s: what stops
        # it here is the request's own cancellation reaching the server.)
        await until_no_backend_waits_for_a_lock(holder)
        await holder.rollback()
    assert response.status_code == 503
    error = first_error(response)
    assert error["extensions"]["code"] == "REQUEST_TIMEOUT"
    assert "0.5s" in error["message"] and "INVENTORY_REQUEST_TIMEOUT" in error["message"]
    node = await api('{ node(id: "gpu-07") { state } }')
    assert node == {"node": {"state": "READY"}}


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b'{"query": "{ nodes { id } }"', "application/json"),  # cut short
        (b"\xff\xfe not json", "application/json"),
        (b"[1, 2, 3]", "application/json"),
        (b'{"query": 42}', "application/json"),
        (b"{}", "application/json"),
        (b"query=%7B+nodes+%7B+id+%7D+%7D", "text/plain"),
        (b"<query/>", "application/xml"),
        (b"[" * 100_000 + b"]" * 100_000, "application/json"),  # nested past the recursion limit
    ],
)
async def test_malformed_requests_get_a_clear_4xx(
    client: httpx.AsyncClient, content: bytes, content_type: str
) -> None:
    response = await client.post(
        "/graphql", content=content, headers={"Content-Type": content_type}
    )
    assert 400 <= response.status_code < 500, response.text
    assert response.text.strip(), "the refusal says why"
    assert "Traceback" not in response.text


async def test_oversized_strings_and_huge_lists_are_refused_naming_the_field(
    api: Api, engine: AsyncEngine
) -> None:
    error = await api.fails(REGISTER, {"input": node_input("gpu-07", hostname="h" * 5000)})
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == "input.hostname"
    error = await api.fails(REGISTER, {"input": node_input("gpu-07", gpus=gpus(H100, 5000))})
    assert error["extensions"]["field"] == "input.gpus"
    # A long string in a filter is only compared, never stored: it is answered.
    long_filter = '{ nodes(filter: {hasWeights: "' + "w" * 100_000 + '"}) { id } }'
    assert await api(long_filter) == {"nodes": []}
    async with engine.connect() as conn:
        assert await conn.scalar(text("SELECT count(*) FROM nodes")) == 0


async def test_deeply_nested_values_in_a_document_are_refused(api: Api) -> None:
    nested = "[" * 2000 + "]" * 2000
    error = await api.fails(f"{{ nodes(filter: {{hasWeights: {nested}}}) {{ id }} }}")
    assert "internal error" not in error["message"]


async def test_a_scalar_refusing_a_literal_is_readable_not_masked(api: Api) -> None:
    error = await api.fails("{ nodes(filter: {minLocalDiskFree: -60}) { id } }")
    assert "Bytes must be between 0 and 2^63-1, got -60" in error["message"]


async def test_a_nul_character_anywhere_is_bad_input_not_a_crash(api: Api) -> None:
    for query in ('{ nodes(after: "a\\u0000b") { id } }', '{ tokens(after: "\\u0000") { id } }'):
        error = await api.fails(query)
        assert error["extensions"]["code"] == "BAD_INPUT", error
        assert "NUL" in error["message"]


async def test_a_burst_of_abuse_does_not_stop_others_being_answered(
    client: httpx.AsyncClient, api: Api
) -> None:
    flood = "{ " + " ".join(f"a{i}: nodes {{ id }}" for i in range(500)) + " }"
    recursion = "{ __schema { types { fields { type { fields { type { fields { name } } } } } } } }"
    abuse = [
        client.post("/graphql", json={"query": flood}),
        client.post("/graphql", json={"query": "{ " + "__typename " * 20_000 + "}"}),
        client.post("/graphql", json={"query": recursion}),
        client.post(
            "/graphql", content=b"x" * (2 << 20), headers={"Content-Type": "application/json"}
        ),
        client.post(
            "/graphql", content=b'{"query": ', headers={"Content-Type": "application/json"}
        ),
    ] * 4
    normal = [api("{ nodes { id } gpuClasses { gpuClass } }") for _ in range(10)]
    answers = await asyncio.gather(*abuse, *normal)
    for response in answers[: len(abuse)]:
        assert response.status_code in (200, 400, 413), response.text[:200]
        if response.status_code == 200:
            assert response.json()["errors"][0]["message"] != "internal error"
    assert answers[len(abuse) :] == [{"nodes": [], "gpuClasses": []}] * 10


# --- unexpected failures are masked, with the request id ------------------------------------


@strawberry.type
class Broken:
    @strawberry.field
    def bug(self) -> int:
        raise KeyError("secret-internal-detail")

    @strawberry.field
    def outage(self) -> int:
        raise ConnectionRefusedError(111, "Connection refused")


class FakeContext:
    request_id = "req-1234"


def test_a_bug_is_masked_and_carries_the_request_id(caplog: pytest.LogCaptureFixture) -> None:
    broken = strawberry.Schema(query=Broken, extensions=[MaskUnexpected])
    with caplog.at_level(logging.ERROR):
        result = broken.execute_sync("{ bug }", context_value=FakeContext())
    assert result.errors is not None
    error = result.errors[0].formatted
    assert error["message"] == "internal error"
    assert error["extensions"] == {"code": "INTERNAL_ERROR", "requestId": "req-1234"}
    assert "secret-internal-detail" not in str(error)
    logged = [r for r in caplog.records if "req-1234" in r.getMessage()]
    assert logged and logged[0].exc_info is not None


def test_an_unreachable_database_is_said_plainly() -> None:
    broken = strawberry.Schema(query=Broken, extensions=[MaskUnexpected])
    result = broken.execute_sync("{ outage }", context_value=FakeContext())
    assert result.errors is not None
    error = result.errors[0].formatted
    assert error["message"] == "database unavailable; retry shortly"
    assert error["extensions"] == {"code": "DATABASE_UNAVAILABLE", "requestId": "req-1234"}
