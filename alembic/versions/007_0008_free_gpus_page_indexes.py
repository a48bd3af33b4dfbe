"""freeGpus' page reads indexes only: the pools' walk carries the free count, usable GPUs by node

Revision ID: 0008
Revises: 0006
Create Date: 2026-12-04 08:30:00

The whole freeGpus answer at 10,000 nodes is read in pages of a thousand
(issue 18: it must cost no more than one plain aggregate over every GPU).
Each page (capacity.free_gpus_query) walks gpu_pools in node order from the
`after` cursor, then reads the page's free GPUs.

- ix_gpu_pools_free had the walk's order and cursor predicate but not the
  count: every walked entry fetched its table row to test `free >= minFree`
  (about a thousand buffer reads a page). With `free` included, the walk is
  index-only and stops at the page's end. No write costs more: `free` is a
  key of ix_gpu_pools_fit already, so a change of it never was a HOT update,
  and the index is replaced, not added.
- ix_gpus_usable: the GPUs that may take work (availability.gpu_usable), by
  node and index, with their class. A page's free GPUs come from it in one
  index-only scan over the page's node ids, merged with their allocations,
  instead of 8,000 wide table rows: half the page's PostgreSQL CPU. Its cost
  is an index entry per GPU row written; GPU rows are written when a node
  registers or its hardware or health changes, never by an unchanged report.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0008"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# availability.pool_offers("") and availability.gpu_usable(""), as they stood
# at this revision.
OFFERS = sa.text("schedulable AND free > 0")
USABLE = sa.text("((healthy AND cardinality(sticky_reasons) = 0) AND cordon_reason IS NULL)")


def _pools_free_index(include: list[str]) -> None:
    op.create_index(
        "ix_gpu_pools_free",
        "gpu_pools",
        ["gpu_class", "node_id"],
        unique=False,
        postgresql_include=include,
        postgresql_where=OFFERS,
    )


def upgrade() -> None:
    op.drop_index("ix_gpu_pools_free", table_name="gpu_pools", postgresql_where=OFFERS)
    _pools_free_index(["free"])
    op.create_index(
        "ix_gpus_usable",
        "gpus",
        ["node_id", "idx"],
        unique=False,
        postgresql_include=["gpu_class"],
        postgresql_where=USABLE,
    )


def downgrade() -> None:
    op.drop_index("ix_gpus_usable", table_name="gpus", postgresql_where=USABLE)
    op.drop_index("ix_gpu_pools_free", table_name="gpu_pools", postgresql_where=OFFERS)
    _pools_free_index([])
