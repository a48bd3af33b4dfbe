"""Who may call what: bearer tokens, roles, the node-bound agent token, and the open mode.

Tokens are in force once any token exists (or INVENTORY_BOOTSTRAP_TOKEN is
set). Until then the service is open, which is why every other test file can
call it without a token.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from graphql import (
    GraphQLEnumType,
    GraphQLInputObjectType,
    GraphQLInputType,
    GraphQLList,
    GraphQLNonNull,
    GraphQLScalarType,
    get_named_type,
    is_leaf_type,
)
from graphql.pyutils import Undefined
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import tokens
from service.access_control.auth import GRANTS
from service.config import Settings
from service.graphql.permissions import ROOT_FIELD_ROLES, role_of, roles_of, unlisted_fields
from service.graphql.schema import ROOT_TYPES, schema
from service.web.app import create_app
from tests.support.api import Api
from tests.support.reports import REGISTER, node_input

NODES = "{ nodes { id } }"


async def new_token(engine: AsyncEngine, role: str, node_id: str | None = None, **kw: Any) -> str:
    async with engine.begin() as conn:
        created = await tokens.create_token(conn, role, node_id, **kw)
    return created.secret


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
async def role_tokens(engine: AsyncEngine) -> dict[str, str]:
    """One token per role, made before the app answers anything; the agent's is for gpu-07."""
    return {
        role: await new_token(engine, role, "gpu-07" if role == "agent" else None)
        for role in tokens.ROLES
    }


def as_role(client: httpx.AsyncClient, secret: str) -> Api:
    return Api(client, headers=bearer(secret))


# --- every root field has a role ------------------------------------------------------


def test_every_root_field_has_a_role() -> None:
    assert unlisted_fields(ROOT_TYPES) == [], "add these to ROOT_FIELD_ROLES in permissions.py"


# --- refused before any resolver runs -----------------------------------------------


async def test_without_a_token_the_request_is_refused_with_401(
    client: httpx.AsyncClient, role_tokens: dict[str, str], engine: AsyncEngine
) -> None:
    response = await client.post("/graphql", json={"query": REGISTER, "variables": {
        "input": node_input("gpu-07")}})  # fmt: skip
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["errors"][0]
    assert error["extensions"]["code"] == "UNAUTHENTICATED"
    assert "Authorization: Bearer" in error["message"]
    async with engine.connect() as conn:
        assert await conn.scalar(text("SELECT count(*) FROM nodes")) == 0


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ("Bearer llmgw_not-a-real-token", "unknown or revoked"),
        ("Basic dXNlcjpwYXNz", "Bearer <token>"),
        ("Bearer", "Bearer <token>"),
    ],
)
async def test_a_wrong_token_is_refused_with_401(
    client: httpx.AsyncClient, role_tokens: dict[str, str], header: str, reason: str
) -> None:
    response = await client.post("/graphql", json={"query": NODES}, headers={
        "Authorization": header})  # fmt: skip
    assert response.status_code == 401
    assert reason in response.json()["errors"][0]["message"]


async def test_a_revoked_token_is_refused_from_the_next_request_on(
    client: httpx.AsyncClient, role_tokens: dict[str, str]
) -> None:
    operator = as_role(client, role_tokens["operator"])
    reader = await operator(
        'mutation { createToken(role: READER, description: "wallboard") { token { id } secret } }'
    )
    secret = reader["createToken"]["secret"]
    assert await as_role(client, secret)(NODES) == {"nodes": []}
    await operator("mutation($id: ID!) { revokeToken(id: $id) { revokedAt } }",
                   {"id": reader["createToken"]["token"]["id"]})  # fmt: skip
    response = await client.post("/graphql", json={"query": NODES}, headers=bearer(secret))
    assert response.status_code == 401


async def test_graphiql_and_health_stay_open_so_a_token_can_be_typed_in(
    client: httpx.AsyncClient, role_tokens: dict[str, str]
) -> None:
    page = await client.get("/graphql", headers={"Accept": "text/html"})
    assert page.status_code == 200 and "graphiql" in page.text.lower()
    assert (await client.get("/healthz")).status_code == 200
    # A query sent as GET runs an operation: it needs a token like a POST.
    response = await client.get("/graphql", params={"query": NODES})
    assert response.status_code == 401
    sneaky = await client.get("/graphql?qu%65ry=%7B__typename%7D")
    assert sneaky.status_code == 401
    response = await client.get(
        "/graphql", params={"query": NODES}, headers=bearer(role_tokens["reader"])
    )
    assert response.json() == {"data": {"nodes": []}}


# --- roles ---------------------------------------------------------------------------

DUMMY_SCALARS: dict[str, Any] = {
    "ID": "gpu-07",
    "String": "x",
    "Int": 1,
    "Float": 1.0,
    "Boolean": False,
    "DateTime": "2026-01-01T00:00:00+00:00",
    "Bytes": 1,
}


