"""One operation, sent to the fast path and to the reference on the same seeded database.

The two apps are built as tests/conftest.py builds them, over one engine, and
differ in one setting only: INVENTORY_FAST_PATH (true: every fast
route the service has; false: Strawberry's view alone, the reference). Each
operation goes to the fast app, then to the reference, and each finds the
database exactly as seeded: after a request the stored rows (and sequences)
are read back, and when they changed they are compared with what the other
app left, then restored from a snapshot taken after seeding. So a mutation
is compared by its answer *and* by what it wrote (a declined mutation
executed twice shows up as two events), and the next operation starts
clean. Restoring is a DELETE and an INSERT ... SELECT per table in one
transaction: a few milliseconds on a cluster this size, and exact, which
re-seeding through the API would not be (new timestamps, new token
secrets).

What legitimately differs between two runs of the same request is made
equal before comparing, and nothing else: timestamps written during the
request (the database's now() differs; their format does not and is kept),
the id and secret of a token created by the request (random by design), and
the request id of a masked error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks.equivalence.operations import Operation
from benchmarks.equivalence.seed import create_tokens, seed
from service.config import Settings
from service.database.db import create_engine, dispose
from service.web.app import create_app

SNAPSHOT = "equivalence_seed"

_DATETIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}(?::?\d{2})?)?"
)
_TOKEN_ID = re.compile(r"tok_[0-9a-f]{12}")
_SECRET = re.compile(r"llmgw_[A-Za-z0-9_-]{20,}")
_DIGEST = re.compile(r"\b[0-9a-f]{64}\b")
# A clock correction's seconds are measured against the receive time
# (service/fleet/observed_at.py, AgentClock.correction): two runs of the same
# report differ in them by design, by a fraction of a second.
_MEASURED_SECONDS = re.compile(r"(?<=agent clock )[\d.]+ s|(?<=shifted by )[+-][\d.]+ s")


# Fewer than the seeded nodes: an unpaged list then stops short and says so
# (PAGE_TRUNCATED), on every route that answers lists.
MAX_PAGE_SIZE = 6


def settings(fast_path: bool) -> Settings:
    """The same settings for both apps but this one variable."""
    return Settings.from_env(
        {
            "INVENTORY_FAST_PATH": "true" if fast_path else "false",
            "INVENTORY_MAX_PAGE_SIZE": str(MAX_PAGE_SIZE),
        }
    )


# Codes of the database's expected outcomes under load, each an answer that
# asks the client to retry (docs/scheduler/errors.md).
TRANSIENT_CODES = frozenset({"REQUEST_TIMEOUT", "DATABASE_UNAVAILABLE"})
TRANSIENT_ATTEMPTS = 3


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: Any  # the JSON document, or the text when it is not JSON


@dataclass(frozen=True)
class Difference:
    operation: Operation
    fast: Answer
    reference: Answer
    what: str  # "answer" or "stored rows"
    fast_state: Any = None
    reference_state: Any = None

    def describe(self) -> str:
        lines = [
            f"the {self.what} differ for",
            self.operation.describe(),
            f"fast path ({self.fast.status}): {json.dumps(self.fast.body, sort_keys=True)}",
            f"reference ({self.reference.status}): {json.dumps(self.reference.body, sort_keys=True)}",
        ]
        if self.what == "stored rows":
            lines += _differing_rows(self.fast_state or {}, self.reference_state or {})
        return "\n".join(lines)


def _differing_rows(fast: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """Only the tables and rows the two runs left differently: a whole state is too long to read."""
    lines: list[str] = []
    for table in sorted(set(fast) | set(reference)):
        mine, theirs = fast.get(table), reference.get(table)
        if mine == theirs:
            continue
        if not (isinstance(mine, list) and isinstance(theirs, list)):
            lines.append(f"{table}: fast path {mine!r}, reference {theirs!r}")
            continue
        ours = [json.dumps(r, sort_keys=True) for r in mine]
        others = [json.dumps(r, sort_keys=True) for r in theirs]
        lines += [f"{table}, fast path only: {r}" for r in ours if r not in others][:5]
        lines += [f"{table}, reference only: {r}" for r in others if r not in ours][:5]
    return lines


class Normalizer:
    """Makes equal what two runs of the same request may differ in by design, nothing else."""

    def __init__(self, seeded_at: datetime, seeded_tokens: set[str], seeded_digests: set[str]):
        self.seeded_at = seeded_at
        self.seeded_tokens = seeded_tokens
        self.seeded_digests = seeded_digests

    def _datetime(self, match: re.Match[str], shape: bool) -> str:
        raw = match.group(0)
        try:
            when = datetime.fromisoformat(raw.replace(" ", "T", 1))
        except ValueError:
            return raw
        if when.tzinfo is None or when < self.seeded_at:
            return raw
        # Written during this request: the value differs by design, the format must not.
        return "<now " + re.sub(r"\d", "n", raw) + ">" if shape else "<now>"

    def text(self, value: str, shape: bool = True) -> str:
        value = _DATETIME.sub(lambda m: self._datetime(m, shape), value)
        value = _TOKEN_ID.sub(
            lambda m: m.group(0) if m.group(0) in self.seeded_tokens else "<new token>", value
        )
        value = _SECRET.sub("<secret>", value)
        value = _MEASURED_SECONDS.sub("<measured> s", value)
        return _DIGEST.sub(
            lambda m: m.group(0) if m.group(0) in self.seeded_digests else "<digest>", value
        )

    def __call__(self, value: Any, shape: bool = True) -> Any:
        if isinstance(value, dict):
            return {k: self(v, shape) for k, v in value.items() if k != "requestId"}
        if isinstance(value, list):
            return [self(v, shape) for v in value]
        if isinstance(value, str):
            return self.text(value, shape)
        return value


class Database:
    """The rows and sequences of the inventory's tables: read, snapshot, restore."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.tables: list[str] = []  # parents before children
        self.sequences: list[str] = []
        self.columns: dict[str, str] = {}

    async def discover(self) -> None:
        async with self.engine.connect() as conn:
            names = list(
                (
                    await conn.execute(
                        text(
                            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                            "AND tablename <> 'alembic_version' ORDER BY tablename"
                        )
                    )
                ).scalars()
            )
            edges = (
                await conn.execute(
                    text(
                        "SELECT c.conrelid::regclass::text, c.confrelid::regclass::text "
                        "FROM pg_constraint c WHERE c.contype = 'f' "
                        "AND c.connamespace = 'public'::regnamespace"
                    )
                )
            ).all()
            self.sequences = list(
                (
                    await conn.execute(
                        text(
                            "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public' "
                            "ORDER BY sequencename"
                        )
                    )
                ).scalars()
            )
            columns = (
                await conn.execute(
                    text(
                        "SELECT table_name, string_agg(quote_ident(column_name), ', ' "
                        "ORDER BY ordinal_position) FROM information_schema.columns "
                        "WHERE table_schema = 'public' AND is_generated = 'NEVER' "
                        "GROUP BY table_name"
                    )
                )
            ).all()
        # Generated columns (nodes.state...) are computed again, not copied.
        self.columns = {table: listed for table, listed in columns}
        parents = {name: {p for c, p in edges if c == name and p != name} for name in names}
        ordered: list[str] = []
        while len(ordered) < len(names):
            ready = [n for n in names if n not in ordered and parents[n] <= set(ordered)]
            if not ready:
                raise RuntimeError(f"foreign keys form a cycle among {names}")
            ordered += ready
        self.tables = ordered

    async def state(self) -> dict[str, Any]:
        parts = [
            f"'{t}', (SELECT coalesce(json_agg(r ORDER BY r::text), '[]') FROM {t} r)"
            for t in self.tables
        ] + [
            f"'{s}', (SELECT json_build_array(last_value, is_called) FROM {s})"
            for s in self.sequences
        ]
        async with self.engine.connect() as conn:
            raw = (
                await conn.execute(text(f"SELECT json_build_object({', '.join(parts)})::text"))
            ).scalar_one()
        state: dict[str, Any] = json.loads(raw)
        return state

    async def snapshot(self) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(text(f"DROP SCHEMA IF EXISTS {SNAPSHOT} CASCADE"))
            await conn.execute(text(f"CREATE SCHEMA {SNAPSHOT}"))
            for t in self.tables:
                await conn.execute(text(f"CREATE TABLE {SNAPSHOT}.{t} AS SELECT * FROM {t}"))
            for s in self.sequences:
                await conn.execute(
                    text(f"CREATE TABLE {SNAPSHOT}.{s} AS SELECT last_value, is_called FROM {s}")
                )

    async def restore(self) -> None:
        async with self.engine.begin() as conn:
            # DELETE, not TRUNCATE: on tables this small TRUNCATE's new files cost ~90 ms.
            for t in reversed(self.tables):
                await conn.execute(text(f"DELETE FROM {t}"))
            for t in self.tables:
                await conn.execute(
                    text(
                        f"INSERT INTO {t} ({self.columns[t]}) OVERRIDING SYSTEM VALUE "
                        f"SELECT {self.columns[t]} FROM {SNAPSHOT}.{t}"
                    )
                )
            for s in self.sequences:
                await conn.execute(
                    text(f"SELECT setval('{s}', last_value, is_called) FROM {SNAPSHOT}.{s}")
                )


