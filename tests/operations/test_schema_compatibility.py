"""A process of an older release on a schema a newer release migrated: it serves on when the schema keeps it working.

docs/deployment/upgrades.md's order: the new release migrates first, then the
processes are replaced one by one. Meanwhile the old ones run on the new
schema; their /readyz must stay 200 and a restarted one must start without
migrating, but only when the newer schema says it keeps their code working
(alembic_version's comment, written by alembic/env.py from the migrations'
`keeps_working`). The newer release is played here by rewriting the stored
revision and that comment, as its migrate step would leave them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import asyncpg
import httpx
import pytest

from service.cli import main
from service.config import Settings
from service.database.db import create_engine, dispose
from service.database.migrations import NewerSchema, head_revision, keeps_working, upgrade
from service.web.app import create_app
from tests.support.databases import create_database, drop_database

HEAD = head_revision()


@pytest.fixture
def url(server_url: str) -> Iterator[str]:
    url = create_database(server_url, prefix="llmgw_compat")
    upgrade(url)
    yield url
    drop_database(server_url, url)


async def sql(url: str, statement: str) -> object:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(statement)
    finally:
        await conn.close()


def migrated_by_a_newer_release(url: str, revision: str, keeps: str | None) -> None:
    comment = "NULL" if keeps is None else "'" + json.dumps({"keepsWorking": keeps}) + "'"
    asyncio.run(sql(url, f"UPDATE alembic_version SET version_num = '{revision}'"))
    asyncio.run(sql(url, f"COMMENT ON TABLE alembic_version IS {comment}"))


async def readyz(url: str) -> httpx.Response:
    settings = Settings(db_timeout=5)
    engine = create_engine(url, settings)
    try:
        app = create_app(settings, engine=engine)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://inventory"
        ) as client:
            return await client.get("/readyz")
    finally:
        await dispose(engine)


def test_every_upgrade_records_which_code_the_schema_keeps_working(url: str) -> None:
    comment = asyncio.run(sql(url, "SELECT obj_description('alembic_version'::regclass)"))
    # What the newest migration declares (an expand migration: the release before it).
    assert json.loads(str(comment)) == {"keepsWorking": keeps_working(HEAD)}


def test_a_newer_schema_that_keeps_this_release_working_is_served_and_not_migrated(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    migrated_by_a_newer_release(url, "0999_from_the_future", keeps=HEAD)
    response = asyncio.run(readyz(url))
    assert response.status_code == 200, response.text
    assert response.json()["reason"] == (
        f"ready: the schema is at 0999_from_the_future, newer than this release's {HEAD}, "
        f"and keeps code from {HEAD} working"
    )
    with caplog.at_level("INFO", logger="service.database.migrations"):
        upgrade(url)  # a restarted old process: nothing to do, and no failure
    assert "nothing to migrate" in caplog.text
    assert asyncio.run(sql(url, "SELECT version_num FROM alembic_version")) == (
        "0999_from_the_future"
    )


@pytest.mark.parametrize("keeps", ["0999_from_the_future", None])
def test_a_newer_schema_that_no_longer_keeps_it_working_takes_it_out_and_stops_its_start(
    url: str, keeps: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    migrated_by_a_newer_release(url, "0999_from_the_future", keeps=keeps)
    response = asyncio.run(readyz(url))
    assert response.status_code == 503
    assert response.json()["reason"] == (
        f"the schema is at 0999_from_the_future, this release needs {HEAD}"
    )
    with pytest.raises(NewerSchema):
        upgrade(url)
    monkeypatch.setenv("DATABASE_URL", url)
    assert main(["migrate"]) == 2
    assert "migrated by a newer release" in capsys.readouterr().err


def test_an_older_schema_is_still_not_ready(url: str) -> None:
    asyncio.run(sql(url, "UPDATE alembic_version SET version_num = '0019'"))
    response = asyncio.run(readyz(url))
    assert response.status_code == 503
    assert response.json()["reason"] == f"the schema is at 0019, this release needs {HEAD}"
