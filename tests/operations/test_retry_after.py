"""A 503 for a condition that passes by itself says when to come back (`Retry-After`).

A scheduler or a load balancer that meets the database restarting, or a
replica leaving the load balancer, should retry soon, not hammer the service
in a tight loop nor give up: the answer tells it how long to wait.
"""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit, urlunsplit

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.database.db import create_engine, dispose
from service.database.db_faults import RETRY_AFTER_SECONDS
from service.web.app import create_app

GRAPHQL = {"query": "{ nodes(first: 1) { id } }"}


def says_retry_after(response: httpx.Response) -> bool:
    return response.status_code == 503 and response.headers.get("retry-after") == str(
        RETRY_AFTER_SECONDS
    )


async def test_a_request_whose_token_cannot_be_checked_is_told_to_retry(
    unreachable_client: httpx.AsyncClient,
) -> None:
    response = await unreachable_client.post(
        "/graphql", json=GRAPHQL, headers={"Authorization": "Bearer some-agent-token"}
    )
    assert says_retry_after(response), (response.status_code, response.headers)
    assert response.json()["errors"][0]["extensions"]["code"] == "DATABASE_UNAVAILABLE"


async def test_readiness_without_the_database_says_when_to_ask_again(
    unreachable_client: httpx.AsyncClient,
) -> None:
    response = await unreachable_client.get("/readyz")
    assert says_retry_after(response), (response.status_code, response.headers)


async def test_a_draining_replica_is_not_ready_and_says_when_to_ask_again(
    engine: AsyncEngine, settings: Settings
) -> None:
    app = create_app(settings, engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 200 and "retry-after" not in ready.headers
        app.state.drain.begin()  # what SIGTERM does (service/web/draining.py)
        leaving = await client.get("/readyz")
        assert says_retry_after(leaving), (leaving.status_code, leaving.headers)
        assert leaving.json()["reason"] == "shutting down"
        # Still serving meanwhile: only readiness says it is going.
        served = await client.post("/graphql", json=GRAPHQL)
        assert served.status_code == 200 and served.json() == {"data": {"nodes": []}}


async def test_a_server_with_no_connection_to_spare_is_told_to_retry(
    engine: AsyncEngine, database_url: str, fast_path: bool
) -> None:
    """PostgreSQL refusing a connection at its limit ("too many clients already", SQLSTATE
    53300) passes by itself as connections are returned: DATABASE_UNAVAILABLE with
    Retry-After, not an INTERNAL_ERROR (seen when two racing tests filled the server)."""
    role = f"crowded_{uuid.uuid4().hex[:8]}"
    async with engine.begin() as conn:
        # A role allowed no connection: every connection it opens is refused with 53300,
        # as every role's is when the server is at max_connections.
        await conn.execute(text(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0"))
    parts = urlsplit(database_url)
    host = parts.netloc.rpartition("@")[2]
    crowded = create_engine(
        urlunsplit((parts.scheme, f"{role}@{host}", parts.path, parts.query, parts.fragment)),
        Settings(db_timeout=2),
    )
    try:
        app = create_app(Settings(db_timeout=2, fast_path=fast_path), engine=crowded)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
            response = await client.post("/graphql", json=GRAPHQL)
        assert says_retry_after(response), (response.status_code, response.text)
        assert response.json()["errors"][0]["extensions"]["code"] == "DATABASE_UNAVAILABLE"
    finally:
        await dispose(crowded)
        async with engine.begin() as conn:
            await conn.execute(text(f"DROP ROLE {role}"))
