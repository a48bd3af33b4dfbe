"""The domain's text() statements on asyncpg's own pool: bound, compiled and scoped as SQLAlchemy would."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections


async def test_a_statement_built_per_request_is_compiled_once_and_binds_by_name(
    engine: AsyncEngine,
) -> None:
    sql = "SELECT CAST(:n AS int) + CAST(:n AS int) AS twice, CAST(:label AS text) AS label"
    async with connections.autocommit(engine) as conn:
        # Two statement objects of one text, as placement and paging build them.
        first = (await conn.execute(text(sql), {"n": 2, "label": "a"})).one()
        compiled = connections.compile_text(text(sql))
        second = (await conn.execute(text(sql), {"label": "b", "n": 5})).one()

    assert (first.twice, first["label"], first[0]) == (4, "a", 4)
    assert (second.twice, second.label) == (10, "b")
    # One $n per name, however often it is used.
    assert compiled[1] == ("n", "label") and "$3" not in compiled[0]
    assert connections._compiled[sql] is compiled


async def test_a_statement_missing_a_parameter_is_refused_before_it_is_sent(
    engine: AsyncEngine,
) -> None:
    async with connections.autocommit(engine) as conn:
        with pytest.raises(TypeError, match="needs parameters"):
            await conn.execute(text("SELECT CAST(:a AS int), CAST(:b AS int)"), {"a": 1})


async def test_a_failed_transaction_writes_nothing_and_a_failed_savepoint_only_its_part(
    engine: AsyncEngine,
) -> None:
    insert = text("INSERT INTO events (kind) VALUES (:kind)")
    count = text("SELECT count(*) FROM events WHERE kind LIKE 'test-conn-%'")

    with pytest.raises(RuntimeError):
        async with connections.transaction(engine) as conn:
            await conn.execute(insert, {"kind": "test-conn-lost"})
            raise RuntimeError("the request failed after its first write")

    async with connections.transaction(engine) as conn:
        await conn.execute(insert, {"kind": "test-conn-kept"})
        savepoint = await conn.begin_nested()
        await conn.execute(insert, {"kind": "test-conn-undone"})
        await savepoint.rollback()

    async with connections.autocommit(engine) as conn:
        assert await conn.scalar(count) == 1
        kinds = (
            await conn.execute(text("SELECT kind FROM events WHERE kind LIKE 'test-conn-%'"))
        ).scalars()
    assert kinds == ["test-conn-kept"]
