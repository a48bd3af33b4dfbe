"""Bring a database to the latest schema, safely from several processes at once."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory

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


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply pending migrations (blocking; call before the event loop starts)."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)


def head_revision() -> str | None:
    return ScriptDirectory(str(ALEMBIC_DIR)).get_current_head()
