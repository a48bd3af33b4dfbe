"""Test fixtures: a real PostgreSQL (embedded, or TEST_DATABASE_URL), never a mock.

One migrated template database per run, cloned into each test worker's
database (tests/support/databases.py); every test that touches the database
starts from empty tables. The tiers' markers and their guard live in
tests/support/tiers.py; helpers that test modules share, in tests/support/.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.database.db import create_engine, dispose, libpq_url
from service.web.app import create_app
from tests.support import paths, tiers
from tests.support.api import Api
from tests.support.databases import (
    SERVER_CPU,
    SERVER_ENV,
    TEMPLATE_ENV,
    create_database,
    drop_database,
    drop_template,
    embedded_server,
    empty,
    migrated_template,
)
from tests.support.live_service import LiveService, free_port
from tests.support.page_costs import Templates
from tests.support.snapshots import Snapshots
from tests.support.statements import StatementCounter

tiers.install()


def pytest_configure(config: pytest.Config) -> None:
    for name, description in tiers.MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    config.addinivalue_line("markers", paths.SEEDS_DESCRIPTION)


def _distributes(config: pytest.Config) -> bool:
    """True in xdist's controlling process, which runs no test itself."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", 0))


_started: list[Any] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under xdist: one server and one migrated template for every worker, before they start.

    (Without xdist the session fixtures below make them, and only when a test asks.)
    """
    config = session.config
    if not _distributes(config) or os.environ.get(TEMPLATE_ENV):
        return
    external = os.environ.get("TEST_DATABASE_URL")
    with tiers.infrastructure():
        if external:
            server = libpq_url(external)
        else:
            running = embedded_server()
            server = running.__enter__()
            _started.append(running)
        template = migrated_template(server)
    _started.append((server, template))
    os.environ[SERVER_ENV] = server
    os.environ[TEMPLATE_ENV] = template


def pytest_sessionfinish(session: pytest.Session) -> None:
    with tiers.infrastructure():
        while _started:
            started = _started.pop()
            if isinstance(started, tuple):
                drop_template(*started)
                os.environ.pop(SERVER_ENV, None)
                os.environ.pop(TEMPLATE_ENV, None)
            else:
                started.__exit__(None, None, None)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The CPU the tests' PostgreSQL used (`dev.py test` adds the test processes' own)."""
    if SERVER_CPU:
        terminalreporter.write_line(
            f"PostgreSQL (the tests' embedded server): {sum(SERVER_CPU):.0f} s CPU (user + system)"
        )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="only the in-process tier: leave out tests marked " + ", ".join(tiers.OUTSIDE),
    )
    parser.addoption(
        "--path",
        choices=("both", *paths.PATHS),
        default="both",
        help=(
            "which way the in-process service answers the stories (the `client` fixture and "
            "those built on it): both (the default: every story is also an equivalence test "
            "of the fast path against Strawberry's view alone), fast, or strawberry"
        ),
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Stories on both paths; a seeded family's seeds split between them (tests/support/paths.py).
    paths.parametrise(metafunc, metafunc.config.getoption("path"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers.mark_collected(items)
    if config.getoption("fast"):
        outside = [i for i in items if any(i.get_closest_marker(m) for m in tiers.OUTSIDE)]
        if outside:
            config.hook.pytest_deselected(items=outside)
            items[:] = [i for i in items if i not in set(outside)]
    tiers.group_for_xdist(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    with tiers.running(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    with tiers.running(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    with tiers.running(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A test that started an unmarked process fails, even if the code it ran swallowed the error."""
    report: pytest.TestReport = yield
    violations = tiers.take_violations()
    if violations and report.outcome != "failed":
        report.outcome = "failed"
        report.longrepr = "\n".join(violations)
    return report


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A PostgreSQL server to create throwaway databases on."""
    shared = os.environ.get(SERVER_ENV)
    if shared:
        yield shared
        return
    external = os.environ.get("TEST_DATABASE_URL")
    if external:
        yield libpq_url(external)
        return
    with tiers.infrastructure(), embedded_server() as url:
        yield url


@pytest.fixture(scope="session")
def template_database(server_url: str) -> Iterator[str]:
    """The name of a database at the latest migration that nobody connects to: clone it."""
    shared = os.environ.get(TEMPLATE_ENV)
    if shared:
        yield shared
        return
    name = migrated_template(server_url)
    try:
        yield name
    finally:
        drop_template(server_url, name)


@pytest.fixture(scope="session")
def page_cost_templates(server_url: str, template_database: str) -> Iterator[Templates]:
    """Page-cost clusters, each built once per session and cloned per case
    (tests/support/page_costs.py); a test that uses them is marked page_costs."""
    templates = Templates(server_url, template_database)
    try:
        yield templates
    finally:
        templates.drop_all()


@pytest.fixture(scope="session")
def snapshots() -> Snapshots:
    """Clusters built once per worker and copied back for each test after (tests/support/snapshots.py)."""
    return Snapshots()


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
def database_url(server_url: str, template_database: str) -> Iterator[str]:
    """This worker's database at the latest migration: a clone of the template."""
    url = create_database(server_url, template=template_database)
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


@pytest.fixture(autouse=True)
async def empty_tables(request: pytest.FixtureRequest) -> None:
    """Every test that touches the database starts from an empty inventory, ids from 1:
    through the engine, or through its URL alone (a `serve` process the test starts).
    Without the second, a token an earlier test left turned auth on for such a service,
    and it answered 401 (tests/operations/test_logs.py after tests/access_control)."""
    if "engine" in request.fixturenames:
        await empty(request.getfixturevalue("engine"))
    elif "database_url" in request.fixturenames:
        # Not the session engine: an async session fixture cannot be started
        # from here when no test before asked for it. One of its own, closed after.
        own = create_engine(request.getfixturevalue("database_url"), Settings())
        try:
            await empty(own)
        finally:
            await dispose(own)


@pytest.fixture
async def client(
    engine: AsyncEngine, settings: Settings, fast_path: bool
) -> AsyncIterator[httpx.AsyncClient]:
    """The in-process service, on each path in turn (tests/support/paths.py)."""
    app = create_app(settings.replace(fast_path=fast_path), engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as c:
        yield c


@pytest.fixture
async def unreachable_client(fast_path: bool) -> AsyncIterator[httpx.AsyncClient]:
    """The service in front of a PostgreSQL that does not answer (nothing listens there)."""
    settings = Settings(db_timeout=2, fast_path=fast_path)
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
        app = create_app(settings.replace(fast_path=direct), engine=engine)
        clients.append(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://inventory")
        )
    try:
        yield clients[0], clients[1]
    finally:
        for client in clients:
            await client.aclose()


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


@pytest.fixture
def live_service_factory(database_url: str, engine: AsyncEngine) -> Iterator[Any]:
    """Start service processes on the session database (emptied for this test, as every
    test's: a test that found an earlier one's nodes passed or failed by the order it ran
    in); all are stopped after the test."""
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
