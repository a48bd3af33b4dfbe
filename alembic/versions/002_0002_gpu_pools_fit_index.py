"""gpu_pools ordered by free GPUs, for place's best fit

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 12:20:00

place() wants the nodes that will be left with the fewest free GPUs. Without
an index ordered by `free`, finding them sorts every node with room of the
class; with it, the best few are the first entries of an index range.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_gpu_pools_fit",
        "gpu_pools",
        ["gpu_class", "free", "node_id"],
        unique=False,
        postgresql_where=sa.text("schedulable AND free > 0"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_gpu_pools_fit",
        table_name="gpu_pools",
        postgresql_where=sa.text("schedulable AND free > 0"),
    )
