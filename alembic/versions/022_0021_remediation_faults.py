"""Each fault a remediation acted on, the ones that joined it included

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 09:00:00

Issue 44. A fault that joined an open remediation only raised its action: its
taint was never put (XID 48 after XID 94 left the GPU offered) and nothing
remembered it, so the remediation's DONE could not have lifted it. Each fault
a remediation acts on is now a row here (service/fleet/health/faults.py):
which of its GPUs, the taint it put there, when. Its DONE lifts those taints
and clears those faults' sticky health; the circuit breaker counts the GPUs
they tainted in the last hour, which is why its index moves here from
remediations.

Stored remediations get one row each, their opening fault as it stands now
(its GPUs, scope, taint key, created_at; the action it has now).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Only this revision's code: 0020's writes a remediation without its fault rows,
# and a DONE by this code then lifts nothing of it (docs/deployment/upgrades.md:
# the previous release's processes leave rotation during the roll).
keeps_working = "0021"


def upgrade() -> None:
    op.create_table(
        "remediation_faults",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("remediation_id", sa.BigInteger(), nullable=False),
        sa.Column("gpu_class", sa.Text(), nullable=True),
        sa.Column("gpu_indices", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("cause", sa.Text(), nullable=False),
        sa.Column("taint_key", sa.Text(), nullable=True),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint(
            "action IN ('NONE', 'RESTART_APP', 'RESET_GPU', 'REBOOT_NODE', 'CONTACT_SUPPORT')",
            name=op.f("ck_remediation_faults_action"),
        ),
        sa.CheckConstraint(
            "scope IN ('GPU', 'NVLINK_GROUP', 'NODE')", name=op.f("ck_remediation_faults_scope")
        ),
        sa.CheckConstraint(
            "cardinality(gpu_indices) > 0", name=op.f("ck_remediation_faults_gpu_indices")
        ),
        sa.ForeignKeyConstraint(
            ["remediation_id"],
            ["remediations.id"],
            name=op.f("fk_remediation_faults_remediation_id_remediations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_remediation_faults")),
    )
    op.create_index(
        "ix_remediation_faults_remediation_id", "remediation_faults", ["remediation_id", "id"]
    )
    op.create_index("ix_remediation_faults_class", "remediation_faults", ["gpu_class", "at"])
    op.execute(
        """
        INSERT INTO remediation_faults (remediation_id, gpu_class, gpu_indices, scope, trigger,
                                        action, cause, taint_key, at)
        SELECT id, gpu_class, gpu_indices, scope, trigger, action, cause, taint_key, created_at
        FROM remediations ORDER BY id
        """
    )
    op.drop_index("ix_remediations_class", table_name="remediations")


def downgrade() -> None:
    op.create_index("ix_remediations_class", "remediations", ["gpu_class", "created_at"])
    op.drop_table("remediation_faults")
