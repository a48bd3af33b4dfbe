"""What a migration uses to change a big, busy table without making the hot path wait.

docs/deployment/upgrades.md is the rule; squawk (alembic/squawk_lint.py) finds
the statements that break it. Imported by migrations (a wheel carries them with the service). Both helpers run outside the migration's
transaction (alembic's autocommit_block), under env.py's lock_timeout:

- create_index_concurrently: CREATE INDEX CONCURRENTLY IF NOT EXISTS. Writes
  go on while it builds. A build that failed leaves an INVALID index behind:
  it is dropped (CONCURRENTLY) and built again on the next run.
- backfill_in_batches: an UPDATE ... WHERE <key> IN (SELECT ... LIMIT n)
  repeated until it changes no row, each batch its own transaction, so no
  row lock is held for longer than one batch and autovacuum keeps up.

    from service.database.online_migrations import backfill_in_batches, create_index_concurrently

    def upgrade() -> None:
        create_index_concurrently("ix_nodes_zone", "nodes", "(zone)")
        backfill_in_batches(
            "UPDATE nodes SET zone = labels ->> 'zone' WHERE id IN "
            "(SELECT id FROM nodes WHERE zone IS NULL AND labels ? 'zone' LIMIT :batch)"
        )
"""

from __future__ import annotations

import time

from sqlalchemy import text

from alembic import op


def create_index_concurrently(
    name: str, table: str, columns: str, where: str | None = None
) -> None:
    """CREATE INDEX CONCURRENTLY `name` ON `table` `columns` [WHERE `where`], rebuilt if INVALID."""
    with op.get_context().autocommit_block():
        invalid = op.get_bind().execute(
            text(
                "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname = :name AND NOT i.indisvalid"
            ),
            {"name": name},
        ).first() if not op.get_context().as_sql else None  # fmt: skip
        if invalid is not None:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        predicate = f" WHERE {where}" if where else ""
        op.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} {columns}{predicate}"
        )


def backfill_in_batches(update: str, batch: int = 1000, pause: float = 0.0) -> int:
    """Run `update` (with a :batch limit in its subquery) until it changes nothing; rows changed."""
    if op.get_context().as_sql:
        # Rendered (alembic --sql, squawk): one batch shows the statement's shape.
        op.execute(text(update).bindparams(batch=batch))
        return 0
    changed = 0
    with op.get_context().autocommit_block():
        while True:
            rows = op.get_bind().execute(text(update), {"batch": batch}).rowcount
            changed += rows
            if rows == 0:
                return changed
            if pause:
                time.sleep(pause)
