"""What the agent sends over the wire, and how it reads the service's answers."""

import json

import httpx
import pytest
from fake_inventory_service import FakeService

from agent.client import (
    InventoryClient,
    NodeNotFound,
    ReportRejected,
    ServiceError,
    ServiceUnavailable,
    load_operation,
)

URL = "http://inventory.test/graphql"
NODE = {"id": "gpu-07", "hostname": "gpu-07", "mgmtAddr": "10.0.0.7", "gpus": []}


def client_for(service: FakeService, token: str | None = "s3cret") -> InventoryClient:
    return InventoryClient(URL, token, timeout=5, transport=service.transport())


async def test_registering_posts_the_operation_with_the_report_and_the_token() -> None:
    service = FakeService()
    client = client_for(service)
    status = await client.register_node(NODE)

    (request,) = service.requests
    assert (request.method, str(request.url)) == ("POST", URL)
    assert request.headers["Authorization"] == "Bearer s3cret"
    assert json.loads(request.content) == {
        "query": load_operation("register_node"),
        "variables": {"input": NODE},
    }
    assert (status.id, status.state) == ("gpu-07", "READY")
    await client.aclose()


async def test_without_a_token_no_authorization_header_is_sent() -> None:
    service = FakeService()
    client = client_for(service, token=None)
    await client.register_node(NODE)
    assert "Authorization" not in service.requests[0].headers
    await client.aclose()


async def test_a_heartbeat_for_a_node_the_service_does_not_know_says_so() -> None:
    client = client_for(FakeService())
    with pytest.raises(NodeNotFound):
        await client.heartbeat("gpu-07")
    await client.aclose()


async def test_a_refused_report_names_the_field_and_value() -> None:
    service = FakeService()
    service.rejecting = ("input.gpus[0].memoryMb", -1)
    client = client_for(service)
    with pytest.raises(ReportRejected) as raised:
        await client.register_node(NODE)
    assert (raised.value.field, raised.value.value) == ("input.gpus[0].memoryMb", -1)
    assert "must be at least 0" in str(raised.value)
    await client.aclose()


@pytest.mark.parametrize(
    ("setup", "error", "text"),
    [
        (lambda s: setattr(s, "down", True), ServiceUnavailable, "Connection refused"),
        (lambda s: setattr(s, "status", 502), ServiceUnavailable, "HTTP 502"),
        (lambda s: setattr(s, "status", 401), ServiceError, "token"),
    ],
)
async def test_a_service_that_cannot_answer_is_told_apart_from_one_that_refuses(
    setup: object, error: type[Exception], text: str
) -> None:
    service = FakeService()
    setup(service)  # type: ignore[operator]
    client = client_for(service)
    with pytest.raises(error, match=text):
        await client.heartbeat("gpu-07")
    await client.aclose()


@pytest.mark.parametrize(
    ("token", "said"),
    [
        (None, "the agent sent no token: set token or token_file"),
        ("s3cret", "the agent sent the token from token or token_file: check it is this node's"),
    ],
)
async def test_a_refusal_says_what_the_agent_sent(token: str | None, said: str) -> None:
    # A fresh deployment's first token locks out a tokenless agent: the log
    # must say it sent none, not that its (absent) token was refused.
    def refuse(request: httpx.Request) -> httpx.Response:
        error = {"message": "a token is required", "extensions": {"code": "UNAUTHENTICATED"}}
        return httpx.Response(401, json={"errors": [error]})

    client = InventoryClient(URL, token, 5, transport=httpx.MockTransport(refuse))
    with pytest.raises(ServiceError) as raised:
        await client.heartbeat("gpu-07")
    assert str(raised.value).startswith(
        f"the service refused the agent (HTTP 401: a token is required); {said}"
    ), str(raised.value)
    await client.aclose()


async def test_any_other_graphql_error_carries_its_code() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        error = {"message": "Cannot query field 'heartbeat'", "extensions": {"code": "X"}}
        return httpx.Response(400, json={"errors": [error]})

    client = InventoryClient(URL, None, 5, transport=httpx.MockTransport(refuse))
    with pytest.raises(ServiceError) as raised:
        await client.heartbeat("gpu-07")
    assert raised.value.code == "X" and "Cannot query field" in str(raised.value)
    await client.aclose()