def _transient(answer: Answer) -> bool:
    """An answer of the database's load rather than of the route: a code that says retry."""
    body = answer.body
    if answer.status == 503:
        return True
    errors = body.get("errors") if isinstance(body, dict) else None
    return any(
        isinstance(e, dict) and (e.get("extensions") or {}).get("code") in TRANSIENT_CODES
        for e in errors or ()
    )


def _sorted_rows(state: dict[str, Any]) -> dict[str, Any]:
    # Rows in a canonical order once normalized (the database ordered them by their raw text).
    return {
        k: sorted(v, key=lambda row: json.dumps(row, sort_keys=True)) if isinstance(v, list) else v
        for k, v in state.items()
    }


class Differential:
    """The fast app and the reference app over one seeded database."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.database = Database(engine)
        self.fast = self._client(fast_path=True)
        self.reference = self._client(fast_path=False)
        self.secrets: dict[str, str] = {}
        self.seed_state: dict[str, Any] = {}
        self.normalize = Normalizer(datetime.now().astimezone(), set(), set())
        self.sent = 0
        self.transient_retries = 0
        self.last_reference: Answer | None = None

    def _client(self, fast_path: bool) -> httpx.AsyncClient:
        app = create_app(settings(fast_path), engine=self.engine)
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://inventory"
        )

    @classmethod
    async def start(cls, database_url: str) -> Differential:
        """Seed the (migrated, empty) database and snapshot it."""
        engine = create_engine(database_url, settings(True))
        async with engine.begin() as conn:
            # Every request commits (and every restore): without waiting for the disk,
            # as a throwaway database may. Sessions opened from here on inherit it.
            await conn.execute(text("SELECT set_config('synchronous_commit', 'off', false)"))
            name = (await conn.execute(text("SELECT current_database()"))).scalar_one()
            await conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
        await dispose(engine)
        engine = create_engine(database_url, settings(True))
        differential = cls(engine)
        await differential._seed()
        return differential

    async def _seed(self) -> None:
        self.secrets = await create_tokens(self.engine)
        headers = {"Authorization": f"Bearer {self.secrets['operator']}"}

        async def send(query: str, variables: dict[str, Any]) -> dict[str, Any]:
            response = await self.reference.post(
                "/graphql", json={"query": query, "variables": variables}, headers=headers
            )
            body: dict[str, Any] = response.json()
            return body

        await seed(self.engine, send)
        await self.database.discover()
        await self.database.snapshot()
        async with self.engine.connect() as conn:
            seeded_at = (await conn.execute(text("SELECT now()"))).scalar_one()
            tokens = set((await conn.execute(text("SELECT id FROM api_tokens"))).scalars())
            digests = set((await conn.execute(text("SELECT digest FROM api_tokens"))).scalars())
        self.normalize = Normalizer(seeded_at, tokens, digests)
        self.seed_state = await self.database.state()

    async def close(self) -> None:
        for client in (self.fast, self.reference):
            await client.aclose()
        await dispose(self.engine)

    async def _send(self, client: httpx.AsyncClient, operation: Operation) -> Answer:
        headers = {"content-type": "application/json"}
        secret = self.secrets.get(operation.role or "")
        if secret is not None:
            headers["Authorization"] = f"Bearer {secret}"
        response = await client.post(
            "/graphql", content=json.dumps(operation.body()).encode(), headers=headers
        )
        self.sent += 1
        content_type = response.headers.get("content-type", "")
        body: Any
        try:
            body = response.json()
        except ValueError:
            body = response.text
        return Answer(response.status_code, content_type, body)

    async def _left(self) -> dict[str, Any] | None:
        """What the request left in the database (normalized), None when nothing changed;
        the database is as seeded again afterwards."""
        state = await self.database.state()
        if state == self.seed_state:
            return None
        await self.database.restore()
        return _sorted_rows(self.normalize(state, shape=False))

    async def compare(self, operation: Operation) -> Difference | None:
        # An answer the database's load made (a statement cancelled at its
        # statement_timeout, the database away: "retry shortly") says nothing
        # of either route: both are asked again, as a client would (issue 44:
        # the dashboard's node page, timed out on a loaded machine on one
        # route only, failed this comparison). Counted, and bounded: a route
        # that times out every time still differs.
        for attempt in range(TRANSIENT_ATTEMPTS):
            fast = await self._send(self.fast, operation)
            fast_left = await self._left()
            reference = await self._send(self.reference, operation)
            reference_left = await self._left()
            if not (_transient(fast) or _transient(reference)):
                break
            if attempt < TRANSIENT_ATTEMPTS - 1:
                self.transient_retries += 1
        self.last_reference = reference
        fast_seen = Answer(fast.status, fast.content_type, self.normalize(fast.body))
        reference_seen = Answer(
            reference.status, reference.content_type, self.normalize(reference.body)
        )
        if fast_seen != reference_seen:
            return Difference(operation, fast, reference, "answer")
        if fast_left != reference_left:
            return Difference(operation, fast, reference, "stored rows", fast_left, reference_left)
        return None
