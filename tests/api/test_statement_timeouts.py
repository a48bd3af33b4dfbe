"""A statement PostgreSQL cancels at its statement_timeout is an answer, not a bug.

Issue 44: on a loaded machine a `node(id) { gpus {...} }` read on Strawberry's
route was cancelled by the statement timeout (service/fleet/node_details.py
gpus_of, through the node loader) and answered INTERNAL_ERROR with a
traceback in the log. Every statement of the service carries a
statement_timeout (Settings.statement_timeout); here the service runs with a
short one, and each statement is made to wait for it on a lock another
session holds (LOCK TABLE ... ACCESS EXCLUSIVE): whatever the machine's
speed, the statement cannot finish first. On both routes, reads and writes
and the token check: the documented code (REQUEST_TIMEOUT, docs/scheduler/errors.md),
Retry-After, one log line, no traceback.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import tokens
from service.config import Settings
from service.database.db import create_engine, dispose
from service.metrics import COUNTERS
from service.web.app import create_app
from tests.support.api import Api
from tests.support.reports import REGISTER, node_input

Both = tuple[httpx.AsyncClient, httpx.AsyncClient]
TIMED_OUT = "REQUEST_TIMEOUT"
NODE_WITH_GPUS = "query($id: ID!) { node(id: $id) { id gpus { index } } }"


@dataclass(frozen=True)
class ShortStatements:
    """The settings an engine's pools are made from (db.PoolSettings), statements short."""

    base: Settings
    statement_timeout: float = 0.2

    @property
    def db_pool_size(self) -> int:
        return self.base.db_pool_size

    @property
    def db_max_overflow(self) -> int:
        return self.base.db_max_overflow

    @property
    def db_timeout(self) -> float:
        return self.base.db_timeout

    @property
    def write_retry(self) -> float:
        return self.base.write_retry

    @property
    def read_database_url(self) -> str | None:
        return None

    @property
    def read_max_lag(self) -> float:
        return self.base.read_max_lag


@pytest.fixture
async def short(database_url: str, settings: Settings, engine: AsyncEngine) -> AsyncIterator[Both]:
    """The fast path on, and Strawberry's view alone, over an engine whose statements stop
    after 0.2 s (the request's own time limit stays 30 s)."""
    timing_out = create_engine(database_url, ShortStatements(settings))
    clients = [
        httpx.AsyncClient(
            transport=httpx.ASGITransport(
                app=create_app(settings.replace(fast_path=direct), engine=timing_out)
            ),
            base_url="http://inventory",
        )
        for direct in (True, False)
    ]
    try:
        yield clients[0], clients[1]
    finally:
        for client in clients:
            await client.aclose()
        await dispose(timing_out)


@asynccontextmanager
async def locked(engine: AsyncEngine, table: str) -> AsyncIterator[None]:
    """`table` locked by another session: every statement that touches it waits."""
    async with engine.connect() as holder:
        await holder.begin()
        await holder.execute(text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        try:
            yield
        finally:
            await holder.rollback()


def without_request_ids(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: without_request_ids(v) for k, v in body.items() if k != "requestId"}
    if isinstance(body, list):
        return [without_request_ids(v) for v in body]
    return body


def one_line_no_traceback(records: list[logging.LogRecord]) -> None:
    said = [r for r in records if TIMED_OUT in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in records]
    assert said[0].levelno == logging.WARNING
    assert [r for r in records if r.exc_info or r.levelno >= logging.ERROR] == []


async def test_a_read_whose_statement_times_out_answers_request_timeout_on_both_routes(
    short: Both, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    await Api(short[0])(REGISTER, {"input": node_input("gpu-07")})
    before = COUNTERS.snapshot()[2].get(("node", "declined", "statement_timeout"), 0)
    answers = []
    async with locked(engine, "gpus"):
        for client in short:
            caplog.clear()
            with caplog.at_level(logging.INFO):
                response = await client.post(
                    "/graphql", json={"query": NODE_WITH_GPUS, "variables": {"id": "gpu-07"}}
                )
            assert response.status_code == 200
            assert response.headers["retry-after"] == "1"
            body = response.json()
            [error] = body["errors"]
            assert error["extensions"]["code"] == TIMED_OUT, body
            assert "statement_timeout" in error["message"] and "retry" in error["message"]
            one_line_no_traceback(caplog.records)
            answers.append(without_request_ids(body))
    assert answers[0] == answers[1]
    # The compiled node route declined it, and graphql-core's read timed out as well.
    after = COUNTERS.snapshot()[2].get(("node", "declined", "statement_timeout"), 0)
    assert after - before == 1
    # Once the lock is gone, the same read is answered.
    node = await Api(short[1])(NODE_WITH_GPUS, {"id": "gpu-07"})
    assert len(node["node"]["gpus"]) == 8


async def test_a_page_whose_statement_times_out_answers_request_timeout(
    short: Both, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    await Api(short[0])(REGISTER, {"input": node_input("gpu-07")})
    async with locked(engine, "gpus"):
        for client in short:
            caplog.clear()
            with caplog.at_level(logging.INFO):
                response = await client.post(
                    "/graphql", json={"query": "{ nodes(first: 5) { id gpus { index } } }"}
                )
            assert response.headers["retry-after"] == "1"
            codes = {e["extensions"]["code"] for e in response.json()["errors"]}
            assert codes == {TIMED_OUT}
            one_line_no_traceback(caplog.records)


async def test_a_write_whose_statement_times_out_answers_request_timeout_and_keeps_nothing(
    short: Both, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    api = Api(short[0])
    await api(REGISTER, {"input": node_input("gpu-07", hostname="before")})
    async with locked(engine, "gpus"):
        for client in short:  # the compiled registration, then Strawberry's view
            caplog.clear()
            with caplog.at_level(logging.INFO):
                report = node_input("gpu-07", hostname="after", gpus=[])
                response = await client.post(
                    "/graphql", json={"query": REGISTER, "variables": {"input": report}}
                )
            assert response.headers["retry-after"] == "1"
            [error] = response.json()["errors"]
            assert error["extensions"]["code"] == TIMED_OUT
            one_line_no_traceback(caplog.records)
    node = await api('{ node(id: "gpu-07") { hostname gpus { index } } }')
    assert node["node"]["hostname"] == "before" and len(node["node"]["gpus"]) == 8


async def test_a_token_check_whose_statement_times_out_is_a_503_with_retry_after(
    short: Both, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    async with engine.begin() as conn:
        created = await tokens.create_token(conn, "reader", None, description="reader")
    async with locked(engine, "api_tokens"):
        for client in short:
            caplog.clear()
            with caplog.at_level(logging.INFO):
                response = await client.post(
                    "/graphql",
                    json={"query": "{ __typename }"},
                    headers={"Authorization": f"Bearer {created.secret}"},
                )
            assert response.status_code == 503
            assert response.headers["retry-after"] == "1"
            [error] = response.json()["errors"]
            assert error["extensions"]["code"] == TIMED_OUT
            one_line_no_traceback(caplog.records)
