"""The database engine: one pool per process, sessions never shared."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service import connections
from service.config import Settings


def asyncpg_url(url: str) -> str:
    """Accept the plain postgresql:// URL every tool prints and point it at asyncpg.

    libpq spells a Unix socket directory as `?host=/run/pg`; asyncpg reads the
    same query parameter, so it passes through unchanged.
    """
    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme in {"postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg2"}:
        scheme = "postgresql+asyncpg"
    elif scheme != "postgresql+asyncpg":
        raise ValueError(f"DATABASE_URL={url!r}: expected a postgresql:// URL")
    query = urlencode(parse_qsl(parts.query))
    return urlunsplit((scheme, parts.netloc, parts.path, query, parts.fragment))


def libpq_url(url: str) -> str:
    """The same database as a plain postgresql:// URL, for asyncpg.connect and psql."""
    parts = urlsplit(url)
    return urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, parts.fragment))


def create_engine(url: str, settings: Settings) -> AsyncEngine:
    engine = create_async_engine(
        asyncpg_url(url),
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_timeout,
        # No ping on checkout: SQLAlchemy's asyncpg ping is three round trips
        # (BEGIN, a statement, ROLLBACK), measured as about 1.5 ms of CPU per
        # request here. A connection that outlived a PostgreSQL restart fails
        # its first statement instead; SQLAlchemy then invalidates every
        # connection pooled before that moment, so one request per process
        # answers "database unavailable" and the next ones reconnect.
        pool_pre_ping=False,
        connect_args={
            "timeout": settings.db_timeout,
            "server_settings": {"application_name": "llmgw-inventory"},
        },
    )
    # Writes run on asyncpg's own pool (service/connections.py), as many
    # connections at most as SQLAlchemy's pool may open.
    connections.attach(
        engine,
        connections.PoolSpec(
            max_size=settings.db_pool_size + settings.db_max_overflow, timeout=settings.db_timeout
        ),
    )
    return engine


async def dispose(engine: AsyncEngine) -> None:
    """Close both pools of the engine."""
    await connections.close(engine)
    await engine.dispose()
