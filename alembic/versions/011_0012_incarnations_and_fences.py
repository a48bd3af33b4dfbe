"""Incarnations, fences and held shards: a node that comes back never revives a stale replica

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 08:40:00

Issue 32. A node partitioned past INVENTORY_LOST_AFTER still runs its engines
while the inventory frees (or, under INVENTORY_LOST_POLICY=hold, holds) their
GPUs. To tell such an engine to stop when the node returns, the inventory
needs to know which life of the node placed a shard and which placement an
engine is running:

- nodes.incarnation: one more each time the node returns from LOST or
  reports a new boot id (1 for every node that exists now).
- shards.fence: the fencing token an engine is started with, from ONE
  sequence (shard_fence), so a later placement on the same GPU always carries
  a larger one. Existing shards get theirs from the sequence as the column
  is added (a volatile default fills every row).
- shards.generation: the replica's generation after a change that left this
  shard in place (service/scheduling/generations.py): a release naming an
  older generation is refused with the current one, as OpenStack Placement's
  consumer generations do.
- shards.held_since: held for a LOST node, its GPUs still allocated.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("shard_fence", data_type=sa.Integer())))
    op.add_column(
        "nodes",
        sa.Column("incarnation", sa.Integer(), nullable=False, server_default=sa.text("1")),
    )
    op.create_check_constraint(op.f("ck_nodes_incarnation"), "nodes", "incarnation >= 1")
    op.add_column(
        "shards",
        sa.Column(
            "fence",
            sa.Integer(),
            nullable=False,
            server_default=sa.text("nextval('shard_fence'::regclass)"),
        ),
    )
    op.create_unique_constraint(op.f("uq_shards_fence"), "shards", ["fence"])
    op.add_column("shards", sa.Column("generation", sa.Integer()))
    op.add_column("shards", sa.Column("held_since", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("shards", "held_since")
    op.drop_column("shards", "generation")
    op.drop_constraint(op.f("uq_shards_fence"), "shards", type_="unique")
    op.drop_column("shards", "fence")
    op.drop_constraint(op.f("ck_nodes_incarnation"), "nodes", type_="check")
    op.drop_column("nodes", "incarnation")
    op.execute(sa.schema.DropSequence(sa.Sequence("shard_fence")))
