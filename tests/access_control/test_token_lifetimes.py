"""Tokens that end: by their expiry time, or by revocation, for every request and every open socket.

An operator gives a contractor a reader token for a week, or revokes a leaked
one: from then on no request passes with it (401, saying which of the two
happened), in every service process, batched token lookups included; and a
subscription opened with it before does not keep streaming the cluster's
events, whichever process holds it.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import websockets
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.reports import REGISTER, node_input
from tests.support.waiting import PATIENCE, until

CREATE = """
mutation Create($role: Role!, $expiresAt: DateTime) {
  createToken(role: $role, expiresAt: $expiresAt) {
    secret token { id expiresAt status }
  }
}
"""
TOKENS = "query($all: Boolean!) { tokens(includeRevoked: $all) { id status expiresAt revokedAt } }"
REVOKE = "mutation($id: ID!) { revokeToken(id: $id) { id status } }"
NODES = "{ nodes { id } }"


async def status_becomes(operator: Api, token_id: str, status: str) -> None:
    """Wait until the token list shows the token in that status (the database's clock decides)."""

    async def shown() -> bool:
        listed = (await operator(TOKENS, {"all": True}))["tokens"]
        return any(t["id"] == token_id and t["status"] == status for t in listed)

    await until(shown, f"token {token_id} to be listed {status}")


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def create(api: Api, role: str = "READER", expires_in: float | None = None) -> dict[str, Any]:
    expires = (
        (datetime.now(UTC) + timedelta(seconds=expires_in)).isoformat()
        if expires_in is not None
        else None
    )
    created: dict[str, Any] = (await api(CREATE, {"role": role, "expiresAt": expires}))[
        "createToken"
    ]
    return created


async def operator_api(client: httpx.AsyncClient, engine: AsyncEngine) -> Api:
    from service.access_control import tokens

    async with engine.begin() as conn:
        made = await tokens.create_token(conn, "operator", description="test operator")
    return Api(client, headers=bearer(made.secret))


async def test_a_token_past_its_expiry_is_refused_with_401_token_expired(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    operator = await operator_api(client, engine)
    short = await create(operator, expires_in=1.5)
    assert short["token"]["status"] == "ACTIVE" and short["token"]["expiresAt"] is not None
    reader = Api(client, headers=bearer(short["secret"]))
    assert await reader(NODES) == {"nodes": []}

    await status_becomes(operator, short["token"]["id"], "EXPIRED")
    # Many at once: lookups that share one batched statement each see the expiry.
    replies = await asyncio.gather(
        *(client.post("/graphql", json={"query": NODES}, headers=reader.headers) for _ in range(20))
    )
    for reply in replies:
        assert reply.status_code == 401, reply.text
        error = reply.json()["errors"][0]
        assert error["extensions"]["code"] == "UNAUTHENTICATED"
        assert error["message"].startswith("token expired")


async def test_the_list_tells_expired_tokens_from_revoked_ones(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    operator = await operator_api(client, engine)
    lasting = await create(operator, expires_in=3600)
    expiring = await create(operator, expires_in=0.5)
    revoked = await create(operator, expires_in=0.5)
    await operator(REVOKE, {"id": revoked["token"]["id"]})
    await status_becomes(operator, expiring["token"]["id"], "EXPIRED")

    listed = {t["id"]: t["status"] for t in (await operator(TOKENS, {"all": False}))["tokens"]}
    # Expired tokens are listed (an operator replaces them), revoked ones only when asked.
    assert listed[lasting["token"]["id"]] == "ACTIVE"
    assert listed[expiring["token"]["id"]] == "EXPIRED"
    assert revoked["token"]["id"] not in listed
    every = {t["id"]: t["status"] for t in (await operator(TOKENS, {"all": True}))["tokens"]}
    # Revoked and expired both: revoked says more.
    assert every[revoked["token"]["id"]] == "REVOKED"

    refused = await client.post(
        "/graphql", json={"query": NODES}, headers=bearer(revoked["secret"])
    )
    assert refused.status_code == 401
    assert refused.json()["errors"][0]["message"] == "the token was revoked"


@pytest.mark.parametrize(
    ("expires_at", "problem"),
    [
        ("2020-01-01T00:00:00+00:00", "already past"),
        ("2999-01-01T00:00:00", "time zone"),
    ],
    ids=["in the past", "without a time zone"],
)
async def test_an_expiry_in_the_past_or_without_a_zone_is_bad_input_and_nothing_is_made(
    client: httpx.AsyncClient, engine: AsyncEngine, expires_at: str, problem: str
) -> None:
    operator = await operator_api(client, engine)
    error = await operator.fails(CREATE, {"role": "READER", "expiresAt": expires_at})
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == "expiresAt"
    assert error["extensions"]["value"] == expires_at
    assert problem in error["message"]
    listed = (await operator(TOKENS, {"all": True}))["tokens"]
    assert len(listed) == 1  # the operator's own


# --- open subscriptions end with their token, in whichever process holds them -------------


SUBSCRIPTION = "subscription { events { id kind } }"


async def open_subscription(graphql_url: str, secret: str) -> Any:
    socket = await websockets.connect(
        graphql_url.replace("http://", "ws://", 1),
        subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
    )
    await socket.send(json.dumps({"type": "connection_init", "payload": bearer(secret)}))
    ack = json.loads(await socket.recv())
    assert ack["type"] == "connection_ack", ack
    await socket.send(
        json.dumps({"id": "1", "type": "subscribe", "payload": {"query": SUBSCRIPTION}})
    )
    return socket


async def ending(socket: Any, within: float) -> tuple[float, list[dict[str, Any]]]:
    """Seconds until the subscription ended, and the frames that ended it."""
    started = time.monotonic()
    frames: list[dict[str, Any]] = []
    async with asyncio.timeout(within):
        while True:
            frame = json.loads(await socket.recv())
            if frame["type"] == "ping":
                await socket.send(json.dumps({"type": "pong"}))
                continue
            frames.append(frame)
            if frame["type"] in ("complete", "error"):
                return time.monotonic() - started, frames


async def next_event(socket: Any) -> dict[str, Any]:
    """The next event a subscription streams (pings answered); fails at the deadline."""
    async with asyncio.timeout(PATIENCE):
        while True:
            frame = json.loads(await socket.recv())
            if frame["type"] == "ping":
                await socket.send(json.dumps({"type": "pong"}))
                continue
            assert frame["type"] == "next", frame
            event: dict[str, Any] = frame["payload"]["data"]["events"]
            return event


def ending_error(frames: list[dict[str, Any]]) -> dict[str, Any]:
    for frame in frames:
        if frame["type"] == "next" and frame["payload"].get("errors"):
            error: dict[str, Any] = frame["payload"]["errors"][0]
            return error
        if frame["type"] == "error":
            first: dict[str, Any] = frame["payload"][0]
            return first
    raise AssertionError(f"no error among {frames}")


async def test_revoking_a_token_ends_its_subscriptions_in_every_process(
    live_service_factory: Any, engine: AsyncEngine
) -> None:
    from service.access_control import tokens

    a, b = await asyncio.gather(
        asyncio.to_thread(live_service_factory), asyncio.to_thread(live_service_factory)
    )
    async with engine.begin() as conn:
        operator = (await tokens.create_token(conn, "operator")).secret
        doomed = await tokens.create_token(conn, "reader", description="leaked laptop")
        kept = (await tokens.create_token(conn, "reader", description="dashboard")).secret

    on_a = await open_subscription(a.url, doomed.secret)
    on_b = await open_subscription(b.url, doomed.secret)
    untouched = await open_subscription(b.url, kept)
    try:
        # Each subscription is running once it streams an event: one from a
        # registration, which both processes announce.
        async with httpx.AsyncClient(timeout=10) as http:
            await http.post(
                a.url,
                json={"query": REGISTER, "variables": {"input": node_input("gpu-00")}},
                headers=bearer(operator),
            )
        for socket in (on_a, on_b, untouched):
            assert (await next_event(socket))["kind"] == "registered"
        async with httpx.AsyncClient(timeout=10) as http:
            revoked = await http.post(
                a.url,
                json={"query": REVOKE, "variables": {"id": doomed.token.id}},
                headers=bearer(operator),
            )
        assert revoked.json()["data"]["revokeToken"]["status"] == "REVOKED"

        for socket in (on_a, on_b):
            took, frames = await ending(socket, within=5)
            assert took < 2.0, f"ended after {took:.2f}s"
            error = ending_error(frames)
            assert error["extensions"]["code"] == "UNAUTHENTICATED"
            assert "token revoked" in error["message"]

        # Counted where it happened, once per socket.
        async with httpx.AsyncClient(timeout=10) as http:
            for service in (a, b):
                scrape = (await http.get(service.url.replace("/graphql", "/metrics"))).text
                assert 'inventory_websockets_ended_by_token_total{status="revoked"} 1' in scrape

        # The socket stays open, but nothing more runs on it with that token.
        await on_b.send(
            json.dumps({"id": "2", "type": "subscribe", "payload": {"query": SUBSCRIPTION}})
        )
        _, frames = await ending(on_b, within=5)
        assert "token revoked" in ending_error(frames)["message"]

        # Another token's subscription in the same process goes on.
        async with httpx.AsyncClient(timeout=10) as http:
            await http.post(
                a.url,
                json={"query": REGISTER, "variables": {"input": node_input("gpu-01")}},
                headers=bearer(operator),
            )
        assert (await next_event(untouched))["kind"] == "registered"
    finally:
        for socket in (on_a, on_b, untouched):
            await socket.close()


async def test_a_subscription_ends_when_its_token_expires(
    live_service: Any, engine: AsyncEngine
) -> None:
    from service.access_control import tokens

    async with engine.begin() as conn:
        expiring = await tokens.create_token(
            conn, "reader", expires_at=datetime.now(UTC) + timedelta(seconds=1.5)
        )
    socket = await open_subscription(live_service.url, expiring.secret)
    try:
        took, frames = await ending(socket, within=6)
        # Expires 1.5 s after creation; ended within 2 s of that.
        assert took < 3.5, f"ended after {took:.2f}s"
        error = ending_error(frames)
        assert error["extensions"]["code"] == "UNAUTHENTICATED"
        assert "token expired" in error["message"]
    finally:
        await socket.close()
