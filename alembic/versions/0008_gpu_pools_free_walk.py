"""ix_gpu_pools_free carries each pool's free count, so freeGpus walks it without the table

Revision ID: 0008
Revises: 0006
Create Date: 2026-12-04 08:30:00

freeGpus with a class pages through gpu_pools in node order from the `after`
cursor (capacity.free_gpus_query) and keeps the nodes with at least minFree
free GPUs. ix_gpu_pools_free has that order and that cursor predicate, but
not the count: every entry of the walk fetched its table row to test
`free >= minFree` (about a thousand buffer reads for a page of a thousand).
With `free` included, the walk is an index-only scan that stops at the
page's end. No write costs more: `free` is already a key of ix_gpu_pools_fit,
so a change of it never was a HOT update, and the index is replaced, not
added.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0008"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# availability.pool_offers(""), as it stood at this revision.
OFFERS = sa.text("schedulable AND free > 0")


def upgrade() -> None:
    op.drop_index("ix_gpu_pools_free", table_name="gpu_pools", postgresql_where=OFFERS)
    op.create_index(
        "ix_gpu_pools_free",
        "gpu_pools",
        ["gpu_class", "node_id"],
        unique=False,
        postgresql_include=["free"],
        postgresql_where=OFFERS,
    )


def downgrade() -> None:
    op.drop_index("ix_gpu_pools_free", table_name="gpu_pools", postgresql_where=OFFERS)
    op.create_index(
        "ix_gpu_pools_free",
        "gpu_pools",
        ["gpu_class", "node_id"],
        unique=False,
        postgresql_where=OFFERS,
    )
