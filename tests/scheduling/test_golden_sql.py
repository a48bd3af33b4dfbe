"""Every statement the service sends, as SQL a reviewer reads: the golden files of docs/internals/sql/.

The statements are built from fragments spread over many modules (a PoolOffer
here, a topology filter there), so the SQL that runs exists whole nowhere in
the source. Here each statement builder is rendered over a fixed grid of
request shapes (plain, tolerating, each topology, weights, the node's own
checks, spread, groups' localities), and every statement a module defines
once (a module-level text(...)) as it is; each is formatted with sqlglot and
compared with its file under docs/internals/sql/ (one folder per module, one
file per builder and shape: docs/internals/sql.md). A change to a
statement then shows up in review as a change of SQL, and a stale file fails
here with the command that writes them again:

    .venv/bin/python -m tests.scheduling.test_golden_sql --write

Each statement is also planned (EXPLAIN, every parameter NULL) against the
migrated schema (and the backup machinery's report table, deploy/backup/status.sql),
so a column renamed in a migration but not in a statement fails here, whichever
shape it hides in.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import sqlglot
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine

import service
from service.fleet.health import moves
from service.scheduling import capacity
from service.scheduling.allocations import records
from service.scheduling.groups import GroupRequest, GroupRole, Locality, LocalityLevel
from service.scheduling.groups import reads as group_reads
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import claims, fit, statements
from service.scheduling.topology_fit import TOLERATING

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "docs" / "internals" / "sql"
REGENERATE = ".venv/bin/python -m tests.scheduling.test_golden_sql --write"


@dataclass(frozen=True)
class Statement:
    """One statement as sent, and where its golden file is (relative to GOLDEN)."""

    path: str
    what: str
    sql: str


# The grid of request shapes every placement builder is rendered over: each
# option that changes a statement's text, alone, and all of them together.
BASE = PlaceRequest("replica", "NVIDIA-L40S", 2)
SHAPES: dict[str, PlaceRequest] = {
    "plain": BASE,
    "tolerating": replace(BASE, tolerations=TOLERATING),
    "nvlink": replace(BASE, nvlink_shards=True),
    "rail": replace(BASE, rail_aligned=True, fabric="ib-a"),
    "domain": replace(BASE, same_nvlink_domain=True),
    "fabric": replace(BASE, fabric="ib-a"),
    "weights": replace(BASE, weights="/models/llama"),
    "weights_ready": replace(BASE, weights="/models/llama", weights_ready=True),
    "node_checks": replace(BASE, label=("rack", "r1"), min_local_disk_free=1, max_age=60),
    "spread": replace(BASE, shards=4, fabric="ib-a"),
    # A place that may use GPUs set aside (availability.gpu_admitted).
    "until": replace(BASE, until=datetime(2030, 1, 1, tzinfo=UTC)),
    "into": replace(BASE, reservation="rollout"),
    # fit and freeGpus asked of a later instant (availability.gpu_offered_at).
    "at": replace(BASE, at=datetime(2030, 1, 1, tzinfo=UTC)),
    "everything": replace(
        BASE,
        shards=2,
        fabric="ib-a",
        weights="/models/llama",
        weights_ready=True,
        label=("rack", "r1"),
        min_local_disk_free=1,
        max_age=60,
        nvlink_shards=True,
        rail_aligned=True,
        same_nvlink_domain=True,
        tolerations=TOLERATING,
    ),
}
TOPOLOGY = {name: r for name, r in SHAPES.items() if r.needs_topology}
# What a claim's text depends on: its topology, and whether it tolerates.
CLAIM_SHAPES = ("plain", "tolerating", "nvlink", "rail", "domain", "everything", "until", "into")
# fit's census reads only requests counted_by_census takes.
CENSUS_SHAPES = ("plain", "nvlink", "fabric")
LOCALITIES = {
    "any": Locality(),
    "nvlink_domain": Locality(LocalityLevel.NVLINK_DOMAIN),
    "label": Locality(LocalityLevel.LABEL, label="rack", hard=True),
}


def _group(locality: Locality) -> GroupRequest:
    return GroupRequest("group", (GroupRole("prefill", 2, BASE),), locality)


def _module_of(builder: Callable[..., object]) -> str:
    return builder.__module__.removeprefix("service.")


def _built(builder: Callable[..., object], shape: str, sql: str | TextClause) -> Statement:
    name = builder.__name__
    body = sql.text if isinstance(sql, TextClause) else sql
    return Statement(f"{_module_of(builder)}/{name}.{shape}.sql", f"{name}, {shape}", body)


# Every builder the grid renders.
BUILDERS: tuple[Callable[..., object], ...] = (
    statements.candidates_sql,
    statements.pick_sql,
    statements.pick_several_sql,
    statements.survey_sql,
    statements.claim_statement,
    statements.free_indices,
    claims.usable_gpus_sql,
    fit.survey_groups_sql,
    fit.census_facts_sql,
    group_reads.board_sql,
    group_reads.board_census_sql,
    group_reads.window_sql,
    capacity.free_gpus_query,
    capacity.tolerated_gpus_query,
    capacity.gpus_at_query,
    moves.shards_to_move_sql,
    records.allocations_page_sql,
)


def built_statements() -> Iterator[Statement]:
    """The statements the builders make, over the grid."""
    for shape, request in SHAPES.items():
        yield _built(statements.candidates_sql, shape, statements.candidates_sql(request))
        yield _built(statements.pick_sql, shape, statements.pick_sql(request, False))
        yield _built(statements.pick_several_sql, shape, statements.pick_several_sql(request))
        yield _built(statements.survey_sql, shape, statements.survey_sql(request))
        yield _built(fit.survey_groups_sql, shape, fit.survey_groups_sql(request))
    for shape, request in TOPOLOGY.items():
        # place() asks first with the window drawn before the topology check.
        drawn = statements.pick_sql(request, True)
        yield _built(statements.pick_sql, f"{shape}.drawn_first", drawn)
        for domain in (False, True):
            sql = claims.usable_gpus_sql(request, domain)
            yield _built(claims.usable_gpus_sql, f"{shape}{'.in_domain' if domain else ''}", sql)
    for shape in CLAIM_SHAPES:
        request = SHAPES[shape]
        yield _built(statements.claim_statement, shape, statements.claim_statement(request, False))
        several = statements.claim_statement(request, True)
        yield _built(statements.claim_statement, f"{shape}.several", several)
    for tolerating in (False, True):
        shape = "tolerating" if tolerating else "plain"
        yield _built(statements.free_indices, shape, statements.free_indices(tolerating))
    for shape in ("until", "into"):
        admitting = SHAPES[shape].admitting
        yield _built(statements.free_indices, shape, statements.free_indices(False, admitting))
    for shape in CENSUS_SHAPES:
        request = SHAPES[shape]
        for reads in ("count", "window", "members"):
            sql = fit.census_facts_sql(request, reads=reads)
            yield _built(fit.census_facts_sql, f"{shape}.{reads}", sql)
    for name, locality in LOCALITIES.items():
        group = _group(locality)
        yield _built(group_reads.board_sql, name, group_reads.board_sql(group, BASE))
        # The census serves only groups read_board and read_window may window:
        # none with a LABEL locality (groups/reads.windowed).
        if locality.label is None:
            for builder in (group_reads.board_census_sql, group_reads.window_sql):
                yield _built(builder, name, builder(group, BASE))
    for query in (capacity.free_gpus_query, capacity.tolerated_gpus_query, capacity.gpus_at_query):
        for cls in (None, "NVIDIA-L40S"):
            for narrowed in (False, True):
                sql, _ = query(
                    gpu_class=cls,
                    fabric="ib-a" if narrowed else None,
                    min_free=1,
                    first=100,
                    after="node-1" if narrowed else None,
                    max_age=60 if narrowed else None,
                )
                shape = f"{'class' if cls else 'any_class'}{'.narrowed' if narrowed else ''}"
                yield _built(query, shape, sql)
    for shape, asked in {
        "all": {},
        "node_and_after": {"node_id": True, "after": True},
        "replica": {"replica_id": True},
        "held": {"held": True},
    }.items():
        flags = {"node_id": False, "replica_id": False, "after": False, "held": False, **asked}
        sql = records.allocations_page_sql(**flags)
        yield _built(records.allocations_page_sql, shape, sql)
    for narrowed in (False, True):
        node, after = ("node-1", "shard-1") if narrowed else (None, None)
        shape = "node_and_after" if narrowed else "all"
        yield _built(moves.shards_to_move_sql, shape, moves.shards_to_move_sql(node, after))


def defined_statements() -> Iterator[Statement]:
    """Each statement a module of service/ defines once: a module-level text(...), as it is."""
    for info in pkgutil.walk_packages(service.__path__, "service."):
        module = importlib.import_module(info.name)
        source = Path(str(module.__file__)).read_text()
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            for name in names:
                value = getattr(module, name, None)
                if isinstance(value, TextClause):
                    where = info.name.removeprefix("service.")
                    yield Statement(f"{where}/{name}.sql", name, value.text)


def every_statement() -> list[Statement]:
    built = list(built_statements())
    # A builder rendered here is listed in BUILDERS (whose docstrings name their files).
    names = {f"{_module_of(b)}/{b.__name__}." for b in BUILDERS}
    assert all(any(s.path.startswith(n) for n in names) for s in built)
    found = [*built, *defined_statements()]
    paths = [s.path for s in found]
    assert len(paths) == len(set(paths)), sorted(p for p in paths if paths.count(p) > 1)
    return found


def formatted(statement: Statement) -> str:
    """The statement as its golden file holds it: sqlglot's layout, parameters as written (:name)."""
    pretty = sqlglot.transpile(
        statement.sql, read="postgres", write="postgres", pretty=True, normalize_functions=False
    )
    assert len(pretty) == 1, statement.path
    # sqlglot writes a :name parameter as %(name)s.
    body = re.sub(r"%\((\w+)\)s", r":\1", pretty[0])
    return f"-- {statement.what}: generated by {REGENERATE}\n{body}\n"


