"""Drift findings name their remediation; nodes say whether their agent looked for HCAs

Revision ID: 0019
Revises: 0014d
Create Date: 2026-12-06 08:00:00

Issue 38. A new drift finding is a remediation like an XID's (through the
policy's circuit breaker and the 7-day escalation,
service/fleet/health/drift.py); the finding keeps its id, so the one it
ends when it clears, or moves when it moves, is the one it made. Findings
stored before keep their own taint (tainted) and a NULL id.

nodes.hca_discovery: whether the agent looked for InfiniBand adapters
(LOOKED, NO_INFINIBAND, NOT_ASKED; NULL from an agent that does not say),
so a node that was not asked is not HCA_MISSING.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0019"
down_revision: str | None = "0014d"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("hca_discovery", sa.Text(), nullable=True))
    op.create_check_constraint(
        op.f("ck_nodes_hca_discovery"),
        "nodes",
        "hca_discovery IN ('LOOKED', 'NO_INFINIBAND', 'NOT_ASKED')",
    )
    op.add_column("drift_findings", sa.Column("remediation_id", sa.BigInteger(), nullable=True))
    op.create_foreign_key(
        op.f("fk_drift_findings_remediation_id_remediations"),
        "drift_findings",
        "remediations",
        ["remediation_id"],
        ["id"],
        ondelete="SET NULL",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("fk_drift_findings_remediation_id_remediations"), "drift_findings", type_="foreignkey"
    )
    op.drop_column("drift_findings", "remediation_id")
    op.drop_constraint(op.f("ck_nodes_hca_discovery"), "nodes", type_="check")
    op.drop_column("nodes", "hca_discovery")
