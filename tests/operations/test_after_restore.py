"""After a restore: engines placed after the restore point are told to stop, and fences never repeat.

The restore is modelled at the database's level: a copy of the inventory's
database taken at T (CREATE DATABASE ... TEMPLATE, what a restore to T brings
back), the original then written on (a replica placed after T, its engine
started with its fence), and the service pointed at the copy, as
deploy/restore.sh points it at the restored cluster. docs/operations/backup.md
("What the service does after a restore") is what is checked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.cli import main
from service.config import Settings
from service.database.db import create_engine, dispose
from service.database.migrations import upgrade
from service.database.transactions import in_transaction
from service.restores import after_restore
from service.web.app import create_app
from tests.support.api import Api
from tests.support.databases import create_database, drop_database, with_database
from tests.support.fencing import ALLOCATIONS, BEAT, EVENTS
from tests.support.reports import ALLOCATE, REGISTER, allocation, node_input, shard


@asynccontextmanager
async def service(url: str) -> AsyncIterator[tuple[Api, AsyncEngine]]:
    settings = Settings(db_timeout=5)
    engine = create_engine(url, settings)
    app = create_app(settings, engine=engine)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://inventory"
        ) as client:
            yield Api(client), engine
    finally:
        await dispose(engine)


async def place(api: Api, replica_id: str, index: int) -> dict[str, Any]:
    result = await api(ALLOCATE, allocation(replica_id, shard(f"{replica_id}/0", "gpu-01", index)))
    assert result["allocate"]["__typename"] == "Allocated", result
    listed = (await api(ALLOCATIONS))["allocations"]
    found: dict[str, Any] = next(a for a in listed if a["replicaId"] == replica_id)
    return found


@pytest.fixture
def databases(server_url: str) -> Iterator[tuple[str, str]]:
    """The inventory's database, and the name its copy at T (the restored one) will have."""
    url = create_database(server_url, prefix="llmgw_before_restore")
    upgrade(url)
    restored = with_database(url, urlsplit(url).path.lstrip("/") + "_at_t")
    yield url, restored
    drop_database(server_url, restored)
    drop_database(server_url, url)


async def copy_at_t(server_url: str, url: str, restored: str) -> None:
    conn = await asyncpg.connect(server_url)
    try:
        source = urlsplit(url).path.lstrip("/")
        target = urlsplit(restored).path.lstrip("/")
        await conn.execute(f'CREATE DATABASE "{target}" TEMPLATE "{source}"')
    finally:
        await conn.close()


async def test_after_a_restore_engines_placed_later_are_told_to_stop_and_fences_move_on(
    server_url: str, databases: tuple[str, str]
) -> None:
    url, restored = databases
    async with service(url) as (api, _):
        await api(REGISTER, {"input": node_input("gpu-01")})
        before = await place(api, "r-before", 0)
    target = datetime.now(UTC).isoformat()
    await copy_at_t(server_url, url, restored)  # what a restore to T brings back
    async with service(url) as (api, _):
        # Acknowledged after T: lost by the restore, while its engine runs on.
        after = await place(api, "r-after", 1)
    running = [
        {"shardId": before["shardId"], "fence": before["fence"]},
        {"shardId": after["shardId"], "fence": after["fence"]},
    ]
    async with service(restored) as (api, engine):
        # Without the fix-up the restored sequence stands at T: the later
        # engine's fence reads as never issued, and the whole heartbeat is refused.
        refused = await api.fails(BEAT, {"id": "gpu-01", "running": running})
        assert refused["extensions"]["field"] == "runningShards[1].fence"

        done = await in_transaction(engine, lambda conn: after_restore(conn, target))
        assert done.fence_after >= after["fence"]
        answer = (await api(BEAT, {"id": "gpu-01", "running": running}))["heartbeat"]
        # The shard the restored inventory does not hold is stopped; the one it holds is kept.
        assert answer["shardsToStop"] == [
            {"shardId": after["shardId"], "fence": after["fence"], "reason": "RELEASED"}
        ]
        held = (await api(ALLOCATIONS))["allocations"]
        assert [(a["replicaId"], a["gpuIndices"]) for a in held] == [("r-before", [0])]
        # GPU 1 is free again, and whoever gets it gets a fence the lost engine never had.
        again = await place(api, "r-new", 1)
        assert again["fence"] > after["fence"]
        events = (await api(EVENTS, {"kinds": ["restored"]}))["events"]
        assert len(events) == 1
        assert events[0]["detail"]["target"] == target
        assert events[0]["actor"] == "restore"
        assert target in events[0]["reason"]


def test_the_command_records_the_restore_and_refuses_a_bad_target(
    databases: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = databases
    monkeypatch.setenv("DATABASE_URL", url)
    assert main(["after-restore", "--target", "yesterday"]) == 2
    assert "target" in capsys.readouterr().err
    assert main(["after-restore", "--target", "latest", "--fence-floor", "5000"]) == 0
    assert "fences continue from 1005001" in capsys.readouterr().out

    async def events() -> list[Any]:
        conn = await asyncpg.connect(url)
        try:
            return list(await conn.fetch("SELECT kind, detail FROM events WHERE kind = 'restored'"))
        finally:
            await conn.close()

    found = asyncio.run(events())
    assert len(found) == 1 and '"fenceFloor": 5000' in found[0]["detail"]
