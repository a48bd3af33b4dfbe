"""A value the schema refuses is BAD_INPUT naming where it was; event kinds are a closed set.

Through both execution routes (`both`: the direct executor, Strawberry's view):
the same request must get the same code and field whichever runs it.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections
from service.event_log.events import EVENT_KINDS, record_event
from tests.support.api import Api
from tests.support.reports import ALLOCATE, GB, REGISTER, allocation, node_input, shard

BYTES_VARIABLE = "query($b: Bytes) { nodes(filter: {minLocalDiskFree: $b}) { id } }"
DATETIME_VARIABLE = "query($d: DateTime) { events(since: $d) { id } }"
INT_VARIABLE = "query($n: Int) { events(first: $n) { id } }"

# (case, query, variables, field)
REFUSED_VALUES: list[tuple[str, str, dict[str, Any], str | None]] = [
    ("negative Bytes variable", BYTES_VARIABLE, {"b": -1}, "$b"),
    (
        "negative Bytes literal",
        "{ nodes(filter: {minLocalDiskFree: -1}) { id } }",
        {},
        "nodes.filter.minLocalDiskFree",
    ),
    (
        "negative Bytes inside an input",
        REGISTER,
        {
            "input": node_input(
                "gpu-01",
                storage=[
                    {
                        "id": "d",
                        "mountPoint": "/",
                        "shared": False,
                        "freeBytes": -5,
                        "totalBytes": GB,
                    }
                ],
            )
        },
        "$input.storage[0].freeBytes",
    ),
    ("malformed DateTime variable", DATETIME_VARIABLE, {"d": "yesterday"}, "$d"),
    ("malformed DateTime literal", '{ events(since: "yesterday") { id } }', {}, "events.since"),
    ("Int beyond 32 bits, variable", INT_VARIABLE, {"n": 2**40}, "$n"),
    ("Int beyond 32 bits, literal", "{ events(first: 99999999999) { id } }", {}, "events.first"),
    ("a string for an Int", INT_VARIABLE, {"n": "ten"}, "$n"),
]


async def answers(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient], query: str, variables: dict[str, Any]
) -> list[dict[str, Any]]:
    bodies = []
    for client in both:
        response = await client.post("/graphql", json={"query": query, "variables": variables})
        assert response.status_code == 200, response.text
        bodies.append(response.json())
    assert bodies[0] == bodies[1], "the two routes answered differently"
    return bodies


@pytest.mark.parametrize(
    ("case", "query", "variables", "field"), REFUSED_VALUES, ids=[r[0] for r in REFUSED_VALUES]
)
async def test_a_refused_scalar_value_is_bad_input_with_its_field(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    case: str,
    query: str,
    variables: dict[str, Any],
    field: str | None,
) -> None:
    body = (await answers(both, query, variables))[0]
    assert body["data"] is None
    [error] = body["errors"]
    assert error["extensions"]["code"] == "BAD_INPUT", error
    assert error["extensions"].get("field") == field, error
    # The message still says what was wrong with the value.
    assert any(word in error["message"] for word in ("Bytes", "DateTime", "Int")), error


async def test_parse_and_validation_failures_have_their_own_codes(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    parse = (await answers(both, "{ nodes {", {}))[0]
    assert parse["errors"][0]["extensions"]["code"] == "GRAPHQL_PARSE_FAILED"
    unknown = (await answers(both, "{ nodes { nope } }", {}))[0]
    assert unknown["errors"][0]["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED"


async def test_an_unknown_event_kind_is_bad_input_listing_the_known_kinds(api: Api) -> None:
    error = await api.fails('{ events(kinds: ["cordoned", "cordonned"]) { id } }')
    assert error["extensions"] == {"code": "BAD_INPUT", "field": "kinds", "value": "cordonned"}
    assert error["path"] == ["events"]
    for kind in EVENT_KINDS:
        assert kind in error["message"]


async def test_every_known_kind_is_accepted_as_a_filter(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    found = await api("query($k: [String!]) { events(kinds: $k) { kind } }",
                      {"k": sorted(EVENT_KINDS)})  # fmt: skip
    assert [e["kind"] for e in found["events"]] == ["registered"]


async def test_the_kinds_written_in_sql_are_all_in_the_closed_set(
    api: Api, engine: AsyncEngine
) -> None:
    # registered, report_changed (nodes.py), allocated (allocations.py),
    # cordoned, released (record_event).
    await api(REGISTER, {"input": node_input("gpu-01")})
    await api(REGISTER, {"input": node_input("gpu-01", hostname="renamed.cluster.local")})
    placed = await api(ALLOCATE, allocation("r-1", shard("s-1", "gpu-01", 0, 1)))
    assert placed["allocate"]["__typename"] == "Allocated"
    await api('mutation { cordonNode(id: "gpu-01", reason: "fan") { id } }')
    await api('mutation { releaseReplica(replicaId: "r-1") }')
    async with engine.connect() as conn:
        kinds = set((await conn.execute(text("SELECT DISTINCT kind FROM events"))).scalars())
    assert kinds == {"registered", "report_changed", "allocated", "cordoned", "released"}
    assert kinds <= EVENT_KINDS


async def test_recording_a_kind_outside_the_set_is_refused(engine: AsyncEngine) -> None:
    async with connections.transaction(engine) as conn:
        with pytest.raises(ValueError, match="cordonned"):
            await record_event(conn, "cordonned", node_id="gpu-01")