def dummy_value(type_: GraphQLInputType) -> Any:
    """The smallest value of a type that passes GraphQL's own validation."""
    if isinstance(type_, GraphQLNonNull):
        return dummy_value(type_.of_type)
    if isinstance(type_, GraphQLList):
        return []
    if isinstance(type_, GraphQLEnumType):
        return next(iter(type_.values))
    if isinstance(type_, GraphQLScalarType):
        return DUMMY_SCALARS[type_.name]
    assert isinstance(type_, GraphQLInputObjectType)
    return {
        name: dummy_value(field.type)
        for name, field in type_.fields.items()
        if isinstance(field.type, GraphQLNonNull) and field.default_value is Undefined
    }


def operation_for(kind: str, name: str) -> tuple[str, dict[str, Any]]:
    """A document calling one root field with minimal arguments, and its variables."""
    root = schema._schema.mutation_type if kind == "Mutation" else schema._schema.query_type
    assert root is not None
    field = root.fields[name]
    required = {
        arg_name: arg
        for arg_name, arg in field.args.items()
        if isinstance(arg.type, GraphQLNonNull) and arg.default_value is Undefined
    }
    declared = ", ".join(f"${a}: {arg.type}" for a, arg in required.items())
    passed = ", ".join(f"{a}: ${a}" for a in required)
    selection = "" if is_leaf_type(get_named_type(field.type)) else " { __typename }"
    document = (
        f"{kind.lower()}{f'({declared})' if declared else ''} "
        f"{{ {name}{f'({passed})' if passed else ''}{selection} }}"
    )
    return document, {a: dummy_value(arg.type) for a, arg in required.items()}


ROOT_FIELDS = [
    (kind, name)
    for kind in ("Query", "Mutation")
    for name in sorted(ROOT_FIELD_ROLES[kind])
    if name
    in (
        (schema._schema.mutation_type if kind == "Mutation" else schema._schema.query_type).fields  # type: ignore[union-attr]
    )
]


@pytest.mark.parametrize(("kind", "name"), ROOT_FIELDS, ids=[f"{k}.{n}" for k, n in ROOT_FIELDS])
async def test_each_role_against_each_root_field(
    client: httpx.AsyncClient, role_tokens: dict[str, str], kind: str, name: str
) -> None:
    needed = roles_of(ROOT_FIELD_ROLES[kind][name])
    document, variables = operation_for(kind, name)
    for role, secret in role_tokens.items():
        body = await as_role(client, secret).raw(document, variables)
        codes = [e.get("extensions", {}).get("code") for e in body.get("errors") or []]
        if any(r in GRANTS[role] for r in needed):
            assert "UNAUTHENTICATED" not in codes, (role, body)
            if "FORBIDDEN" in codes:
                # Only an agent naming a node other than its own (gpu-07).
                assert role == "agent" and "bound to node 'gpu-07'" in body["errors"][0]["message"]
        else:
            assert codes[:1] == ["FORBIDDEN"], (role, body)
            error = body["errors"][0]
            wording = " or ".join(needed)
            assert error["message"] == (
                f"{name} needs the {wording} role; this token has the {role} role"
            )
            assert error["extensions"]["requiredRole"] == wording


def test_a_reader_may_call_every_query_but_tokens_as_the_docs_say() -> None:
    """docs/security/roles.md: a reader may call every query, all but `tokens`, and the events
    subscription (issue 44: fitGroup, explainGroupPlacement and validationsToRun refused one)."""
    core = schema._schema
    roots = {"Query": core.query_type, "Subscription": core.subscription_type}
    refused = [
        f"{kind}.{name}"
        for kind, root in roots.items()
        for name in root.fields  # type: ignore[union-attr]
        if "reader" not in roles_of(role_of(kind, name))
    ]
    assert refused == ["Query.tokens"]


async def test_an_agent_token_cannot_rewrite_another_node(
    client: httpx.AsyncClient, role_tokens: dict[str, str], engine: AsyncEngine
) -> None:
    operator = as_role(client, role_tokens["operator"])
    await operator(REGISTER, {"input": node_input("gpu-08", hostname="the-real-gpu-08")})
    agent = as_role(client, role_tokens["agent"])  # bound to gpu-07

    await agent(REGISTER, {"input": node_input("gpu-07")})
    error = await agent.fails(REGISTER, {"input": node_input("gpu-08", hostname="evil")})
    assert error["extensions"]["code"] == "FORBIDDEN"
    assert "bound to node 'gpu-07'" in error["message"] and "'gpu-08'" in error["message"]
    error = await agent.fails('mutation { heartbeat(nodeId: "gpu-08") { id } }')
    assert error["extensions"]["code"] == "FORBIDDEN"
    await agent('mutation { heartbeat(nodeId: "gpu-07") { id } }')
    # Nor report a validation that would re-admit another node's GPU.
    passed = {"nodeId": "gpu-08", "gpuIndices": [0], "test": "dcgm_diag", "passed": True}
    error = await agent.fails(
        "mutation V($v: ValidationInput!) { recordValidation(input: $v) { id } }", {"v": passed}
    )
    assert error["extensions"]["code"] == "FORBIDDEN"
    error = await agent.fails('{ validationsToRun(nodeId: "gpu-08") { test } }')
    assert error["extensions"]["code"] == "FORBIDDEN"

    node = await operator('{ node(id: "gpu-08") { hostname } }')
    assert node == {"node": {"hostname": "the-real-gpu-08"}}


