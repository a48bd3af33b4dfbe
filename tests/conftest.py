"""Test fixtures: a real PostgreSQL (embedded, or TEST_DATABASE_URL), never a mock.

One throwaway database per test session, migrated to head; every test starts
from empty tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.database.db import create_engine, dispose, libpq_url
from service.database.migrations import upgrade
from service.web.app import create_app

REPO = Path(__file__).resolve().parent.parent


def with_database(url: str, name: str) -> str:
    parts = urlsplit(libpq_url(url))
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A PostgreSQL server to create throwaway databases on."""
    external = os.environ.get("TEST_DATABASE_URL")
    if external:
        yield libpq_url(external)
        return
    from service.database.embedded import EmbeddedPostgres

    # Under /tmp: the server runs as an unprivileged user that must be able
    # to traverse every parent of its data directory.
    root = Path(tempfile.mkdtemp(prefix="llmgw-test-pg-", dir="/tmp"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "data")
    try:
        yield libpq_url(server.url)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def create_database(server: str, prefix: str = "llmgw_test") -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"

    async def create() -> None:
        conn = await asyncpg.connect(server)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return with_database(server, name)


def drop_database(server: str, url: str) -> None:
    name = urlsplit(url).path.lstrip("/")

    async def drop() -> None:
        conn = await asyncpg.connect(server)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.fixture
def own_postgres() -> Iterator[Path]:
    """A data directory for an embedded PostgreSQL this test may stop and start."""
    root = Path(tempfile.mkdtemp(prefix="llmgw-fault-pg-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root / "data"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    """A fresh database at the latest migration, for this test session."""
    url = create_database(server_url)
    upgrade(url)
    try:
        yield url
    finally:
        drop_database(server_url, url)


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings(max_page_size=2000)


@pytest.fixture(scope="session")
async def engine(database_url: str, settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url, settings)
    try:
        yield engine
    finally:
        await dispose(engine)


TABLES = (
    "allocated_gpus, shards, gpu_pools, gpus, fabric_attachments, filesystems, weights, "
    "events, api_tokens, taints, validation_results, remediation_faults, remediations, "
    "drift_findings, "
    "hardware_profiles, nodes, group_members, "
    "placement_groups, replicas"
)


EMPTY = f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"


@pytest.fixture(autouse=True)
async def empty_tables(request: pytest.FixtureRequest) -> None:
    """Every test that touches the database starts from an empty inventory: through the
    engine, or through its URL alone (a `serve` process the test starts). Without the
    second, a token an earlier test left turned auth on for such a service, and it
    answered 401 (tests/operations/test_logs.py after tests/access_control)."""
    if "engine" in request.fixturenames:
        engine: AsyncEngine = request.getfixturevalue("engine")
        async with engine.begin() as conn:
            await conn.exec_driver_sql(EMPTY)
    elif "database_url" in request.fixturenames:
        conn = await asyncpg.connect(request.getfixturevalue("database_url"))
        try:
            await conn.execute(EMPTY)
        finally:
            await conn.close()


@pytest.fixture
async def client(engine: AsyncEngine, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as c:
        yield c


@pytest.fixture
async def unreachable_client() -> AsyncIterator[httpx.AsyncClient]:
    """The service in front of a PostgreSQL that does not answer (nothing listens there)."""
    settings = Settings(db_timeout=2)
    engine = create_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres", settings)
    try:
        app = create_app(settings, engine=engine)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as c:
            yield c
    finally:
        await dispose(engine)


@pytest.fixture
async def both(
    engine: AsyncEngine, settings: Settings
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Two apps on one database: direct execution on (the default), and Strawberry's view alone."""
    clients = []
    for direct in (True, False):
        app = create_app(settings.replace(direct_execution=direct), engine=engine)
        clients.append(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://inventory")
        )
    try:
        yield clients[0], clients[1]
    finally:
        for client in clients:
            await client.aclose()


class GraphQLFailure(AssertionError):
    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors[0].get("message") if errors else "no errors")
        self.errors = errors

    @property
    def first(self) -> dict[str, Any]:
        return self.errors[0]


@dataclass
class Api:
    """A GraphQL client the way a scheduler, agent or operator script would use it."""

    client: httpx.AsyncClient
    headers: dict[str, str] | None = None

    async def raw(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = await self.client.post(
            "/graphql", json={"query": query, "variables": variables or {}}, headers=self.headers
        )
        assert response.status_code < 500, response.text
        body: dict[str, Any] = response.json()
        return body

    async def __call__(self, query: str, variables: dict[str, Any] | None = None) -> Any:
        body = await self.raw(query, variables)
        if body.get("errors"):
            raise GraphQLFailure(body["errors"])
        return body["data"]

    async def fails(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """The first error of a request that must fail; the test fails if it succeeds."""
        body = await self.raw(query, variables)
        assert body.get("errors"), f"expected an error, got {body}"
        first: dict[str, Any] = body["errors"][0]
        return first


@pytest.fixture
def api(client: httpx.AsyncClient) -> Api:
    return Api(client)


@pytest.fixture
def api_as(client: httpx.AsyncClient, engine: AsyncEngine) -> Any:
    """`await api_as("scheduler")` (or `api_as("agent", node_id="gpu-07")`): an Api sending a
    new token of that role. Once a test makes one, tokens are in force for its app: the plain
    `api` fixture is then refused (HTTP 401)."""
    from service.access_control import tokens

    async def make(role: str, node_id: str | None = None) -> Api:
        async with engine.begin() as conn:
            created = await tokens.create_token(conn, role, node_id, description=f"test {role}")
        return Api(client, headers={"Authorization": f"Bearer {created.secret}"})

    return make


class StatementCounter:
    def __init__(self) -> None:
        self.count = 0
        self.statements: list[str] = []
        # Transactions opened on asyncpg's pool (their BEGIN is not a statement here).
        self.transactions = 0

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement == "BEGIN":
            self.transactions += 1
            return
        self.count += 1
        self.statements.append(statement)


@pytest.fixture
def count_statements(engine: AsyncEngine) -> Iterator[StatementCounter]:
    from service.database import connections

    counter = StatementCounter()

    def native(statement: str, args: Sequence[Any]) -> None:
        counter(None, None, statement)

    # Reads go through SQLAlchemy, writes through asyncpg's pool: count both.
    event.listen(engine.sync_engine, "before_cursor_execute", counter)
    connections.statement_observers.append(native)
    try:
        yield counter
    finally:
        connections.statement_observers.remove(native)
        event.remove(engine.sync_engine, "before_cursor_execute", counter)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LiveService:
    """`llmgw-inventory serve` in its own process, as an operator would run it."""

    database_url: str
    port: int
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/graphql"

    def start(self, timeout: float = 60.0) -> None:
        # No drain on SIGTERM unless a test asks for one (test_graceful_shutdown.py):
        # each stop would cost INVENTORY_SHUTDOWN_DRAIN seconds.
        env = {
            "INVENTORY_SHUTDOWN_DRAIN": "0",
            **os.environ,
            **self.env,
            "DATABASE_URL": self.database_url,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port)],
            env=env,
            cwd=REPO,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited with {self.process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError("service did not start in time")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def live_service_factory(database_url: str) -> Iterator[Any]:
    """Start service processes on the session database; all are stopped after the test."""
    started: list[LiveService] = []

    def start(env: dict[str, str] | None = None) -> LiveService:
        service = LiveService(database_url=database_url, port=free_port(), env=env or {})
        service.start()
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()


@pytest.fixture
def live_service(live_service_factory: Any, engine: AsyncEngine) -> LiveService:
    """One service process on the session database (emptied for this test)."""
    service: LiveService = live_service_factory()
    return service


@pytest.fixture
def service_url(live_service: LiveService) -> str:
    return live_service.url
