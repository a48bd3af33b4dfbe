"""The pool census index: fit counts a class's pools by kind, one index descent per kind

Revision ID: 0016
Revises: 0014b
Create Date: 2027-01-12 09:00:00

Issue 39. fit read every pool of the class and grouped them (a GROUP BY that
compares each of a large class's pools with its group, plus a node lookup
per unschedulable pool): its cost grew with the cluster, past twice one
place at 100k nodes. ix_gpu_pools_census orders a class's pools by the
columns that tell one kind of node from another to judge()
(service/scheduling/pool_census.py), then by node id, so the census walks
the distinct kinds, counts each kind's index entries and reads its first
ids, without reading the table.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0016"
down_revision: str | None = "0014b"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = [
    "gpu_class", "schedulable", "free", "withheld", "last_resort", "nvlink_known", "free_groups",
    "node_id",
]  # fmt: skip


# pool_census.census_predicate: every pool, named only by the census.
PREDICATE = "free >= 0"


def upgrade() -> None:
    op.create_index(
        "ix_gpu_pools_census", "gpu_pools", COLUMNS, postgresql_where=sa.text(PREDICATE)
    )


def downgrade() -> None:
    op.drop_index("ix_gpu_pools_census", table_name="gpu_pools")