async def test_an_operators_change_records_which_token_made_it(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    secret = await new_token(engine, "operator", description="alice")
    operator = as_role(client, secret)
    await operator(REGISTER, {"input": node_input("gpu-07")})
    await operator('mutation { cordonNode(id: "gpu-07", reason: "bad fan") { state } }')
    async with engine.connect() as conn:
        actor = await conn.scalar(text("SELECT admin_actor FROM nodes WHERE id = 'gpu-07'"))
    assert actor is not None and actor.startswith("alice (tok_")


# --- open mode, the first token, and the bootstrap token -------------------------------


async def test_the_first_token_closes_an_open_service(api: Api, client: httpx.AsyncClient) -> None:
    assert await api(NODES) == {"nodes": []}  # no tokens: open (loopback only, see bind policy)
    created = await api(
        'mutation { createToken(role: OPERATOR, description: "first") { secret token { role } } }'
    )
    assert created["createToken"]["token"]["role"] == "OPERATOR"
    assert (await client.post("/graphql", json={"query": NODES})).status_code == 401
    secret = created["createToken"]["secret"]
    assert await as_role(client, secret)(NODES) == {"nodes": []}


@pytest.fixture
async def bootstrapped(engine: AsyncEngine, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.replace(bootstrap_token="boot-secret-123"), engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as c:
        yield c


async def test_the_bootstrap_token_is_an_operator_that_can_create_the_others(
    bootstrapped: httpx.AsyncClient,
) -> None:
    # No token in the database, but the bootstrap token puts tokens in force.
    assert (await bootstrapped.post("/graphql", json={"query": NODES})).status_code == 401
    operator = as_role(bootstrapped, "boot-secret-123")
    created = await operator(
        'mutation { createToken(role: AGENT, nodeId: "gpu-07") { secret token { nodeId } } }'
    )
    assert created["createToken"]["token"]["nodeId"] == "gpu-07"
    listed = await operator("{ tokens { role nodeId } }")
    assert listed == {"tokens": [{"role": "AGENT", "nodeId": "gpu-07"}]}


async def test_an_agent_token_needs_its_node(api: Api) -> None:
    error = await api.fails("mutation { createToken(role: AGENT) { secret } }")
    assert error["extensions"] == {"code": "BAD_INPUT", "field": "nodeId", "value": None}


# --- websockets: the token travels in connection_init -----------------------------------


def _ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://")


def _connect(url: str, payload: dict[str, Any]) -> dict[str, Any]:
    """connection_init with `payload`; the server's answer (a message, or the close)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect(url, subprotocols=["graphql-transport-ws"], open_timeout=5) as ws:  # type: ignore[list-item]
        ws.send(json.dumps({"type": "connection_init", "payload": payload}))
        try:
            answer: dict[str, Any] = json.loads(ws.recv(timeout=5))
        except ConnectionClosed as closed:
            return {"closed": closed.rcvd.code if closed.rcvd else None}
        if answer.get("type") == "connection_ack":
            ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": {
                "query": "subscription { events { id kind } }"}}))  # fmt: skip
            # No event is due; the subscription is accepted (no error frame).
            try:
                follow = json.loads(ws.recv(timeout=0.5))
                answer["next"] = follow
            except TimeoutError:
                answer["next"] = None
        return answer


async def test_a_subscription_needs_a_token_in_connection_init(
    live_service: Any, engine: AsyncEngine
) -> None:
    import asyncio

    secret = await new_token(engine, "reader")
    url = _ws_url(live_service.url)
    refused = await asyncio.to_thread(_connect, url, {})
    assert refused == {"closed": 4403}
    wrong = await asyncio.to_thread(_connect, url, {"Authorization": "Bearer nope"})
    assert wrong == {"closed": 4403}
    accepted = await asyncio.to_thread(_connect, url, {"Authorization": f"Bearer {secret}"})
    assert accepted["type"] == "connection_ack"
    assert accepted["next"] is None or accepted["next"].get("type") != "error", accepted
    # A valid token without the role: connected, but the subscription is refused by name.
    agent = await new_token(engine, "agent", "gpu-07")
    refused_role = await asyncio.to_thread(_connect, url, {"Authorization": f"Bearer {agent}"})
    assert refused_role["type"] == "connection_ack"
    assert refused_role["next"] is not None, "expected an error frame"
    frame = refused_role["next"]
    errors = frame["payload"] if frame["type"] == "error" else frame["payload"]["errors"]
    assert errors[0]["extensions"]["code"] == "FORBIDDEN"
    assert errors[0]["message"].startswith("events needs the reader role")


async def test_the_api_as_fixture_sends_a_token_of_the_role(api_as: Any) -> None:
    scheduler = await api_as("scheduler")
    assert await scheduler(NODES) == {"nodes": []}
    error = await scheduler.fails('mutation { removeNode(id: "gpu-07") }')
    assert error["extensions"]["code"] == "FORBIDDEN"
