"""/healthz says the process is up; /readyz says it can serve: the database answers, at the right schema."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from service.config import Settings
from service.database.db import create_engine, dispose
from service.database.migrations import head_revision
from service.web.app import create_app
from tests.support.databases import create_database, drop_database
from tests.support.live_service import free_port


@pytest.fixture
def unmigrated_url(server_url: str) -> Iterator[str]:
    url = create_database(server_url, prefix="llmgw_unmigrated")
    yield url
    drop_database(server_url, url)


async def get(app_engine_url: str, path: str) -> httpx.Response:
    settings = Settings(db_timeout=2)
    engine = create_engine(app_engine_url, settings)
    try:
        app = create_app(settings, engine=engine)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://inventory"
        ) as client:
            return await client.get(path)
    finally:
        await dispose(engine)


async def test_ready_when_the_database_answers_at_the_latest_schema(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["status"] == "ready"
    assert response.json()["revision"] == head_revision()
    assert (await client.get("/healthz")).status_code == 200


async def test_not_ready_on_a_database_that_was_never_migrated(unmigrated_url: str) -> None:
    response = await get(unmigrated_url, "/readyz")
    assert response.status_code == 503
    assert (
        response.json()["reason"]
        == f"the schema is at no revision, this release needs {head_revision()}"
    )


async def test_not_ready_when_the_database_is_down_but_still_healthy(database_url: str) -> None:
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    response = await get(nowhere, "/readyz")
    assert response.status_code == 503
    assert response.json()["reason"].startswith("the database is unavailable")
    # The process itself is fine: restarting it would not help.
    assert (await get(nowhere, "/healthz")).status_code == 200
