"""Placement groups: prefill and decode replicas placed as one unit

Revision ID: 0015
Revises: 0012
Create Date: 2027-01-10 09:00:00

Issue 39. placement_groups holds a group's spec (roles, shapes, locality,
KV roles: a retry with the same spec is answered from it, another refused)
and its generation (scaleGroup moves it; a change naming an older one is
CONFLICT). group_members names each member replica (<groupId>-<role>-<n>);
the members' shards are ordinary rows of `shards`.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0015"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "placement_groups",
        sa.Column("group_id", sa.Text(), primary_key=True),
        sa.Column("spec", postgresql.JSONB(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False, server_default=sa.text("1")),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
    )
    op.create_table(
        "group_members",
        sa.Column("replica_id", sa.Text(), primary_key=True),
        sa.Column(
            "group_id",
            sa.Text(),
            sa.ForeignKey("placement_groups.group_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.UniqueConstraint("group_id", "role", "n"),
    )


def downgrade() -> None:
    op.drop_table("group_members")
    op.drop_table("placement_groups")
