"""Transactions on asyncpg's own pool, for the writes.

BEGIN, one statement and COMMIT through SQLAlchemy's AsyncEngine pay, in
the client, greenlet switches per call, a pool checkout and reset and result
objects; on a connection from asyncpg's pool they pay none of that. Every
mutation pays it, so writes run here. The domain's SQL stays the same `text()` statements: each is compiled
once by SQLAlchemy's own asyncpg compiler (`:name` to `$n`, `::casts` and
escapes handled as everywhere else) and the rows answer the same way
(`row.col`, `row[0]`, `.one()`, `.scalar_one()`...), so a domain function
does not know, or care, which connection it was given.
"""

from __future__ import annotations

import asyncio
import functools
import json
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import TextClause, text
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.exc import MultipleResultsFound, NoResultFound
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.types import NullType

from service.database import database_url, db_faults, request_state
from service.database.request_state import ClientDeadline, DeadlinePassed


class Savepoint(Protocol):
    @property
    def is_active(self) -> bool: ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...


class Connection(Protocol):
    """What the domain modules need of a connection; SQLAlchemy's AsyncConnection is one too."""

    async def execute(self, statement: TextClause, parameters: Any = None) -> Any: ...

    async def scalar(self, statement: TextClause, parameters: Any = None) -> Any: ...

    def begin_nested(self) -> Awaitable[Any]: ...


class Row(asyncpg.Record):  # type: ignore[misc]
    """A row read by position (`row[0]`), by name (`row["id"]`) or as `row.id`, as SQLAlchemy's."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(self.items())


class NativeRows:
    """The fetched rows of one statement, answering as SQLAlchemy's Result does."""

    __slots__ = ("_rows",)

    def __init__(self, rows: list[Row]) -> None:
        self._rows = rows

    def __iter__(self) -> Iterator[Row]:
        return iter(self._rows)

    def all(self) -> list[Row]:
        return list(self._rows)

    def first(self) -> Row | None:
        return self._rows[0] if self._rows else None

    def one_or_none(self) -> Row | None:
        if len(self._rows) > 1:
            raise MultipleResultsFound("Multiple rows were found when one or none was required")
        return self.first()

    def one(self) -> Row:
        if not self._rows:
            raise NoResultFound("No row was found when one was required")
        if len(self._rows) > 1:
            raise MultipleResultsFound("Multiple rows were found when exactly one was required")
        return self._rows[0]

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalar_one_or_none(self) -> Any:
        row = self.one_or_none()
        return None if row is None else row[0]

    def scalars(self) -> list[Any]:
        return [row[0] for row in self._rows]


_DIALECT = asyncpg_dialect()  # type: ignore[no-untyped-call]

# Compiled forms by SQL text, not by statement object: placement, paging and
# filters build their statement per request from a few fixed shapes, and a
# cache keyed on the object missed every time (SQLAlchemy's compile was a
# fifth of a `place`). Bounded, so a statement text that somehow varied
# without limit would cost compiles, never memory.
_compiled: dict[str, tuple[str, tuple[str, ...]]] = {}
_MAX_COMPILED = 2048


def compile_text(statement: TextClause) -> tuple[str, tuple[str, ...]]:
    """The statement as asyncpg takes it (`$1`, `$2`...) and the parameter names in that order.

    A name used twice is one `$n`.
    """
    found = _compiled.get(statement.text)
    if found is None:
        compiled = statement.compile(dialect=_DIALECT)
        found = (compiled.string, tuple(compiled.positiontup or ()))
        # A typed bindparam could compile differently from the same text.
        untyped = all(isinstance(b.type, NullType) for b in statement._bindparams.values())
        if untyped and len(_compiled) < _MAX_COMPILED:
            _compiled[statement.text] = found
    return found


@functools.lru_cache(maxsize=512)
def cached_text(sql: str) -> TextClause:
    """text(sql), made once per distinct SQL: its bind names are parsed once, not per request."""
    return text(sql)


# Test hook: called with the SQL (and its arguments) of each round trip
# before it is sent: statements, savepoints and "BEGIN" (the statement-count
# tests count both kinds of connection and tell transactions from autocommit;
# the benchmark EXPLAINs the statement exactly as sent).
statement_observers: list[Callable[[str, Sequence[Any]], None]] = []


def _observe(sql: str, args: Sequence[Any] = ()) -> None:
    for observe in statement_observers:
        observe(sql, args)


