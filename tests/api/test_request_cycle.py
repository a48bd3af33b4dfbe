"""What every request gets on its one path (service/web/request_cycle.py): an id, a status, the drain's
close, a JSON 500 for a bug; and /graphql reached as Starlette's router would reach it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.metrics import COUNTERS
from service.web import graphql_endpoint
from service.web.app import create_app
from service.web.logs import RequestIdFilter
from service.web.request_cycle import RequestCycle


@pytest.fixture
def app(engine: AsyncEngine, settings: Settings) -> RequestCycle:
    return create_app(settings, engine=engine)


@pytest.fixture
async def client(app: RequestCycle) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as c:
        yield c


def latency_count(method: str, route: str, status: str) -> float:
    return COUNTERS.snapshot()[1].get((method, route, status), [0.0])[-1]


async def test_a_bug_before_the_answer_is_a_json_500_with_the_request_id_logged_once(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(scope: Any, body: bytes) -> None:
        raise RuntimeError("a bug in the request's checks")

    monkeypatch.setattr(graphql_endpoint, "check_request", broken)
    before = latency_count("POST", "/graphql", "500")
    caplog.handler.addFilter(RequestIdFilter())  # as logs.configure installs it
    with caplog.at_level(logging.INFO):
        response = await client.post(
            "/graphql", json={"query": "{ __typename }"}, headers={"X-Request-Id": "bug-1"}
        )
    assert response.status_code == 500
    assert response.headers["x-request-id"] == "bug-1"
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "errors": [
            {
                "message": "internal error",
                "extensions": {"code": "INTERNAL_ERROR", "requestId": "bug-1"},
            }
        ]
    }
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert getattr(errors[0], "request_id", None) == "bug-1"
    assert latency_count("POST", "/graphql", "500") == before + 1


async def test_every_answer_carries_its_request_id_and_after_the_drain_connection_close(
    client: httpx.AsyncClient, app: RequestCycle
) -> None:
    heartbeat_shape = {"query": "{ __typename }"}
    answered = await client.post("/graphql", json=heartbeat_shape)
    assert len(answered.headers["x-request-id"]) == 16
    assert "connection" not in answered.headers
    # The drain first keeps connections (a proxy keeps reusing its pooled
    # ones, web/draining.py); once the listener is closed every answer closes.
    app.state.drain.begin()
    during = await client.post("/graphql", json=heartbeat_shape)
    assert "connection" not in during.headers
    assert (await client.get("/readyz")).status_code == 503
    app.state.drain.close_connections()
    for response in (
        await client.post("/graphql", json=heartbeat_shape),  # the fast path
        await client.get("/graphql", headers={"accept": "text/html"}),  # GraphiQL
        await client.post("/graphql", content=b"[1]", headers={"content-type": "application/json"}),
        await client.get("/healthz"),
        await client.get("/readyz"),
    ):
        assert response.headers["connection"] == "close", response.request.url
        assert response.headers["x-request-id"]
    assert (await client.get("/readyz")).status_code == 503


async def test_graphql_is_reached_as_starlettes_router_would(app: RequestCycle) -> None:
    # Other methods meet the route's 405; a root path is taken off the path.
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
        refused = await client.put("/graphql", json={"query": "{ __typename }"})
        assert refused.status_code == 405
        assert set(refused.headers["allow"].split(", ")) == {"GET", "HEAD", "POST"}
        missing = await client.post("/graphql/", json={"query": "{ __typename }"})
        assert missing.status_code in (307, 404)  # Starlette's, as before
    mounted = httpx.ASGITransport(app=app, root_path="/inventory")
    async with httpx.AsyncClient(transport=mounted, base_url="http://inventory") as client:
        response = await client.post("/inventory/graphql", json={"query": "{ __typename }"})
        assert response.json() == {"data": {"__typename": "Query"}}


async def test_a_header_sent_twice_counts_by_its_first_value_at_every_step(
    engine: AsyncEngine,
) -> None:
    # Each step reads its header from one index of the request's headers
    # (http_guards.header); a repeated header is the first one it was sent as,
    # for the request id, the media type checks and the token alike.
    token = "bootstrap-token-for-this-test"
    app = create_app(Settings(bootstrap_token=token), engine=engine)
    headers = [
        ("x-request-id", "first-id"),
        ("x-request-id", "second-id"),
        ("content-type", "application/json"),
        ("content-type", "text/plain"),
        ("authorization", f"Bearer {token}"),
        ("authorization", "Bearer not-a-token"),
    ]
    body = b'{"query": "{ __typename }"}'
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
        answered = await client.post("/graphql", content=body, headers=headers)
        assert answered.status_code == 200, answered.text
        assert answered.headers["x-request-id"] == "first-id"
        assert answered.json() == {"data": {"__typename": "Query"}}

        wrong_token_first = [headers[0], headers[2], headers[5], headers[4]]
        refused = await client.post("/graphql", content=body, headers=wrong_token_first)
        assert refused.status_code == 401, refused.text

        swapped = [headers[1], headers[0], headers[3], headers[2], headers[4]]
        refused = await client.post("/graphql", content=body, headers=swapped)
        assert refused.headers["x-request-id"] == "second-id"
        assert refused.status_code == 415, refused.text
        assert "text/plain" in refused.json()["errors"][0]["message"]
