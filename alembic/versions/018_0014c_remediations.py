"""Remediations and validation results: the policy's work, and the tests that re-admit a GPU

Revision ID: 0014c
Revises: 0018
Create Date: 2026-12-06 05:00:00

Issue 38. A fault the remediation policy acts on (service/fleet/health/policy.py)
becomes a remediation: work for the operator's automation with the state
machine PENDING -> IN_PROGRESS -> AWAITING_VALIDATION -> DONE, or ESCALATED,
or SUPPRESSED by the circuit breaker; its taint is lifted only once the tests
the policy requires have passed (validation_results). gpus.recovery_action
keeps the driver's recovery action as the agent read it, which XID 154 asks
for. Numbered within issue 38's 0014, chained after main's head at landing
(0018) so there is one head.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0014c"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("gpus", sa.Column("recovery_action", sa.Text(), nullable=True))
    op.create_table(
        "remediations",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("gpu_indices", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("gpu_class", sa.Text(), nullable=True),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("cause", sa.Text(), nullable=False),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("taint_key", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("failures", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "since", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint(
            "action IN ('NONE', 'RESTART_APP', 'RESET_GPU', 'REBOOT_NODE', 'CONTACT_SUPPORT')",
            name=op.f("ck_remediations_action"),
        ),
        sa.CheckConstraint(
            "state IN ('PENDING', 'IN_PROGRESS', 'AWAITING_VALIDATION', 'DONE', 'ESCALATED',"
            " 'SUPPRESSED')",
            name=op.f("ck_remediations_state"),
        ),
        sa.CheckConstraint(
            "scope IN ('GPU', 'NVLINK_GROUP', 'NODE')", name=op.f("ck_remediations_scope")
        ),
        sa.CheckConstraint(
            "cardinality(gpu_indices) > 0", name=op.f("ck_remediations_gpu_indices")
        ),
        sa.CheckConstraint(
            "attempts >= 0 AND failures BETWEEN 0 AND attempts",
            name=op.f("ck_remediations_attempts"),
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_remediations_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_remediations")),
    )
    op.create_index("ix_remediations_node_id", "remediations", ["node_id", "id"])
    op.create_index("ix_remediations_state", "remediations", ["state", "id"])
    op.create_index("ix_remediations_class", "remediations", ["gpu_class", "created_at"])
    op.create_table(
        "validation_results",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("remediation_id", sa.BigInteger(), nullable=True),
        sa.Column("gpu_indices", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("test", sa.Text(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("details", sa.Text(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint(
            "char_length(test) BETWEEN 1 AND 253", name=op.f("ck_validation_results_test_length")
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_validation_results_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["remediation_id"],
            ["remediations.id"],
            name=op.f("fk_validation_results_remediation_id_remediations"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_validation_results")),
    )
    op.create_index(
        "ix_validation_results_remediation_id", "validation_results", ["remediation_id"]
    )


def downgrade() -> None:
    op.drop_table("validation_results")
    op.drop_table("remediations")
    op.drop_column("gpus", "recovery_action")
