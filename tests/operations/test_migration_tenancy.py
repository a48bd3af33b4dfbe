"""Migration 0022 on a database that already holds allocations: they become the default tenant's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
import pytest

from service.config import Settings
from service.database.db import create_engine, dispose
from service.database.migrations import downgrade, upgrade
from service.web.app import create_app
from tests.support.databases import create_database, drop_database
from tests.support.reports import A100, H100, REGISTER, gpus, node_input
from tests.support.tenancy import PLACE, TENANT


@pytest.fixture
def empty_database(server_url: str) -> Iterator[str]:
    url = create_database(server_url, prefix="llmgw_migrations")
    try:
        yield url
    finally:
        drop_database(server_url, url)


async def _ask(url: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    settings = Settings(database_url=url)
    engine = create_engine(url, settings)
    answers = []
    try:
        transport = httpx.ASGITransport(app=create_app(settings, engine=engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
            for query, variables in calls:
                body = (
                    await client.post("/graphql", json={"query": query, "variables": variables})
                ).json()
                assert not body.get("errors"), body
                answers.append(body["data"])
    finally:
        await dispose(engine)
    return answers


async def _rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(url)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


def test_0022_charges_existing_allocations_to_the_default_tenant(empty_database: str) -> None:
    upgrade(empty_database)
    mixed = gpus(H100, 4) + [dict(g, index=g["index"] + 4) for g in gpus(A100, 4)]
    shape = {"replicaId": "old-a", "gpuClass": "A100-40GB", "gpusPerShard": 2}
    asyncio.run(_ask(empty_database, [
        (REGISTER, {"input": node_input("gpu-01", gpus=mixed)}),
        (PLACE, {"input": {"replicaId": "old-h", "gpuClass": "H100-80GB", "gpusPerShard": 3}}),
        (PLACE, {"input": shape}),
    ]))  # fmt: skip
    # Back to before tenancy and up again: the rows the service wrote then.
    downgrade(empty_database, "0021")
    upgrade(empty_database)

    shards = asyncio.run(_rows(empty_database, "SELECT replica_id, tenant, priority, deployment,"
                               " borrowed FROM shards ORDER BY 1"))  # fmt: skip
    assert shards == [("old-a", "default", 0, None, True), ("old-h", "default", 0, None, True)]
    held = asyncio.run(_rows(empty_database, "SELECT tenant, gpu_class, count(*) FROM"
                             " allocated_gpus GROUP BY 1, 2 ORDER BY 2"))  # fmt: skip
    assert held == [("default", "A100-40GB", 2), ("default", "H100-80GB", 3)]
    (answer,) = asyncio.run(_ask(empty_database, [(TENANT, {"id": "default"})]))
    used = {u["gpuClass"]: (u["used"], u["borrowed"]) for u in answer["tenant"]["usage"]}
    assert used == {"A100-40GB": (2, 2), "H100-80GB": (3, 3)}
