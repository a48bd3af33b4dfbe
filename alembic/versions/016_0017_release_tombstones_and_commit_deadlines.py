"""Release tombstones and commit deadlines: no GPUs held for a replica its scheduler gave up on

Revision ID: 0017
Revises: 0014b
Create Date: 2026-12-06 02:00:00

Issue 37. A `place` whose client timed out during a PostgreSQL pause committed
after that client had released the replica (the release found nothing to
free): GPUs held for a replica its scheduler believes gone.

- replicas: the row every claim of a replica id (service/scheduling/
  allocations/storing.py) and every release of it serialize on. A claim
  writes it in the statement that stores the shards; a release that finds
  nothing to free writes it too, as a tombstone (released_at, until
  tombstone_until), and so waits for a claim of that id still committing,
  then frees what it stored; a claim that comes after the tombstone sees it
  and is refused. A row without a tombstone says nothing by itself.
- inventory_commit_by(deadline): raises query_canceled once the server's
  clock is past `deadline`; sent in the same message as COMMIT
  (service/database/connections.py), so a transaction whose COMMIT reaches a
  server that was paused past its client's deadline rolls back instead.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0017"
down_revision: str | None = "0014b"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMMIT_BY = """
CREATE FUNCTION inventory_commit_by(deadline timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF clock_timestamp() > deadline THEN
        RAISE EXCEPTION 'the client''s deadline passed % ago, before COMMIT',
            clock_timestamp() - deadline
            USING ERRCODE = 'query_canceled';
    END IF;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("replica_id", sa.Text(), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True)),
        sa.Column("tombstone_until", sa.DateTime(timezone=True)),
        sa.Column("released_by", sa.Text()),
        sa.PrimaryKeyConstraint("replica_id", name=op.f("pk_replicas")),
        sa.CheckConstraint(
            "char_length(replica_id) BETWEEN 1 AND 253", name=op.f("ck_replicas_replica_id_length")
        ),
        sa.CheckConstraint(
            "(released_at IS NULL) = (tombstone_until IS NULL)",
            name=op.f("ck_replicas_tombstone"),
        ),
    )
    op.create_index(
        op.f("ix_replicas_tombstone_until"),
        "replicas",
        ["tombstone_until"],
        postgresql_where=sa.text("tombstone_until IS NOT NULL"),
    )
    op.execute(COMMIT_BY)


def downgrade() -> None:
    op.execute("DROP FUNCTION inventory_commit_by(timestamptz)")
    op.drop_index(op.f("ix_replicas_tombstone_until"), table_name="replicas")
    op.drop_table("replicas")
