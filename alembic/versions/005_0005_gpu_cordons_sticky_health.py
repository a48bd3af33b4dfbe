"""GPU cordons, sticky health reasons and the node's boot id

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04 05:30:00

A GPU's cordon and its sticky reasons (xid_<n>) are the service's memory of
a GPU, kept apart from what the agent reports (healthy, health_reasons) so a
report never overwrites them: the cordon survives re-registration, and a
critical XID stays until a reset (a new boot id, or an operator's
clearGpuHealth). service/scheduling/availability.py says what they mean for placement.
Nullable or defaulted columns: adding them rewrites no existing row.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("gpus", sa.Column("cordon_reason", sa.Text(), nullable=True))
    op.add_column("gpus", sa.Column("cordon_actor", sa.Text(), nullable=True))
    op.add_column(
        "gpus",
        sa.Column(
            "sticky_reasons",
            postgresql.ARRAY(sa.Text()),
            nullable=False,
            server_default=sa.text("'{}'"),
        ),
    )
    op.add_column("nodes", sa.Column("boot_id", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("nodes", "boot_id")
    op.drop_column("gpus", "sticky_reasons")
    op.drop_column("gpus", "cordon_actor")
    op.drop_column("gpus", "cordon_reason")
