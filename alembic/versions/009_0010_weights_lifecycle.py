"""Weights as a lifecycle: state, revision, total size, digest and when seen; shards pin their weights

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 09:00:00

A scheduler must tell a finished download from a half-written one and must
not let weights a serving replica reads be evicted (issue 31):

- weights gains what the agent saw: revision, state (downloading, ready,
  evicting, failed; NULL is "the agent did not say", today's meaning:
  present, state unknown), total_bytes (the size when complete), digest
  (sha256:<64 hex>) and observed_at. Existing rows keep NULL everywhere: they
  constrain no new request until their agent reports again.
- shards gains weights: the path the replica was placed with. Pins are
  derived from it (the replicas with a shard on the node naming the path),
  so a pin lives and dies with the shard, in the same transaction as place
  and release, with no second record to drift.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("weights", sa.Column("revision", sa.Text()))
    op.add_column("weights", sa.Column("state", sa.Text()))
    op.add_column("weights", sa.Column("total_bytes", sa.BigInteger()))
    op.add_column("weights", sa.Column("digest", sa.Text()))
    op.add_column("weights", sa.Column("observed_at", sa.DateTime(timezone=True)))
    op.create_check_constraint(
        op.f("ck_weights_state"),
        "weights",
        "state IN ('downloading', 'ready', 'evicting', 'failed')",
    )
    op.create_check_constraint(
        op.f("ck_weights_total"),
        "weights",
        "total_bytes >= 0 AND (size_bytes IS NULL OR size_bytes <= total_bytes)",
    )
    op.add_column("shards", sa.Column("weights", sa.Text()))


def downgrade() -> None:
    op.drop_column("shards", "weights")
    op.drop_constraint(op.f("ck_weights_total"), "weights", type_="check")
    op.drop_constraint(op.f("ck_weights_state"), "weights", type_="check")
    for column in ("observed_at", "digest", "total_bytes", "state", "revision"):
        op.drop_column("weights", column)
