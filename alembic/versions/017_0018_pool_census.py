"""Pools carry their node's fabrics and NVLink domain; the pool census index

Revision ID: 0018
Revises: 0017
Create Date: 2027-01-12 09:00:00

Issue 39. fit read every pool of the class and grouped them (a GROUP BY that
compares each of a large class's pools with its group, plus a node lookup
per unschedulable pool), and placement groups read, per pool, the node's
fabrics and the NVLink domain of its GPUs: their cost grew with the
cluster, past twice one place at 100k nodes for fit and ten times one place
at 10k for placeGroup.

- gpu_pools.nvlink_domain: the NVLink domain every GPU of the class on the
  node reports ('' for none), from the GPUs, as the recount keeps it
  (availability.pool_counts); fabrics and fabric_rates: the node's fabrics by
  name and their link rates (gpu_pools.attached_fabrics), written by every
  recount. Existing pools are filled here; the columns then keep no default,
  so a writer that forgets them fails.
- ix_gpu_pools_census orders a class's pools by the columns that tell one
  kind of node from another (service/scheduling/pool_census.py), then by
  node id, so the census walks the distinct kinds, counts each kind's index
  entries and reads its first ids, without reading the table. Partial on a
  predicate every pool meets and only the census writes (free >= 0), so no
  other statement's plan moves to it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# pool_census.KIND after gpu_class, then node_id; census_predicate("").
COLUMNS = [
    "gpu_class", "schedulable", "free", "withheld", "last_resort", "nvlink_known", "free_groups",
    "fabrics", "fabric_rates", "nvlink_domain", "node_id",
]  # fmt: skip
PREDICATE = "free >= 0"


def upgrade() -> None:
    op.add_column(
        "gpu_pools",
        sa.Column("nvlink_domain", sa.Text(), server_default=sa.text("''"), nullable=False),
    )
    op.add_column(
        "gpu_pools",
        sa.Column(
            "fabrics", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False
        ),
    )
    op.add_column(
        "gpu_pools",
        sa.Column(
            "fabric_rates",
            postgresql.ARRAY(sa.Integer()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
    )
    # availability.shared_nvlink_domain and gpu_pools.attached_fabrics as they
    # stand at this revision.
    op.execute(
        """
        UPDATE gpu_pools p SET
            nvlink_domain = coalesce((
                SELECT CASE WHEN count(*) = count(g.nvlink_domain)
                             AND count(DISTINCT g.nvlink_domain) = 1
                        THEN min(g.nvlink_domain) END
                FROM gpus g WHERE g.node_id = p.node_id AND g.gpu_class = p.gpu_class), ''),
            fabrics = ARRAY(SELECT fa.fabric FROM fabric_attachments fa
                            WHERE fa.node_id = p.node_id ORDER BY fa.fabric),
            fabric_rates = ARRAY(SELECT fa.rate_gbps FROM fabric_attachments fa
                                 WHERE fa.node_id = p.node_id ORDER BY fa.fabric)
        """
    )
    for column in ("nvlink_domain", "fabrics", "fabric_rates"):
        op.alter_column("gpu_pools", column, server_default=None)
    op.create_check_constraint(
        op.f("ck_gpu_pools_fabric_rates"),
        "gpu_pools",
        "cardinality(fabric_rates) = cardinality(fabrics)",
    )
    op.create_index(
        "ix_gpu_pools_census", "gpu_pools", COLUMNS, postgresql_where=sa.text(PREDICATE)
    )


def downgrade() -> None:
    op.drop_index("ix_gpu_pools_census", table_name="gpu_pools")
    op.drop_constraint(op.f("ck_gpu_pools_fabric_rates"), "gpu_pools", type_="check")
    for column in ("fabric_rates", "fabrics", "nvlink_domain"):
        op.drop_column("gpu_pools", column)
