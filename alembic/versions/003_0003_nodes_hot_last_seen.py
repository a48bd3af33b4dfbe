"""last_seen unindexed and room on the page, so a heartbeat is a HOT update

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 02:00:00

Every heartbeat and every unchanged re-registration moves nodes.last_seen.
With ix_nodes_last_seen, each of those updates wrote a new entry into all
four indexes of nodes (PostgreSQL's HOT update is possible only when no
indexed column changes and the page has room): the churn benchmark saw 87,000
dead node rows for 2,000 live ones after 20 s of re-registration and the
freeGpus question 1.5x slower until vacuum. Without the index, and with a
fillfactor that leaves a third of each page free, the new row version lands
on the same page and no index is touched. The liveness sweep, the only reader
of last_seen as a range, scans the table instead: once every few seconds,
about a millisecond per 10,000 nodes.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_nodes_last_seen", table_name="nodes")
    # Applies to pages written from now on; existing pages get the room as
    # vacuum and updates move rows.
    op.execute("ALTER TABLE nodes SET (fillfactor = 70)")


def downgrade() -> None:
    op.execute("ALTER TABLE nodes RESET (fillfactor)")
    op.create_index("ix_nodes_last_seen", "nodes", ["last_seen"], unique=False)
