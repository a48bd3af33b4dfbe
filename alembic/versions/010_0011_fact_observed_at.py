"""When each reported fact block was observed: GPUs, fabrics, storage

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 08:45:00

Schedulers ask for facts no older than some age (maxAge on freeGpus, nodes and
place); last_seen cannot answer that, because heartbeats move it without
saying anything about the GPUs. Each block's time is the agent's observedAt
on the service's clock (service/fleet/observed_at.py), and
observed_at_correction says why the agent's clock was not taken as it was.
Rows registered before this revision take the time their report last
changed (reported_at): never fresher than the truth, and the agent's next
report sets the real time.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BLOCKS = ("gpus_observed_at", "fabrics_observed_at", "storage_observed_at")


def upgrade() -> None:
    for column in BLOCKS:
        op.add_column(
            "nodes",
            sa.Column(
                column, sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
            ),
        )
    op.add_column("nodes", sa.Column("observed_at_correction", sa.Text()))
    op.execute(
        "UPDATE nodes SET gpus_observed_at = reported_at, fabrics_observed_at = reported_at, "
        "storage_observed_at = reported_at"
    )


def downgrade() -> None:
    for column in ("observed_at_correction", *reversed(BLOCKS)):
        op.drop_column("nodes", column)