def golden_files() -> dict[str, str]:
    return {
        str(path.relative_to(GOLDEN)): path.read_text() for path in sorted(GOLDEN.rglob("*.sql"))
    }


def write() -> None:
    wanted = {s.path: formatted(s) for s in every_statement()}
    for stale in set(golden_files()) - set(wanted):
        (GOLDEN / stale).unlink()
    for path, body in wanted.items():
        target = GOLDEN / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != body:
            target.write_text(body)
    for folder in sorted(GOLDEN.iterdir()):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def test_the_golden_files_are_the_statements_as_built() -> None:
    wanted = {s.path: formatted(s) for s in every_statement()}
    have = golden_files()
    missing = sorted(set(wanted) - set(have))
    extra = sorted(set(have) - set(wanted))
    stale = sorted(p for p in set(wanted) & set(have) if wanted[p] != have[p])
    assert not (missing or extra or stale), (
        f"docs/internals/sql/ is out of date: run `{REGENERATE}` and review the SQL it changes.\n"
        f"missing: {missing}\nno longer built: {extra}\nchanged: {stale}"
    )


def test_each_builder_names_its_golden_files() -> None:
    # As OpenStack Placement's objects do: beside the builder, where to read
    # the SQL it makes ("The SQL generated below looks like this: ...").
    # (store_statement and claim_wanted point at their statements' files too.)
    unnamed = []
    for builder in BUILDERS:
        folder = f"docs/internals/sql/{_module_of(builder)}/{builder.__name__}."
        if folder not in (builder.__doc__ or ""):
            unnamed.append(f"{builder.__module__}.{builder.__name__}")
    assert not unnamed, f"say where the golden files are in the docstring of: {unnamed}"


