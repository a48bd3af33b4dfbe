"""Bring a database to the latest schema, safely from several processes at once.

And say which code a schema keeps working (expand and contract,
docs/deployment/upgrades.md): a migration declares `keeps_working`, the
oldest revision whose code still works once it ran (an expand migration keeps
the previous release's code working; one that breaks it comes in a later
release); one that declares nothing keeps only its own revision's code. env.py writes the head's value into alembic_version's table comment
after every upgrade, so that a process of an older release, which does not
know the newer revisions, can tell whether the schema still suits it: its
/readyz stays 200 and its start-up skips migrating, instead of leaving
rotation (or failing to start) while the processes are replaced one by one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy import text

from alembic import command

# A wheel carries the migrations inside the package (setup.py copies them there);
# a checkout, and an editable install of it, has them in the repository's
# alembic/, beside the package.
PACKAGED_MIGRATIONS = Path(__file__).resolve().parent / "schema_migrations"
ALEMBIC_DIR = (
    PACKAGED_MIGRATIONS
    if PACKAGED_MIGRATIONS.is_dir()
    else Path(__file__).resolve().parents[2] / "alembic"
)

# Held for the whole migration transaction: replicas that start together
# queue here, and the second one finds the schema already at head.
MIGRATION_LOCK_KEY = 0x6C6C6D67  # "llmg"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(ALEMBIC_DIR))
    config.attributes["database_url"] = database_url
    return config


log = logging.getLogger(__name__)


class NewerSchema(Exception):
    """The database was migrated by a newer release that no longer keeps this one working."""


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply pending migrations (blocking; call before the event loop starts).

    A database a newer release migrated (its revision unknown here) is left
    as it is when it keeps this release working; otherwise NewerSchema.
    """
    if revision == "head":
        found, keeps = asyncio.run(_stored_revision(database_url))
        if found is not None and not known(found):
            if works_with(head_revision(), found, keeps):
                log.info(
                    "the schema is at %s, newer than this release's %s, and keeps it working "
                    "(from %s): nothing to migrate",
                    found,
                    head_revision(),
                    keeps,
                )
                return
            raise NewerSchema(
                f"the schema is at {found}, migrated by a newer release that keeps code working "
                f"only from {keeps or found}; this release is at {head_revision()}"
            )
    command.upgrade(alembic_config(database_url), revision)


async def _stored_revision(database_url: str) -> tuple[str | None, str | None]:
    from sqlalchemy import pool

    from service.database.db import engine_for

    engine = engine_for(database_url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            return await stored_revision(conn)
    finally:
        await engine.dispose()


# Two statements: a query naming alembic_version fails to plan before the first migration.
_VERSION_TABLE = text("SELECT to_regclass('alembic_version') IS NOT NULL")
_STORED = text(
    "SELECT (SELECT version_num FROM alembic_version LIMIT 1), "
    "obj_description('alembic_version'::regclass, 'pg_class')"
)


async def stored_revision(conn: Any) -> tuple[str | None, str | None]:
    """(the database's revision, the oldest revision whose code it keeps working)."""
    if not (await conn.execute(_VERSION_TABLE)).scalar():
        return None, None
    row = (await conn.execute(_STORED)).first()
    if row is None or row[0] is None:
        return None, None
    try:
        keeps = json.loads(row[1] or "{}").get("keepsWorking")
    except ValueError:
        keeps = None
    return str(row[0]), keeps


def scripts() -> ScriptDirectory:
    return ScriptDirectory(str(ALEMBIC_DIR))


def known(revision: str) -> bool:
    try:
        return scripts().get_revision(revision) is not None
    except (CommandError, RevisionError):  # what alembic raises for an id it does not have
        return False


def keeps_working(revision: str, directory: ScriptDirectory | None = None) -> str:
    """What `revision` declares (its module's `keeps_working`), else itself."""
    script = (directory or scripts()).get_revision(revision)
    declared = getattr(script.module, "keeps_working", None) if script is not None else None
    return str(declared or revision)


def works_with(expected: str | None, revision: str | None, keeps: str | None) -> bool:
    """Does code written for `expected` work on a schema at `revision` that keeps `keeps` working?"""
    if expected is None or revision is None:
        return expected == revision
    if revision == expected:
        return True
    if known(revision) or keeps is None or not known(keeps):
        # An older schema, or a newer one that says nothing this code understands.
        return False
    return any(s.revision == keeps for s in scripts().iterate_revisions(expected, "base"))


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)


def head_revision() -> str | None:
    return scripts().get_current_head()