class NativeSavepoint:
    """A SAVEPOINT of a NativeConnection's transaction, sent as plain SQL.

    The transaction itself is BEGIN and COMMIT sent by `transaction` (not
    asyncpg's Transaction object, which refuses savepoints in a transaction
    it did not start), so its savepoints are plain statements too.
    """

    __slots__ = ("_active", "_name", "_raw")

    def __init__(self, raw: Any, name: str) -> None:
        self._raw = raw
        self._name = name
        self._active = True

    @property
    def is_active(self) -> bool:
        return self._active

    async def commit(self) -> None:
        self._active = False
        if statement_observers:
            _observe("RELEASE SAVEPOINT")
        await self._raw.execute(f"RELEASE SAVEPOINT {self._name}")

    async def rollback(self) -> None:
        self._active = False
        if statement_observers:
            _observe("ROLLBACK TO SAVEPOINT")
        await self._raw.execute(f"ROLLBACK TO SAVEPOINT {self._name}")

    def keep(self) -> None:
        """Keep the savepoint's work without a RELEASE: the transaction's COMMIT commits it too.

        A savepoint left open holds nothing more than a released one (its
        locks and rows are the transaction's either way); the statements
        after it run inside it, which only matters to a later rollback to it,
        and it is no longer active, so none comes. A round trip fewer.
        """
        self._active = False


async def keep_until_commit(savepoint: Any) -> None:
    """NativeSavepoint.keep, or a RELEASE for a savepoint of another kind (SQLAlchemy's)."""
    if isinstance(savepoint, NativeSavepoint):
        savepoint.keep()
    else:
        await savepoint.commit()


class NativeConnection:
    """One asyncpg connection, inside a transaction or in autocommit."""

    __slots__ = ("_savepoints", "raw")

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._savepoints = 0

    async def execute(
        self, statement: TextClause, parameters: Mapping[str, Any] | None = None
    ) -> NativeRows:
        sql, names = compile_text(statement)
        try:
            args: Sequence[Any] = [parameters[n] for n in names] if names else ()  # type: ignore[index]
        except (KeyError, TypeError):
            # A programming error, said plainly rather than as a bare KeyError.
            raise TypeError(
                f"statement needs parameters {list(names)}, got {parameters!r}"
            ) from None
        if statement_observers:
            _observe(sql, args)
        return NativeRows(await self.raw.fetch(sql, *args))

    async def scalar(
        self, statement: TextClause, parameters: Mapping[str, Any] | None = None
    ) -> Any:
        return (await self.execute(statement, parameters)).scalar()

    async def begin_nested(self) -> NativeSavepoint:
        self._savepoints += 1
        name = f"sp_{self._savepoints}"
        if statement_observers:
            _observe("SAVEPOINT")
        await self.raw.execute(f"SAVEPOINT {name}")
        return NativeSavepoint(self.raw, name)


class Dropped:
    """Connections dropped by this process because they became unusable, by reason (/metrics)."""

    def __init__(self) -> None:
        self.by_reason: dict[str, int] = {}

    def count(self, reason: str) -> None:
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1


DROPPED = Dropped()


@dataclass(frozen=True)
class PoolSpec:
    max_size: int
    timeout: float
    # Seconds a write that found the database away is tried again
    # (INVENTORY_WRITE_RETRY; service/database/transactions.py).
    write_retry: float = 0.0
    # What each connection starts with (db.session_settings).
    server_settings: Mapping[str, str] = field(
        default_factory=lambda: {"application_name": "llmgw-inventory"}
    )

    @property
    def statement_timeout_ms(self) -> int | None:
        """Each session's statement_timeout (db.session_settings), when it has one."""
        value = self.server_settings.get("statement_timeout")
        return None if value is None else int(value)


