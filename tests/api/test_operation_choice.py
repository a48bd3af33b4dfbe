"""A document of several operations runs the one the request names, and none when it names none.

Issue 44: `mutation A {...} mutation B {...}` sent with an operator token and
no operationName cordoned the node: Strawberry ran the first operation. The
GraphQL specification requires an error, and nothing must run. On both
routes, by POST and by GET (the websocket: tests/api/test_websocket_messages.py).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.api import Api
from tests.support.reports import REGISTER, node_input

Both = tuple[httpx.AsyncClient, httpx.AsyncClient]
MULTIPLE = "Must provide operation name if query contains multiple operations."

TWO_MUTATIONS = (
    'mutation A { cordonNode(id: "gpu-07", reason: "fan") { state } } '
    'mutation B { drainNode(id: "gpu-07", reason: "psu") { state } }'
)
TWO_QUERIES = "query A { __typename } query B { nodes { id } }"


async def state(client: httpx.AsyncClient) -> str:
    node = await Api(client)('{ node(id: "gpu-07") { state } }')
    found: str = node["node"]["state"]
    return found


@pytest.mark.parametrize("name", [None, ""], ids=["operationName null", "no operationName"])
async def test_two_mutations_and_no_operation_name_run_nothing(
    both: Both, name: str | None
) -> None:
    await Api(both[0])(REGISTER, {"input": node_input("gpu-07")})
    bodies = []
    for client in both:
        request: dict[str, Any] = {"query": TWO_MUTATIONS}
        if name is None:
            request["operationName"] = None
        response = await client.post("/graphql", json=request)
        assert response.status_code == 200
        bodies.append(response.json())
        assert await state(client) == "READY", "an operation ran"
    assert bodies[0] == bodies[1]
    assert bodies[0] == {
        "data": None,
        "errors": [{"message": MULTIPLE, "extensions": {"code": "BAD_REQUEST"}}],
    }


async def test_the_named_operation_runs_and_only_it(both: Both) -> None:
    fast, reference = both
    await Api(fast)(REGISTER, {"input": node_input("gpu-07")})
    for client, name, expected in ((fast, "B", "DRAINING"), (reference, "A", "CORDONED")):
        response = await client.post(
            "/graphql", json={"query": TWO_MUTATIONS, "operationName": name}
        )
        assert "errors" not in response.json(), response.text
        assert await state(client) == expected
        await Api(client)('mutation { uncordonNode(id: "gpu-07") { state } }')


async def test_two_queries_by_get_and_no_operation_name_is_the_same_error(both: Both) -> None:
    for client in both:
        response = await client.get("/graphql", params={"query": TWO_QUERIES})
        assert response.json() == {
            "data": None,
            "errors": [{"message": MULTIPLE, "extensions": {"code": "BAD_REQUEST"}}],
        }
        # The GraphQL-over-HTTP media type: a request error, HTTP 400 without `data`.
        strict = await client.get(
            "/graphql",
            params={"query": TWO_QUERIES},
            headers={"Accept": "application/graphql-response+json"},
        )
        assert strict.status_code == 400
        assert strict.json() == {
            "errors": [{"message": MULTIPLE, "extensions": {"code": "BAD_REQUEST"}}]
        }
        named = await client.get("/graphql", params={"query": TWO_QUERIES, "operationName": "A"})
        assert named.json() == {"data": {"__typename": "Query"}}


async def test_two_mutations_by_get_run_nothing(both: Both) -> None:
    await Api(both[0])(REGISTER, {"input": node_input("gpu-07")})
    for client in both:
        response = await client.get("/graphql", params={"query": TWO_MUTATIONS})
        assert response.json()["errors"][0]["message"] == MULTIPLE
        assert await state(client) == "READY"
