"""Reads that tolerate staleness go to a read replica while it is close enough behind; the rest to the primary.

INVENTORY_READ_DATABASE_URL names the replicas (one host, or several in
libpq's form: each host is a replica of its own, with its own pool and its
own lag). A request may read from one when everything it asks tolerates a
stale answer (request_state.replica_allowed: the GraphQL layer decides that
per operation, service/graphql/read_routes.py) and the replica is at most
INVENTORY_READ_MAX_LAG seconds behind, and at most the request's own maxAge
when it names one. Anything else reads the primary: writes, place, allocate
and release (which decide on the primary, so a stale read can make a later
place answer Unplaceable or lose a race, never double-book), tokens, the
events listener.

How far behind: a background probe asks each replica every `interval`
seconds (a quarter of the allowed lag, between 50 ms and 1 s) for

- 0 when it has replayed all it received and its WAL receiver is connected
  (a replica with nothing left to replay is not behind, however old its last
  transaction: `now() - pg_last_xact_replay_timestamp()` alone keeps growing
  on an idle primary), or when it is not in recovery at all (promoted);
- `now() - pg_last_xact_replay_timestamp()` otherwise (replay paused or
  slow, or the receiver gone, so it cannot know what it is missing).

Between probes a replica's lag can only have grown by the time passed, so
the decision uses `measured lag + seconds since that probe was sent`: an
upper bound, whatever the probe's rhythm, never a guess that is too low. A
replica that does not answer its probe (or a read) counts as unavailable:
reads go to the primary, it is said once in the log and in
inventory_read_replica_up, and the probe keeps trying.

`ReadRouter.choose` is the one decision (`route` asks it for the running
request); `read` runs a read where it says. A read that fails on a replica
for the replica's sake (unreachable, its connection unusable, a query
cancelled by a recovery conflict) is read again from the primary, counted
as a fallback.
"""

from __future__ import annotations

import asyncio
import logging
import random
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections, database_url, request_state
from service.database.connections import NativeConnection, Pool, PoolSpec
from service.database.db_faults import connection_unusable, is_database_unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

PRIMARY = "primary"
REPLICA = "replica"

# How far behind a replica is, in seconds (see the module's docstring).
LAG_SQL = """
SELECT CASE
    WHEN NOT pg_is_in_recovery() THEN 0.0
    WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()
         -- The receiver's pid is visible to every role; its status only to
         -- pg_read_all_stats (NULL otherwise: a receiver that exists).
         AND EXISTS (SELECT 1 FROM pg_stat_wal_receiver
                     WHERE pid IS NOT NULL AND coalesce(status, 'streaming') = 'streaming')
        THEN 0.0
    ELSE extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8
END AS lag
"""

# A read cancelled on a replica by replay (SQLSTATE 40001 "conflict with
# recovery", 40P01 for a buffer pin deadlock) is the replica's doing: read
# again from the primary.
_RECOVERY_CONFLICTS = {"40001", "40P01"}


class Replica:
    """One replica host: its pool, and how far behind it was at its last probe."""

    def __init__(self, dsn: str, shown: str, spec: PoolSpec) -> None:
        self.shown = shown
        self.pool = Pool(dsn, spec)
        self.lag: float | None = None  # None: not measured, or not answering
        self.measured_at = 0.0  # loop time when the probe that measured `lag` was sent
        self.up: bool | None = None  # None until the first probe answered or failed

    def lag_bound(self, now: float) -> float | None:
        """At most this many seconds behind now; None while unknown or unreachable."""
        if self.lag is None or not self.up:
            return None
        return self.lag + max(0.0, now - self.measured_at)

    async def probe(self, within: float) -> None:
        sent = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(within), self.pool.connection() as raw:
                lag = await raw.fetchval(LAG_SQL)
        except Exception as error:
            self.failed(error)
            return
        self.lag = None if lag is None else max(0.0, float(lag))
        self.measured_at = sent
        if self.up is not True:
            log.info(
                "read replica %s answers, %s behind: staleness-tolerant reads may go there",
                self.shown,
                "unknown" if self.lag is None else f"{self.lag:.3f} s",
            )
        self.up = True

    def failed(self, error: BaseException) -> None:
        """The replica did not serve a probe or a read: reads go to the primary until a probe answers."""
        if self.up is not False:
            first_line = (str(error) or type(error).__name__).splitlines()[0]
            log.warning(
                "read replica %s unavailable (%s: %s): reading from the primary, and trying it "
                "again every probe",
                self.shown,
                type(error).__name__,
                first_line,
            )
        self.up = False
        self.lag = None


@dataclass(frozen=True, slots=True)
class Choice:
    """Where one read goes: a replica and how far behind it may be, or the primary and why."""

    replica: Replica | None
    lag: float
    reason: str  # within_lag, lagging, unavailable (metrics label)


@dataclass
class ReadCounts:
    """Staleness-tolerant reads of this process by where they went and why (/metrics)."""

    by_route: dict[tuple[str, str], int] = field(default_factory=dict)

    def count(self, source: str, reason: str) -> None:
        key = (source, reason)
        self.by_route[key] = self.by_route.get(key, 0) + 1


READS = ReadCounts()


