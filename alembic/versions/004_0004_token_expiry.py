"""api_tokens.expires_at: tokens that end by themselves

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 05:30:00

A token handed to a contractor, a CI job or a laptop should stop working on
its own: revocation needs someone to remember. NULL is a token that never
expires (every token made before this revision). Expiry is judged by the
database's clock, like every other time here, so service processes with
drifting clocks agree on when a token ended.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("api_tokens", "expires_at")
