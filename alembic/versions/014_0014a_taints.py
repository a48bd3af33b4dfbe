"""Taints on GPUs and nodes, and what they withhold from requests that do not tolerate them

Revision ID: 0014a
Revises: 0015b
Create Date: 2026-12-07 09:00:00

Issue 38. A GPU (or a whole node) gets taints (service/scheduling/taints.py):
NO_SCHEDULE and NO_EXECUTE keep it from every request that does not
tolerate them, PREFER_NO_SCHEDULE sends it last.

- taints: one row per taint, on a GPU (gpu_index) or a node (NULL), one per
  key on each (unique with NULLS NOT DISTINCT, PostgreSQL 15+). Not a column
  of gpus: a report deletes the rows of GPUs it no longer lists, and a GPU
  that fell off the bus and comes back after a reboot must come back tainted.
- gpus.withheld, gpus.last_resort: the taints on the GPU and its node, as
  marks on the row (availability.taint_marks), so that the question every
  request without tolerations asks of every GPU is a column test.
- gpu_pools.withheld(_indices), last_resort(_indices): the pool's usable,
  unheld GPUs a taint withholds, and its free GPUs a PREFER_NO_SCHEDULE
  taint sends last (availability.pool_counts), with the partition
  total = free + allocated + unhealthy + withheld as a CHECK. Every existing
  row has none (there are no taints yet), so 0 and '{}' are exact; the
  columns then keep no default, so a writer that forgets them fails.
- gpus.cordon_since, nodes.admin_since: since when a cordon or drain holds,
  which a cordon shows as the `since` of its OPERATOR NO_SCHEDULE taint.
- ix_gpu_pools_fit includes the two counts (the window's test stays
  index-only). ix_gpu_pools_last_resort (best-fit order),
  ix_gpu_pools_withheld (node order) and ix_gpu_pools_withheld_class (a
  class's, in node order) hold the pools a PREFER_NO_SCHEDULE taint or a
  toleration concerns: empty without taints.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0014a"
down_revision: str | None = "0015b"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# availability.pool_offers("") and pool_withholds("") as they stand at this revision.
OFFERS = "schedulable AND free > 0"
WITHHOLDS = "schedulable AND withheld > 0"
EFFECTS = ("PREFER_NO_SCHEDULE", "NO_SCHEDULE", "NO_EXECUTE")
SOURCES = ("OPERATOR", "XID", "DRIFT", "POLICY", "VALIDATION")


def _listed(values: Sequence[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def upgrade() -> None:
    op.create_table(
        "taints",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=True),
        sa.Column("effect", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column(
            "since", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint("char_length(key) BETWEEN 1 AND 253", name=op.f("ck_taints_key_length")),
        sa.CheckConstraint("gpu_index >= 0", name=op.f("ck_taints_gpu_index")),
        sa.CheckConstraint(f"effect IN ({_listed(EFFECTS)})", name=op.f("ck_taints_effect")),
        sa.CheckConstraint(f"source IN ({_listed(SOURCES)})", name=op.f("ck_taints_source")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_taints_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_taints")),
        sa.UniqueConstraint(
            "node_id",
            "gpu_index",
            "key",
            name=op.f("uq_taints_node_id_gpu_index_key"),
            postgresql_nulls_not_distinct=True,
        ),
    )
    for column in ("withheld", "last_resort"):
        op.add_column(
            "gpus", sa.Column(column, sa.Boolean(), server_default=sa.text("false"), nullable=False)
        )
    # Since when a cordon or drain holds: the `since` of the taint it shows
    # as. Those in place now are dated by this migration.
    op.add_column("gpus", sa.Column("cordon_since", sa.DateTime(timezone=True), nullable=True))
    op.add_column("nodes", sa.Column("admin_since", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE gpus SET cordon_since = now() WHERE cordon_reason IS NOT NULL")
    op.execute("UPDATE nodes SET admin_since = now() WHERE admin_state IS NOT NULL")
    for column in ("withheld", "last_resort"):
        op.add_column(
            "gpu_pools",
            sa.Column(column, sa.Integer(), server_default=sa.text("0"), nullable=False),
        )
        op.add_column(
            "gpu_pools",
            sa.Column(
                f"{column}_indices",
                postgresql.ARRAY(sa.Integer()),
                server_default=sa.text("'{}'"),
                nullable=False,
            ),
        )
        op.alter_column("gpu_pools", column, server_default=None)
        op.alter_column("gpu_pools", f"{column}_indices", server_default=None)
    op.create_check_constraint(
        op.f("ck_gpu_pools_withheld_indices"),
        "gpu_pools",
        "cardinality(withheld_indices) = withheld",
    )
    op.create_check_constraint(
        op.f("ck_gpu_pools_last_resort_indices"),
        "gpu_pools",
        "cardinality(last_resort_indices) = last_resort AND last_resort_indices <@ free_indices",
    )
    op.create_check_constraint(
        op.f("ck_gpu_pools_partition"),
        "gpu_pools",
        "total = free + allocated + unhealthy + withheld",
    )
    op.drop_index("ix_gpu_pools_fit", table_name="gpu_pools", postgresql_where=sa.text(OFFERS))
    op.create_index(
        "ix_gpu_pools_fit",
        "gpu_pools",
        ["gpu_class", "free", "node_id"],
        postgresql_include=["withheld", "last_resort"],
        postgresql_where=sa.text(OFFERS),
    )
    op.create_index(
        "ix_gpu_pools_last_resort",
        "gpu_pools",
        ["gpu_class", "free", "node_id"],
        postgresql_where=sa.text(f"{OFFERS} AND last_resort > 0"),
    )
    op.create_index(
        "ix_gpu_pools_withheld",
        "gpu_pools",
        ["node_id", "gpu_class"],
        postgresql_where=sa.text(WITHHOLDS),
    )
    op.create_index(
        "ix_gpu_pools_withheld_class",
        "gpu_pools",
        ["gpu_class", "node_id"],
        postgresql_where=sa.text(WITHHOLDS),
    )


def downgrade() -> None:
    op.drop_index("ix_gpu_pools_withheld_class", table_name="gpu_pools")
    op.drop_index("ix_gpu_pools_withheld", table_name="gpu_pools")
    op.drop_index("ix_gpu_pools_last_resort", table_name="gpu_pools")
    op.drop_index("ix_gpu_pools_fit", table_name="gpu_pools")
    op.create_index(
        "ix_gpu_pools_fit",
        "gpu_pools",
        ["gpu_class", "free", "node_id"],
        postgresql_where=sa.text(OFFERS),
    )
    for name in ("partition", "last_resort_indices", "withheld_indices"):
        op.drop_constraint(op.f(f"ck_gpu_pools_{name}"), "gpu_pools", type_="check")
    for column in ("withheld", "withheld_indices", "last_resort", "last_resort_indices"):
        op.drop_column("gpu_pools", column)
    for column in ("withheld", "last_resort", "cordon_since"):
        op.drop_column("gpus", column)
    op.drop_column("nodes", "admin_since")
    op.drop_table("taints")