class ReadRouter:
    """The replicas of one engine, their probe, and the staleness allowed (INVENTORY_READ_MAX_LAG)."""

    def __init__(self, replicas: list[Replica], max_lag: float, probe_timeout: float) -> None:
        self.replicas = replicas
        self.max_lag = max_lag
        self.probe_timeout = probe_timeout
        self.interval = min(1.0, max(0.05, max_lag / 4))
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Probe the replicas from now on, on the running loop (once)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._probe_forever(), name="read-replica-probe"
            )

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.gather(*(r.probe(self.probe_timeout) for r in self.replicas))
            await asyncio.sleep(self.interval)

    def choose(self, allowed: float) -> Choice:
        """The one decision: a replica at most `allowed` seconds behind (INVENTORY_READ_MAX_LAG,
        or less when the request's maxAge says so), else the primary, and why."""
        now = asyncio.get_running_loop().time()
        bounds = [(r, r.lag_bound(now)) for r in self.replicas]
        known = [(r, lag) for r, lag in bounds if lag is not None]
        if not known:
            return Choice(None, 0.0, "unavailable")
        near = [(r, lag) for r, lag in known if lag <= allowed]
        if not near:
            return Choice(None, 0.0, "lagging")
        replica, lag = random.choice(near)
        return Choice(replica, lag, "within_lag")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for replica in self.replicas:
            await replica.pool.close()


_routers: weakref.WeakKeyDictionary[AsyncEngine, ReadRouter] = weakref.WeakKeyDictionary()


def attach(engine: AsyncEngine, read_url: str, spec: PoolSpec, max_lag: float) -> ReadRouter:
    """Give the engine its replicas, from INVENTORY_READ_DATABASE_URL (one pool per host)."""
    database = database_url.parse(read_url, name="INVENTORY_READ_DATABASE_URL")
    replicas = [
        Replica(dsn, host, spec)
        for dsn, host in zip(database.one_host_dsns(), database.hosts, strict=False)
    ]
    router = _routers[engine] = ReadRouter(replicas, max_lag, spec.timeout)
    return router


def replicas() -> list[Replica]:
    """Every read replica of this process's engines (/metrics)."""
    return [replica for router in list(_routers.values()) for replica in router.replicas]


def start(engine: AsyncEngine) -> None:
    """Begin probing the engine's replicas, if it has any (the app's start-up)."""
    router = _routers.get(engine)
    if router is not None:
        router.start()


async def close(engine: AsyncEngine) -> None:
    router = _routers.pop(engine, None)
    if router is not None:
        await router.close()


def replica_failure(error: BaseException) -> bool:
    """The replica's doing, not the read's: unreachable, its connection unusable, a recovery conflict."""
    code = getattr(error, "sqlstate", None)
    return (
        code in _RECOVERY_CONFLICTS
        or is_database_unavailable(error)
        or connection_unusable(error) is not None
    )


def route(engine: AsyncEngine, max_age: float | None = None) -> Choice | None:
    """Where the running request's next read goes; None: the primary, no choice made.

    None when the engine has no replicas or the request does not tolerate
    staleness (request_state.replica_allowed); else `choose`'s Choice, the
    allowed lag being INVENTORY_READ_MAX_LAG or `max_age` when it asks for less.
    """
    router = _routers.get(engine)
    state = request_state.current()
    if router is None or state is None or not state.replica_allowed:
        return None
    router.start()
    allowed = router.max_lag if max_age is None else min(router.max_lag, max(0.0, max_age))
    return router.choose(allowed)


def record(choice: Choice | None, *, fell_back: bool = False) -> None:
    """Count a routed read that was answered, and note it in the request (extensions.readFrom)."""
    if choice is None:
        return
    state = request_state.current()
    if choice.replica is None or fell_back:
        READS.count(PRIMARY, "fallback" if fell_back else choice.reason)
        if state is not None:
            state.note_read(PRIMARY, 0.0)
        return
    READS.count(REPLICA, choice.reason)
    if state is not None:
        state.note_read(REPLICA, choice.lag)


@asynccontextmanager
async def connect(engine: AsyncEngine, replica: Replica | None) -> AsyncIterator[NativeConnection]:
    """A connection outside a transaction block on `replica`, or the primary (None)."""
    if replica is None:
        async with connections.autocommit(engine) as conn:
            yield conn
        return
    async with replica.pool.connection() as raw:
        yield NativeConnection(raw)


async def read(
    engine: AsyncEngine,
    work: Callable[[NativeConnection], Awaitable[T]],
    *,
    max_age: float | None = None,
    transaction: bool = False,
) -> T:
    """`work` on a connection where `route` says; `transaction`: in one READ ONLY transaction.

    A read the replica failed for its own sake (replica_failure) runs again
    on the primary, and the replica waits for its next probe.
    """
    choice = route(engine, max_age)
    if choice is None or choice.replica is None:
        result = await _on_primary(engine, work, transaction)
        record(choice)
        return result
    try:
        result = await _on_replica(choice.replica, work, transaction)
    except Exception as error:
        if not replica_failure(error):
            raise
        if connection_unusable(error) is not None or is_database_unavailable(error):
            choice.replica.failed(error)
        result = await _on_primary(engine, work, transaction)
        record(choice, fell_back=True)
        return result
    record(choice)
    return result


async def _on_replica(
    replica: Replica, work: Callable[[NativeConnection], Awaitable[T]], transaction: bool
) -> T:
    async with replica.pool.connection() as raw:
        if not transaction:
            return await work(NativeConnection(raw))
        async with connections.read_only_block(raw) as conn:
            return await work(conn)


async def _on_primary(
    engine: AsyncEngine, work: Callable[[NativeConnection], Awaitable[T]], transaction: bool
) -> T:
    session = connections.read_only(engine) if transaction else connections.autocommit(engine)
    async with session as conn:
        return await work(conn)
