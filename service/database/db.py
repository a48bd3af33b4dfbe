"""The database engine: one pool per process, sessions never shared."""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import URL, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service.database import connections, database_url, db_faults, read_routing

APPLICATION_NAME = "llmgw-inventory"


class PoolSettings(Protocol):
    """The settings an engine's pools are sized by (service/config.py's Settings has them).

    A protocol, not the Settings class: configuration sits above the
    database layer (it reads database_url), so the database imports nothing
    from it.
    """

    @property
    def db_pool_size(self) -> int: ...
    @property
    def db_max_overflow(self) -> int: ...
    @property
    def db_timeout(self) -> float: ...
    @property
    def statement_timeout(self) -> float | None: ...
    @property
    def write_retry(self) -> float: ...
    @property
    def read_database_url(self) -> str | None: ...
    @property
    def read_max_lag(self) -> float: ...


def asyncpg_url(url: str) -> str:
    """The plain postgresql:// URL every tool prints, as SQLAlchemy's asyncpg driver names it.

    Single-host URLs only (alembic's offline mode, tests): the service itself
    connects through `engine_for`, which takes the multi-host form too.
    """
    database = database_url.parse(url)
    return "postgresql+asyncpg" + database.dsn.removeprefix("postgresql")


def libpq_url(url: str) -> str:
    """The same database as a plain postgresql:// URL, for asyncpg.connect and psql."""
    return database_url.parse(url).dsn


def engine_for(
    url: str,
    *,
    connect_timeout: float = 5.0,
    statement_timeout: float | None = None,
    **options: Any,
) -> AsyncEngine:
    """A SQLAlchemy engine whose connections asyncpg opens from the libpq URL, one host or several.

    SQLAlchemy never parses the URL (it rejects `h1:5432,h2:5432`):
    database_url.connect tries the hosts in order, each with its own timeout,
    and keeps the first that matches `target_session_attrs`. A reconnect after a failover is just the next
    connect. The engine's own `url` only names the user and database.
    """
    database = database_url.parse(url)
    server_settings = session_settings(statement_timeout)

    async def connect() -> Any:
        return await database_url.connect(
            database.dsn, timeout=connect_timeout, server_settings=server_settings
        )

    shown = URL.create("postgresql+asyncpg", username=database.user, database=database.database)
    engine = create_async_engine(shown, async_creator=connect, **options)
    event.listen(engine.sync_engine, "handle_error", _drop_unusable)
    return engine


def _drop_unusable(context: ExceptionContext) -> None:
    """SQLAlchemy's pool: a connection left unusable is invalidated, and the pool with it.

    SQLAlchemy already does so for what its asyncpg dialect calls a
    disconnect; a demoted primary's "read-only transaction" or a terminated
    session is one too for this service (db_faults.connection_unusable), so
    no pooled connection to that server is handed out again.
    """
    reason = db_faults.connection_unusable(context.original_exception)
    if reason is not None:
        context.is_disconnect = True
        connections.DROPPED.count(reason)


def session_settings(statement_timeout: float | None) -> dict[str, str]:
    """The settings each of the service's connections starts with.

    statement_timeout (Settings.statement_timeout) in milliseconds, at least
    one: PostgreSQL reads 0 as "no limit".
    """
    found = {"application_name": APPLICATION_NAME}
    if statement_timeout is not None:
        found["statement_timeout"] = str(max(1, round(statement_timeout * 1000)))
    return found


def create_engine(url: str, settings: PoolSettings) -> AsyncEngine:
    engine = engine_for(
        url,
        connect_timeout=settings.db_timeout,
        statement_timeout=settings.statement_timeout,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_timeout,
        # No ping on checkout: SQLAlchemy's asyncpg ping is three round trips
        # (BEGIN, a statement, ROLLBACK) on every request. A connection that outlived a PostgreSQL restart fails
        # its first statement instead; SQLAlchemy then invalidates every
        # connection pooled before that moment, so one request per process
        # answers "database unavailable" and the next ones reconnect.
        pool_pre_ping=False,
    )
    # Writes run on asyncpg's own pool (service/database/connections.py), as many
    # connections at most as SQLAlchemy's pool may open.
    spec = connections.PoolSpec(
        max_size=settings.db_pool_size + settings.db_max_overflow,
        timeout=settings.db_timeout,
        write_retry=settings.write_retry,
        server_settings=session_settings(settings.statement_timeout),
    )
    connections.attach(engine, spec, dsn=libpq_url(url))
    if settings.read_database_url:
        # Reads that tolerate staleness, on the replicas while they keep up
        # (service/database/read_routing.py).
        read_routing.attach(engine, settings.read_database_url, spec, settings.read_max_lag)
    return engine


async def dispose(engine: AsyncEngine) -> None:
    """Close both pools of the engine, and its read replicas' pools."""
    await read_routing.close(engine)
    await connections.close(engine)
    await engine.dispose()
