"""An index of the nodes a NO_EXECUTE taint is on

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 09:30:00

shardsToMove (service/fleet/health/moves.py) starts from the nodes that carry
a NO_EXECUTE taint. Without an index on them it read every taint, XID and
operator taints alike, so its page cost grew with the fleet's faults
(tests/scheduling/test_page_costs.py loads a taints table of several pages).
Partial: NO_EXECUTE taints are the rare ones.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_taints_no_execute",
        "taints",
        ["node_id"],
        postgresql_where=sa.text("effect = 'NO_EXECUTE'"),
    )


def downgrade() -> None:
    op.drop_index("ix_taints_no_execute", table_name="taints")
