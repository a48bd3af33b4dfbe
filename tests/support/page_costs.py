"""Page-cost clusters: loaded through the API, every statement a read ran explained with its buffers and rows."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]
import httpx
from sqlalchemy import text

from service.config import Settings
from service.database import connections
from service.database.connections import compile_text
from service.database.db import create_engine, dispose, libpq_url
from service.scheduling.capacity import CLASS_SUMMARY, FABRIC_MEMBERS
from service.scheduling.groups import GroupRequest, GroupRole, Locality, LocalityLevel
from service.scheduling.groups.placing import requests_of
from service.scheduling.groups.reads import (
    board_sql,
)
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement.statements import SURVEY_COUNT
from service.web.app import create_app
from tests.support.databases import create_database, drop_database, seal_template, with_database
from tests.support.reports import A100, H100, gpus, node_input

PAGE = 10


FLAT_ENTRY = (10, 20)


FIXED = 150


IB = [{"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}]


REGISTER_BATCH = 50


def node_id(i: int) -> str:
    return f"n-{i:05d}"


@dataclass(frozen=True)
class Read:
    """A read as its client sends it; `entries` is the size of the page it shows."""

    name: str
    query: str
    variables: dict[str, Any]
    entries: int = PAGE
    entry: tuple[int, int] = FLAT_ENTRY  # (rows, buffers) per entry


PLACE_INPUT = {"replicaId": "r-explain", "gpuClass": "H100-80GB", "gpusPerShard": 4, "shards": 2}


# 2 prefill TP-4 + 4 decode TP-2, prefill sending KV cache to decode, NODE preferred.
GROUP: dict[str, Any] = {
    "roles": [
        {"role": role, "replicas": n, "shape": {**PLACE_INPUT, "shards": 1, "gpusPerShard": per}}
        for role, n, per in (("prefill", 2, 4), ("decode", 4, 2))
    ],
    "locality": {"level": "NODE"},
    "kvFrom": "prefill",
    "kvTo": "decode",
}


# Statements whose answer sums or lists every node: bounded by one pass over
# the one narrow table they read (service/scheduling/capacity.py), not by a page.
# (As the service sends them: compile_text's numbered parameters.)
WHOLE_CLUSTER = {
    compile_text(CLASS_SUMMARY)[0]: "gpu_pools",
    compile_text(FABRIC_MEMBERS)[0]: "fabric_attachments",
    # explainPlacement's count of the class's nodes, for verdictsOmitted.
    compile_text(SURVEY_COUNT)[0]: "gpu_pools",
}


# placeGroup's and fitGroup's board (service/scheduling/groups/reads.py): per
# role, every pool of the class with its node's fabrics, NVLink domain (NODE
# falls back to NVLINK_DOMAIN) and GPUs' facts: a few rows per pool of the
# class, the same before and after ANALYZE, never a page's bound.
PER_POOL_ROWS = 16


BOARD = GroupRequest(
    "fit",
    tuple(
        GroupRole(
            r["role"], r["replicas"], PlaceRequest("", "H100-80GB", r["shape"]["gpusPerShard"])
        )
        for r in GROUP["roles"]
    ),
    Locality(LocalityLevel.NODE),
    "prefill",
    "decode",
)


PER_POOL = {
    compile_text(text(board_sql(BOARD, request)))[0]: PER_POOL_ROWS
    for request in requests_of(BOARD).values()
}


# A table this small is read whole by a plan that costs no more than index
# descents would (shards and events on a cluster with few allocations): its
# rows do not count, its buffers do.
SMALL_TABLE_PAGES = 10


@dataclass(frozen=True)
class Cost:
    statement: str
    plan: str  # "custom" or "generic"
    rows: int
    buffers: int
    tables: frozenset[str]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def rows_visited(plan: dict[str, Any], small: frozenset[str]) -> int:
    """Rows the plan's scans produced or filtered away and its joins compared, over all loops.

    Scans of the `small` tables aside (SMALL_TABLE_PAGES).
    """
    total = 0.0
    for node in _nodes(plan):
        per_loop = node.get("Rows Removed by Join Filter", 0)
        relation = node.get("Relation Name")
        if relation is not None and relation not in small:
            per_loop += (
                node.get("Actual Rows", 0)
                + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0)
            )
        total += per_loop * node.get("Actual Loops", 1)
    return round(total)


def buffers(plan: dict[str, Any]) -> int:
    """Shared buffers hit or read by the whole plan (a node's counts include its children's)."""
    return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))


async def explain(raw: Any, statement: str, args: Sequence[Any]) -> list[Cost]:
    """The statement as planned for these values, and as planned for any (generic)."""
    costs = []
    for mode in ("custom", "generic"):
        await raw.execute(f"SET plan_cache_mode = force_{mode}_plan")
        prepared = await raw.prepare(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}")
        result = await prepared.fetchval(*args)
        plan = (json.loads(result) if isinstance(result, str) else result)[0]["Plan"]
        tables = frozenset(n["Relation Name"] for n in _nodes(plan) if "Relation Name" in n)
        small = frozenset(
            await raw.fetchval(
                "SELECT coalesce(array_agg(t), '{}') FROM unnest(CAST($1 AS text[])) t"
                " WHERE pg_relation_size(t) < $2 * current_setting('block_size')::int",
                sorted(tables),
                SMALL_TABLE_PAGES,
            )
        )
        costs.append(Cost(statement, mode, rows_visited(plan, small), buffers(plan), tables))
    await raw.execute("RESET plan_cache_mode")
    return costs


class Cluster:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def send(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        response = await self.client.post("/graphql", json={"query": query, "variables": variables})
        body: dict[str, Any] = response.json()
        assert body.get("data") is not None, body
        return body

    async def register(self, ids: Sequence[int]) -> None:
        """Register nodes as agents do: registerNode, many to a request."""
        signature = ", ".join(f"$i{k}: NodeInput!" for k in range(len(ids)))
        fields = " ".join(f"r{k}: registerNode(input: $i{k}) {{ id }}" for k in range(len(ids)))
        variables = {f"i{k}": self.report(i) for k, i in enumerate(ids)}
        body = await self.send(f"mutation({signature}) {{ {fields} }}", variables)
        assert not body.get("errors"), body

    @staticmethod
    def report(i: int) -> dict[str, Any]:
        # Every tenth node is an A100 node, one in 97 has a sick GPU, every
        # other one is on the fabric. Issue 38: every other such GPU reports XID 79
        # too (a taint, a remediation) and its node has less memory than its
        # profile (BIG_PROFILE) says (drift, a taint). Few: at this size a taints
        # table of a few pages is one the planner rightly reads whole once
        # analyzed, which says nothing of a fleet's (moves.py's index is for that).
        model = A100 if i % 10 == 9 else H100
        entries = gpus(model)
        if i % 97 == 0:
            entries[2] = {**entries[2], "healthy": False, "healthReasons": ["ecc"]}
        more: dict[str, Any] = {}
        if i % 194 == 0:
            entries[2]["xids"] = [79]
            more = {"labels": [BIG_PROFILE["selector"]], "memoryTotalMb": 1_000_000}
        return node_input(node_id(i), gpus=entries, fabrics=IB if i % 2 == 0 else [], **more)

    async def taint(self, ids: Sequence[int]) -> None:
        """Taints as operators set them (TOLERATIONS' keys), many to a request."""
        fields = []
        for i in ids:
            if i % 13 == 0:
                fields.append(
                    f'g{i}: taintGpus(nodeId: "{node_id(i)}", indices: [3], taint: {{key: "xid-79",'
                    ' effect: NO_SCHEDULE, reason: "fell off the bus"}) { index }'
                )
            if i % 100 == 7:
                fields.append(
                    f'n{i}: taintNode(nodeId: "{node_id(i)}", taint: {{key: "dedicated",'
                    ' value: "infer", effect: NO_EXECUTE, reason: "inference"}) { id }'
                )
            if i % 17 == 5:
                fields.append(
                    f'p{i}: taintGpus(nodeId: "{node_id(i)}", indices: [0, 1], taint: {{key:'
                    ' "burn-in", effect: PREFER_NO_SCHEDULE, reason: "new"}) { index }'
                )
        for k in range(0, len(fields), REGISTER_BATCH):
            body = await self.send(
                "mutation { " + " ".join(fields[k : k + REGISTER_BATCH]) + " }", {}
            )
            assert not body.get("errors"), body

    async def allocate(self, holds: Sequence[tuple[int, list[int]]]) -> None:
        """Allocate as schedulers do: allocate, many to a request."""
        fields = []
        variables: dict[str, Any] = {}
        for k, (i, indices) in enumerate(holds):
            shard = {"shardId": f"s-{i}", "nodeId": node_id(i), "gpuIndices": indices}
            variables[f"a{k}"] = {"replicaId": f"r-{i}", "shards": [shard]}
            fields.append(f"a{k}: allocate(input: $a{k}) {{ __typename }}")
        signature = ", ".join(f"$a{k}: AllocateInput!" for k in range(len(holds)))
        body = await self.send(f"mutation({signature}) {{ {' '.join(fields)} }}", variables)
        assert {v["__typename"] for v in body["data"].values()} == {"Allocated"}, body

    async def costs(self, raw: Any, read: Read) -> list[Cost]:
        """Every statement `read` ran through the API, explained."""
        ran: list[tuple[str, tuple[Any, ...]]] = []

        def observe(sql: str, args: Sequence[Any]) -> None:
            # Transaction control (fit's and fitGroup's read-only transaction) costs no rows.
            if sql not in ("BEGIN", "BEGIN READ ONLY", "SAVEPOINT", "COMMIT", "ROLLBACK"):
                ran.append((sql, tuple(args)))

        connections.statement_observers.append(observe)
        try:
            await self.send(read.query, read.variables)
        finally:
            connections.statement_observers.remove(observe)
        assert ran, read.name
        found = []
        for sql, args in ran:
            found.extend(await explain(raw, sql, args))
        return found


C = TypeVar("C", bound=Cluster)


BIG_PROFILE = {"name": "big", "selector": {"key": "profile", "value": "big"},
               "memoryTotalMb": 2_000_000}  # fmt: skip


@asynccontextmanager
async def api_on(url: str, kind: type[C], page: int) -> AsyncIterator[tuple[C, str]]:
    """The service on `url` (pages up to `page`) as a `kind` of Cluster, and a libpq DSN."""
    settings = Settings(max_page_size=page)
    engine = create_engine(url, settings)
    app = create_app(settings, engine=engine)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
            yield kind(client), libpq_url(url)
    finally:
        await dispose(engine)


async def table_rows(raw: Any, table: str) -> int:
    count: int = await raw.fetchval(f"SELECT count(*) FROM {table}")
    return count


async def over_bound(raw: Any, read: Read, costs: Sequence[Cost]) -> list[str]:
    """What in `costs` reads more than `read`'s page allows, described."""
    found = []
    for c in costs:
        table = WHOLE_CLUSTER.get(c.statement)
        if c.statement in PER_POOL:
            pools = await table_rows(raw, "gpu_pools")
            rows_bound = buffers_bound = pools * PER_POOL[c.statement] + FIXED
            ok = c.rows <= rows_bound and c.buffers <= buffers_bound
        elif table is not None:
            # One pass over its one table.
            rows_bound = await table_rows(raw, table) + FIXED
            buffers_bound = rows_bound
            ok = c.tables == {table} and c.rows <= rows_bound
        else:
            rows_bound = read.entry[0] * read.entries + FIXED
            buffers_bound = read.entry[1] * read.entries + FIXED
            ok = c.rows <= rows_bound and c.buffers <= buffers_bound
        if not ok:
            found.append(
                f"{read.name} ({c.plan} plan): {c.rows} rows, {c.buffers} buffers of"
                f" {sorted(c.tables)} (bound {rows_bound}, {buffers_bound}):"
                f" {' '.join(c.statement.split())[:400]}"
            )
    return found


# --- clusters built once per session -------------------------------------------------
#
# Loading a page-cost cluster through the API (1,500-2,500 nodes registered as
# agents do) costs far more than the reads it is built for. So each cluster is
# built once per session into a database nobody has analyzed or vacuumed,
# sealed as a template, and every case runs on a clone of it
# (CREATE DATABASE ... TEMPLATE copies the files: the same heap, indexes,
# visibility map and pg_class figures, no statistics). A clone is as
# unanalyzed as the template; every case asserts so (as_built) before it
# loads its own part and moves on to ANALYZE.

# What the planner knows of each table without ANALYZE: pg_class's figures,
# the visibility map's count, whether autovacuum may touch it, and how many
# pg_statistic rows ANALYZE has left (none, unanalyzed). (pg_stat_user_tables'
# counters are not copied to a clone: they start at zero in any new database.)
TABLE_STATE = """
SELECT c.relname, c.reltuples, c.relpages, c.relallvisible,
       coalesce(c.reloptions, '{}') AS options,
       (SELECT count(*) FROM pg_statistic s WHERE s.starelid = c.oid) AS statistics
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname <> 'alembic_version'
ORDER BY c.relname
"""


async def table_state(raw: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in await raw.fetch(TABLE_STATE)]


async def no_autovacuum(raw: Any, tables: Sequence[str]) -> None:
    """Autovacuum off for these tables: each statistics state is the one a test names,
    not whatever autovacuum did meanwhile (the reloption is copied to every clone)."""
    for table in tables:
        await raw.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")


@dataclass(frozen=True)
class Template:
    name: str
    state: list[tuple[Any, ...]]  # table_state as built


class Templates:
    """The session's page-cost clusters, each built once (by `build`, through the API) on
    a clone of the migrated template and kept as a template of its own."""

    def __init__(self, server_url: str, migrated: str) -> None:
        self.server_url = server_url
        self.migrated = migrated
        self.built: dict[str, Template] = {}
        self.lock = threading.Lock()

    def template(self, key: str, build: Callable[[str], Awaitable[None]]) -> Template:
        with self.lock:
            if key not in self.built:
                url = create_database(self.server_url, f"llmgw_pages_{key}", self.migrated)
                try:
                    state = asyncio.run(self._build(url, build))
                    self.built[key] = Template(seal_template(self.server_url, url), state)
                except BaseException:
                    drop_database(self.server_url, url)
                    raise
            return self.built[key]

    @staticmethod
    async def _build(url: str, build: Callable[[str], Awaitable[None]]) -> list[tuple[Any, ...]]:
        await build(url)
        raw = await asyncpg.connect(libpq_url(url))
        try:
            state = await table_state(raw)
        finally:
            await raw.close()
        assert not analyzed(state), f"analyzed while it was built: {analyzed(state)}"
        return state

    @contextmanager
    def clone(
        self, key: str, build: Callable[[str], Awaitable[None]]
    ) -> Iterator[tuple[str, Template]]:
        """A new database holding the cluster `key` as built, unanalyzed; its URL and template."""
        template = self.template(key, build)
        url = create_database(self.server_url, f"llmgw_case_{key}", template.name)
        try:
            yield url, template
        finally:
            drop_database(self.server_url, url)

    def drop_all(self) -> None:
        for template in self.built.values():
            drop_database(self.server_url, with_database(self.server_url, template.name))
        self.built.clear()


def analyzed(state: list[tuple[Any, ...]]) -> list[str]:
    """The tables kept from autovacuum (no_autovacuum) that have statistics all the same."""
    return [
        name
        for name, _, _, _, options, statistics in state
        if "autovacuum_enabled=false" in options and statistics
    ]


async def as_built(raw: Any, template: Template) -> None:
    """The clone is the cluster as built: pg_class's figures, the visibility map's count and
    the options as the template's, and no statistics on the tables kept from autovacuum
    (the state 'before ANALYZE' means)."""
    now = await table_state(raw)
    assert now == template.state, "the clone's tables differ from the template's as built"
    assert not analyzed(now), f"analyzed before the test asked: {analyzed(now)}"
    assert any("autovacuum_enabled=false" in options for *_, options, _ in now)


DASHBOARD = Path(__file__).resolve().parents[2] / "service" / "static" / "dashboard.js"


def dashboard_query(name: str) -> str:
    """A query the dashboard sends, as dashboard.js spells it."""
    found = re.search(rf"const {name} = `([^`]*)`", DASHBOARD.read_text())
    assert found, name
    return found.group(1)
