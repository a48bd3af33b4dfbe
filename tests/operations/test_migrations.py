"""Migrations take an empty database to the schema tables.py describes, and back."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import asyncpg  # type: ignore[import-untyped]
import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from service import (
    health_tables,  # noqa: F401 (fleet health's tables join the metadata)
    maintenance_tables,  # noqa: F401 (and maintenance windows')
    reservation_tables,  # noqa: F401 (and reservations')
    tenancy_tables,  # noqa: F401 (and tenancy's)
)
from service.database.migrations import downgrade, head_revision, upgrade
from service.tables import metadata
from tests.support import REPO
from tests.support.databases import create_database, drop_database


@pytest.fixture
def empty_database(server_url: str) -> Iterator[str]:
    url = create_database(server_url, prefix="llmgw_migrations")
    try:
        yield url
    finally:
        drop_database(server_url, url)


def sync_engine_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+asyncpg://", 1)


def inspect_tables(url: str) -> set[str]:
    async def run() -> set[str]:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(sync_engine_url(url))
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        await engine.dispose()
        return names

    return asyncio.run(run())


# Indexes with a column of another collation: alembic reflects an index
# column's collation as none, so it would see them differ from tables.py
# however they were built. Their definitions are compared exactly below
# (test_checks_computed_columns_and_indexes_are_what_the_migrations_made).
COLLATED_INDEXES = {"ix_shards_victim_order"}


def _compared(obj: object, name: str | None, type_: str, reflected: bool, other: object) -> bool:
    return not (type_ == "index" and name in COLLATED_INDEXES)


def schema_drift(url: str) -> list[object]:
    async def run() -> list[object]:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(sync_engine_url(url))
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda c: compare_metadata(
                    MigrationContext.configure(c, opts={"include_object": _compared}), metadata
                )
            )
        await engine.dispose()
        return list(diff)

    return asyncio.run(run())


def test_upgrade_from_empty_to_head_then_back_to_base(empty_database: str) -> None:
    upgrade(empty_database)
    assert {t.name for t in metadata.sorted_tables} <= inspect_tables(empty_database)
    assert schema_drift(empty_database) == []

    downgrade(empty_database, "base")
    assert inspect_tables(empty_database) <= {"alembic_version"}

    upgrade(empty_database)
    assert head_revision() is not None


@pytest.mark.process
def test_replicas_migrating_at_once_do_not_collide(empty_database: str) -> None:
    # Separate processes, as replicas starting together are: alembic's
    # context is process-global, so threads would not be the real thing.
    env = {**os.environ, "DATABASE_URL": empty_database}
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "service.cli", "migrate"],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(3)
    ]
    outcomes = [(run.wait(timeout=120), run.stderr.read() if run.stderr else b"") for run in runs]
    assert [code for code, _ in outcomes] == [0, 0, 0], outcomes
    assert schema_drift(empty_database) == []


# What compare_metadata does not compare: CHECK constraints, computed
# columns and index definitions (partial indexes' predicates among them), by
# table, as PostgreSQL prints them back.
_DEFINITIONS = """
SELECT cl.relname AS tbl, 'check ' || c.conname AS name, pg_get_constraintdef(c.oid) AS definition
FROM pg_constraint c JOIN pg_class cl ON cl.oid = c.conrelid
JOIN pg_namespace n ON n.oid = cl.relnamespace
WHERE n.nspname = 'public' AND c.contype = 'c'
UNION ALL
SELECT cl.relname, 'computed ' || a.attname, pg_get_expr(d.adbin, d.adrelid)
FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
JOIN pg_class cl ON cl.oid = a.attrelid JOIN pg_namespace n ON n.oid = cl.relnamespace
WHERE n.nspname = 'public' AND a.attgenerated <> ''
UNION ALL
SELECT tablename, 'index ' || indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
"""


def definitions(url: str) -> dict[tuple[str, str], str]:
    tables = {t.name for t in metadata.sorted_tables}

    async def run() -> dict[tuple[str, str], str]:
        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch(_DEFINITIONS)
        finally:
            await conn.close()
        return {(r["tbl"], r["name"]): r["definition"] for r in rows if r["tbl"] in tables}

    return asyncio.run(run())


def create_from_tables(url: str) -> None:
    async def run() -> None:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(sync_engine_url(url))
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        await engine.dispose()

    asyncio.run(run())


def test_checks_computed_columns_and_indexes_are_what_the_migrations_made(
    server_url: str, empty_database: str
) -> None:
    # tables.py builds its CHECKs and its computed state from service/bounds.py
    # and service/node_states.py: they must still say what the migrations wrote.
    upgrade(empty_database)
    fresh = create_database(server_url, prefix="llmgw_tables")
    try:
        create_from_tables(fresh)
        migrated, described = definitions(empty_database), definitions(fresh)
        assert ("nodes", "check ck_nodes_liveness") in migrated
        assert ("nodes", "computed state") in migrated
        assert described == migrated
    finally:
        drop_database(server_url, fresh)


# gpu_pools' columns migration 0018 fills for pools that exist when it runs.
_POOL_FACTS = (
    "SELECT node_id, gpu_class, nvlink_domain, fabrics, fabric_rates FROM gpu_pools"
    " ORDER BY node_id, gpu_class"
)


async def _register_mixed_cluster(url: str) -> list[tuple[object, ...]]:
    """Nodes on one fabric, two or none, GB200 trays in a domain or none, mixed classes: their pools."""
    from service.config import Settings
    from service.database.db import create_engine, dispose
    from service.web.app import create_app
    from tests.support.reports import REGISTER, node_input
    from tests.support.topology import IB_A, IB_B, gb200_tray, hgx_h100

    slow = dict(IB_B, rateGbps=200)
    reports = [
        node_input("hgx-a", gpus=hgx_h100(near=False), fabrics=[IB_A]),
        node_input("hgx-ab", gpus=hgx_h100(near=False), fabrics=[IB_A, slow]),
        node_input("hgx-none", gpus=hgx_h100(near=False)),
        node_input("tray-1", gpus=gb200_tray("nvl-1"), fabrics=[IB_B]),
        node_input("tray-2", gpus=gb200_tray(None), fabrics=[IB_A]),
        # One GPU of the class outside the others' domain: the pool has none.
        node_input("tray-mixed", gpus=gb200_tray("nvl-1")[:3] + gb200_tray("nvl-2")[3:]),
    ]
    settings = Settings(database_url=url)
    engine = create_engine(url, settings)
    try:
        app = create_app(settings, engine=engine)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
            for report in reports:
                answer = await client.post(
                    "/graphql", json={"query": REGISTER, "variables": {"input": report}}
                )
                assert not answer.json().get("errors"), answer.json()
        async with engine.connect() as conn:
            return [tuple(r) for r in (await conn.exec_driver_sql(_POOL_FACTS)).all()]
    finally:
        await dispose(engine)


def test_0018_fills_existing_pools_as_the_recount_writes_them(empty_database: str) -> None:
    # Pools written by the service at head; taken back to 0017 (the columns
    # dropped) and up again, the migration's fill must give what every
    # recount writes (availability.shared_nvlink_domain, gpu_pools.attached_fabrics).
    upgrade(empty_database)
    written = asyncio.run(_register_mixed_cluster(empty_database))
    assert {r[2] for r in written} >= {"nvl-1", ""}
    assert any(len(r[3]) == 2 for r in written)
    downgrade(empty_database, "0017")
    upgrade(empty_database)

    async def filled() -> list[tuple[object, ...]]:
        conn = await asyncpg.connect(empty_database)
        try:
            return [tuple(r) for r in await conn.fetch(_POOL_FACTS)]
        finally:
            await conn.close()

    assert asyncio.run(filled()) == written


async def _remediation_steps(url: str, reports: list[dict[str, object]]) -> dict[str, object]:
    """Send node reports (then a passing validation of GPU 1, if asked) to a service on `url`;
    GPU 1's taints and the remediations after."""
    from service.config import Settings
    from service.database.db import create_engine, dispose
    from service.web.app import create_app
    from tests.support.reports import REGISTER

    settings = Settings(database_url=url)
    engine = create_engine(url, settings)
    try:
        app = create_app(settings, engine=engine)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:

            async def ask(query: str, variables: dict[str, object]) -> dict[str, object]:
                answer = (
                    await client.post("/graphql", json={"query": query, "variables": variables})
                ).json()
                assert not answer.get("errors"), answer
                return dict(answer["data"])

            for report in reports:
                if report == {"validate": 1}:
                    await ask(
                        "mutation V($v: ValidationInput!) { recordValidation(input: $v) { id } }",
                        {"v": {"nodeId": "gpu-01", "gpuIndices": [1], "test": "dcgm_diag",
                               "passed": True}},
                    )  # fmt: skip
                else:
                    await ask(REGISTER, {"input": report})
            return await ask(
                '{ node(id: "gpu-01") { gpus { taints { key } } }'
                " remediations { gpuIndices action state } }",
                {},
            )
    finally:
        await dispose(engine)


def test_0021_gives_each_stored_remediation_its_opening_fault(empty_database: str) -> None:
    # A remediation stored before 0021 (taken back to 0020 and up again):
    # its DONE still lifts the taint it put, through the fault the migration wrote.
    from tests.support.reports import H100, gpus, node_input

    listed = gpus(H100)
    listed[1] = {**listed[1], "xids": [48]}
    upgrade(empty_database)
    before = asyncio.run(_remediation_steps(empty_database, [
        node_input("gpu-01", bootId="a"), node_input("gpu-01", bootId="a", gpus=listed)
    ]))  # fmt: skip
    assert before["node"]["gpus"][1]["taints"] == [{"key": "xid-48"}]  # type: ignore[index]
    downgrade(empty_database, "0020")
    upgrade(empty_database)
    after = asyncio.run(
        _remediation_steps(empty_database, [node_input("gpu-01", bootId="b"), {"validate": 1}])
    )
    assert after["remediations"] == [{"gpuIndices": [1], "action": "RESET_GPU", "state": "DONE"}]
    assert after["node"]["gpus"][1]["taints"] == []  # type: ignore[index]
