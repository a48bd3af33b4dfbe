"""Hardware profiles and drift findings: what a node should have, and where it differs

Revision ID: 0014d
Revises: 0014c
Create Date: 2026-12-06 05:30:00

Issue 38. An operator's hardware profile (service/fleet/health/drift.py) says
what the nodes a label selects should have; drift_findings keeps each
difference a node's stored report shows (one per kind), since when, and where
the policy's taint for it went (taint_on: the GPUs; NULL, the node), so the
taint that clears with it is the one it put.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0014d"
down_revision: str | None = "0014c"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS = (
    "kind IN ('GPU_MISSING', 'GPU_CLASS_CHANGED', 'HCA_MISSING', 'HCA_RATE_LOW',"
    " 'NVLINK_DEGRADED', 'MEMORY_LOW')"
)


def upgrade() -> None:
    op.create_table(
        "hardware_profiles",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("selector_key", sa.Text(), nullable=False),
        sa.Column("selector_value", sa.Text(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=True),
        sa.Column("gpu_class", sa.Text(), nullable=True),
        sa.Column("hca_count", sa.Integer(), nullable=True),
        sa.Column("hca_rate_gbps", sa.Integer(), nullable=True),
        sa.Column("nvlink_group_size", sa.Integer(), nullable=True),
        sa.Column("memory_total_mb", sa.Integer(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_hardware_profiles")),
    )
    op.create_table(
        "drift_findings",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("expected", sa.Text(), nullable=False),
        sa.Column("observed", sa.Text(), nullable=False),
        sa.Column("gpu_indices", postgresql.ARRAY(sa.Integer()), nullable=True),
        sa.Column("taint_on", postgresql.ARRAY(sa.Integer()), nullable=True),
        sa.Column("tainted", sa.Boolean(), nullable=False),
        sa.Column(
            "since", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint(KINDS, name=op.f("ck_drift_findings_kind")),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_drift_findings_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", "kind", name=op.f("pk_drift_findings")),
    )


def downgrade() -> None:
    op.drop_table("drift_findings")
    op.drop_table("hardware_profiles")