def test_the_grid_covers_every_option_of_a_request() -> None:
    # A PlaceRequest field that no shape sets would be an option whose SQL
    # no golden file shows.
    unset = {
        field
        for field in PlaceRequest.__dataclass_fields__
        if all(getattr(r, field) == getattr(BASE, field) for r in SHAPES.values())
    }
    # The charge and the preemption policy are parameters of the same SQL
    # (tenancy: the claim charges every call to its own tenant).
    assert unset == {
        "replica_id", "gpu_class", "gpus_per_shard", "charge", "preemption"
    }, unset  # fmt: skip


# Schemas of the service's statements that no migration owns, made by another
# program the deployment runs (the backup schedule's report, service/backup_status.py):
# made here inside the test's transaction, so its statements are planned against them too.
OTHER_SCHEMAS = (ROOT / "deploy" / "backup" / "status.sql",)


async def test_every_statement_plans_against_the_migrated_schema(engine: AsyncEngine) -> None:
    failed = []
    async with engine.connect() as conn:
        outer = await conn.begin()
        await conn.execute(text("SELECT 1"))  # the transaction begun on the server
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        for schema in OTHER_SCHEMAS:
            # Several statements: asyncpg's simple protocol, in the same transaction.
            await raw.execute(schema.read_text())
        for statement in every_statement():
            clause = text(statement.sql)
            nulls = dict.fromkeys(clause._bindparams)
            savepoint = await conn.begin_nested()
            try:
                await conn.execute(text(f"EXPLAIN {statement.sql}"), nulls)
            except Exception as error:  # each failure is listed below, by file
                failed.append(f"{statement.path}: {str(error).splitlines()[0]}")
            finally:
                await savepoint.rollback()
        await outer.rollback()
    assert not failed, "\n".join(failed)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {REGENERATE}")
    write()
    print(f"wrote {len(golden_files())} statements under {GOLDEN.relative_to(ROOT)}")
