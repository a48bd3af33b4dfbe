"""Pools summarize their free NVLink groups: fit with nvlinkShards walks pools, not GPUs

Revision ID: 0015b
Revises: 0015
Create Date: 2027-01-10 09:30:00

Issue 39. fit with nvlinkShards read every candidate node's GPUs for its
free NVLink groups (1.5 s at 100k nodes, 85-127 ms at 10k). gpu_pools now
keeps, with free_indices, the NVLink group of each free GPU (free_groups,
same order; NULL for a GPU in none) and whether any GPU of the class
reported NVLink peers (nvlink_known), kept by the writes that keep the pools
(availability.pool_counts, gpu_pools.move_to_allocated). Existing pools are
filled from their GPUs here.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0015b"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "gpu_pools",
        sa.Column(
            "free_groups",
            postgresql.ARRAY(sa.Integer()),
            nullable=False,
            server_default=sa.text("'{}'"),
        ),
    )
    op.add_column(
        "gpu_pools",
        sa.Column("nvlink_known", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    # Each pool's free GPUs are its free_indices (kept exact by its CHECK).
    op.execute(
        """
        UPDATE gpu_pools p SET
            free_groups = coalesce(ARRAY(
                SELECT g.nvlink_group FROM unnest(p.free_indices) i
                JOIN gpus g ON g.node_id = p.node_id AND g.idx = i ORDER BY i), '{}'),
            nvlink_known = EXISTS (
                SELECT 1 FROM gpus g WHERE g.node_id = p.node_id AND g.gpu_class = p.gpu_class
                  AND g.nvlink_peers IS NOT NULL)
        """
    )
    op.create_check_constraint(
        op.f("ck_gpu_pools_free_groups"), "gpu_pools", "cardinality(free_groups) = free"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_gpu_pools_free_groups"), "gpu_pools", type_="check")
    op.drop_column("gpu_pools", "nvlink_known")
    op.drop_column("gpu_pools", "free_groups")