class Pool:
    """asyncpg's pool for one engine's database, opened on first use (it needs the running loop)."""

    def __init__(self, dsn: str, spec: PoolSpec) -> None:
        self.dsn = dsn
        self.spec = spec
        self._pool: Any = None
        self._opening = asyncio.Lock()

    async def get(self) -> Any:
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    self._pool = await asyncpg.create_pool(
                        self.dsn,
                        # Each host of a multi-host URL with its own timeout.
                        connect=database_url.connect,
                        # No idle connections held open: a process that only
                        # reads never opens one here.
                        min_size=0,
                        max_size=self.spec.max_size,
                        timeout=self.spec.timeout,
                        command_timeout=None,
                        init=_init_connection,
                        record_class=Row,
                        # asyncpg's default reset is a round trip per release
                        # (advisory unlock, CLOSE ALL, UNLISTEN, RESET ALL).
                        # Nothing here leaves session state behind: the only
                        # advisory lock is transaction-level, nothing LISTENs
                        # or SETs on these connections, and a transaction left
                        # open by a failure is rolled back by asyncpg itself.
                        reset=_no_reset,
                        server_settings=dict(self.spec.server_settings),
                    )
        return self._pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A pooled connection; one that failed in a way that leaves it unusable is never reused.

        Dropped at once (closed, not returned to the pool), and every other
        connection the pool opened before then is closed instead of being
        handed out again: after a demotion, a restart or a failover they all
        lead to the same server that can no longer serve. The next ones are
        opened afresh, through DATABASE_URL's hosts, so they find the new
        primary (database_url.connect).
        """
        pool = await self.get()
        async with pool.acquire(timeout=self.spec.timeout) as raw:
            try:
                yield raw
            except BaseException as error:
                reason = db_faults.connection_unusable(error)
                if reason is not None:
                    close_now(raw)
                    await pool.expire_connections()
                    DROPPED.count(reason)
                raise

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()


async def _no_reset(connection: Any) -> None:
    return None


async def _init_connection(connection: Any) -> None:
    # The same decoding as SQLAlchemy's asyncpg dialect, so a domain function
    # reads json the same from either connection: parameters are JSON text,
    # values come back as Python objects.
    for type_name in ("json", "jsonb"):
        await connection.set_type_codec(
            type_name, encoder=_json_text, decoder=json.loads, schema="pg_catalog"
        )


def _json_text(value: str) -> str:
    return value


_pools: weakref.WeakKeyDictionary[AsyncEngine, Pool] = weakref.WeakKeyDictionary()


def attach(engine: AsyncEngine, spec: PoolSpec, dsn: str | None = None) -> None:
    """Give the engine its native pool, to the same database (`dsn`, libpq's form), opened on first use."""
    if dsn is None:
        dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    _pools[engine] = Pool(dsn, spec)


def dsn_of(engine: AsyncEngine) -> str:
    """The libpq URL the engine's connections are opened from (several hosts, when failing over)."""
    return _pool_of(engine).dsn


def spec_of(engine: AsyncEngine) -> PoolSpec:
    """The engine's pool settings (its connection timeout, its writes' retry window)."""
    return _pool_of(engine).spec


def _pool_of(engine: AsyncEngine) -> Pool:
    pool = _pools.get(engine)
    if pool is None:
        # An engine made elsewhere (alembic, a test) still works.
        attach(engine, PoolSpec(max_size=10, timeout=5.0))
        pool = _pools[engine]
    return pool


async def close(engine: AsyncEngine) -> None:
    pool = _pools.pop(engine, None)
    if pool is not None:
        await pool.close()


@asynccontextmanager
async def transaction(
    engine: AsyncEngine, deadline: ClientDeadline | Literal["request"] | None = "request"
) -> AsyncIterator[NativeConnection]:
    """One transaction on a pooled connection: committed when the block ends, rolled back on error.

    COMMIT that fails on the connection's side (the connection lost, the
    session terminated while it ran) raises db_faults.CommitOutcomeUnknown:
    the server may have committed (PostgreSQL writes its commit record
    before it waits for a synchronous standby, and a session terminated in
    that wait is committed locally). A COMMIT the server refused rolled back.

    `deadline`: when the client stops waiting ("request": the running
    request's, request_state; None: none). A transaction that would commit
    after it is rolled back instead (DeadlinePassed): checked before BEGIN,
    by a statement_timeout no longer than the time left, in the service just
    before COMMIT, and by the server itself in the message that carries the
    COMMIT (inventory_commit_by, migration 0017), so a COMMIT that reaches a
    server paused past the deadline does not commit either.
    """
    if deadline == "request":
        state = request_state.current()
        deadline = None if state is None else state.client_deadline
    native = _pool_of(engine)
    if deadline is not None and asyncio.get_running_loop().time() >= deadline.at:
        raise DeadlinePassed(deadline, "before_begin")
    async with (
        native.connection() as raw,
        _transaction_block(raw, "BEGIN", deadline, native.spec.statement_timeout_ms) as conn,
    ):
        yield conn


@asynccontextmanager
async def autocommit(engine: AsyncEngine) -> AsyncIterator[NativeConnection]:
    """A pooled connection outside a transaction block: each statement is its own transaction.

    Readers use it too: under READ COMMITTED a transaction around reads gives
    no snapshot across statements, only a BEGIN and a ROLLBACK more.
    """
    native = _pool_of(engine)
    async with native.connection() as raw:
        yield NativeConnection(raw)


@asynccontextmanager
async def read_only(engine: AsyncEngine) -> AsyncIterator[NativeConnection]:
    """One READ ONLY transaction on a pooled connection: PostgreSQL refuses any write in it.

    For answers that must change nothing (fit, a what-if), whatever a
    statement they share with the writers might do.
    """
    native = _pool_of(engine)
    async with native.connection() as raw, _transaction_block(raw, "BEGIN READ ONLY") as conn:
        yield conn


@asynccontextmanager
async def rolled_back(engine: AsyncEngine) -> AsyncIterator[NativeConnection]:
    """One transaction on the primary that always ends in ROLLBACK, whatever the work did or raised.

    For work that writes only to ask what would happen (explainPlacement's
    victim trials, placement/preemption.py): nothing of it can be committed,
    and every lock it took ends with it.
    """
    native = _pool_of(engine)
    async with native.connection() as raw:
        if statement_observers:
            _observe("BEGIN")
        await raw.execute("BEGIN")
        try:
            yield NativeConnection(raw)
        finally:
            await _roll_back(raw)


def read_only_block(raw: Any) -> AbstractAsyncContextManager[NativeConnection]:
    """One READ ONLY transaction on a connection already taken from a pool (a read replica's)."""
    return _transaction_block(raw, "BEGIN READ ONLY")


@asynccontextmanager
async def _transaction_block(
    raw: Any,
    begin: str,
    deadline: ClientDeadline | None = None,
    statement_timeout_ms: int | None = None,
) -> AsyncIterator[NativeConnection]:
    if statement_observers:
        _observe(begin)
    loop = asyncio.get_running_loop()
    bounded = False
    if deadline is not None:
        left_ms = max(1, int((deadline.at - loop.time()) * 1000))
        bounded = statement_timeout_ms is None or left_ms <= statement_timeout_ms
        if bounded:
            # In the same message as BEGIN: no round trip more.
            begin = f"{begin}; SET LOCAL statement_timeout = {left_ms}"
    await raw.execute(begin)
    begun = loop.time()
    conn = NativeConnection(raw)
    try:
        yield conn
    except BaseException as error:
        # Also when cancelled (the request's time limit, a shutdown): asyncpg
        # first finishes cancelling a statement in flight in PostgreSQL (so
        # no backend is left running it for a request that is gone), then
        # the ROLLBACK runs.
        await _roll_back(raw)
        if deadline is not None and bounded and isinstance(error, asyncpg.QueryCanceledError):
            raise DeadlinePassed(deadline, "statement") from error
        raise
    # statement_timeout off for COMMIT itself: PostgreSQL answers a COMMIT
    # whose wait for the synchronous standby was cancelled (by a timeout
    # too) with success and a warning that it committed only locally. An
    # acknowledged write must be on the standby; a COMMIT that cannot get
    # there waits, until the request's own time limit answers "unknown".
    commit = "SET LOCAL statement_timeout = 0; COMMIT"
    if deadline is not None:
        if loop.time() >= deadline.at:
            await _roll_back(raw)
            raise DeadlinePassed(deadline, "before_commit")
        # The same deadline on the server's clock: this transaction's start
        # (now()) plus what was left when BEGIN had been answered, which is
        # after now() was taken, so never later than the client's deadline.
        commit = (
            f"SELECT inventory_commit_by(now() + make_interval(secs => {deadline.at - begun:.6f}));"
            f" {commit}"
        )
    try:
        await raw.execute(commit)
    except BaseException as error:
        if isinstance(error, Exception) and not db_faults.connection_unusable(error):
            # The server's refusal: COMMIT ran and rolled back, or (a statement
            # before it failed) the transaction waits for its ROLLBACK.
            await _roll_back(raw)
            if deadline is not None and isinstance(error, asyncpg.QueryCanceledError):
                raise DeadlinePassed(deadline, "at_commit") from error
            raise
        close_now(raw)
        if isinstance(error, Exception):
            raise db_faults.CommitOutcomeUnknown() from error
        raise


async def _roll_back(raw: Any) -> None:
    """ROLLBACK after a failed block; a connection that cannot even do that is closed."""
    try:
        if raw.is_closed():
            return
        await raw.execute("ROLLBACK")
    except Exception:
        close_now(raw)
    except BaseException:
        close_now(raw)  # cancelled again meanwhile: not reused, which rolls back too
        raise


def close_now(raw: Any) -> None:
    """Close a pooled connection at once, without a word to the server; it is not reused.

    asyncpg may have closed it already (the connection was lost), leaving
    the pool's proxy detached: then there is nothing left to do.
    """
    with suppress(asyncpg.InterfaceError):
        raw.terminate()
