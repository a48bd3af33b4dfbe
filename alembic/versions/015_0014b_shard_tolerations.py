"""Shards keep the tolerations they were placed with: NO_EXECUTE taints tell their engines to stop

Revision ID: 0014b
Revises: 0014a
Create Date: 2026-12-07 12:00:00

Issue 38. A NO_EXECUTE taint on a GPU tells the engines of the shards there to
stop (shardsToStop, reason TAINTED), at once when the shard does not tolerate
it, after its tolerationSeconds when it does (service/scheduling/taints.py,
stop_by_sql). So a shard keeps the tolerations of the place or allocate that
stored it (NULL: none; every shard stored before this revision tolerated
nothing, which is what NULL says).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0014b"
down_revision: str | None = "0014a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("shards", sa.Column("tolerations", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("shards", "tolerations")
