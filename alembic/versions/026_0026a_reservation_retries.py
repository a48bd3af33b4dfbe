"""Reservations' retries: when a DEGRADED reservation's missing slots are tried again

Revision ID: 0026a
Revises: 0024
Create Date: 2027-02-05 02:00:00

Issue 47. A reservation whose failed GPUs could not be replaced (DEGRADED)
was tried again every timeline round (1 s) in every service process: each
try runs place's planner under its nodes' locks. Now a try claims the
reservation's row and writes when the next one is due
(service/scheduling/reservations/replacing.py):

- reservations.next_attempt_at: no try before then, unless free GPUs of its
  class appeared since;
- reservations.free_seen: how many free GPUs of its class were offered at
  the last try (the "appeared since" above).

Both nullable, no default: no rewrite. An expand migration
(docs/deployment/upgrades.md): 0024's code keeps working on it (it writes
neither column, and reads them nowhere: its rounds try every time).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0026a"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
keeps_working = "0024"

COLUMNS = (
    "ALTER TABLE reservations ADD COLUMN IF NOT EXISTS next_attempt_at TIMESTAMP WITH TIME ZONE",
    "ALTER TABLE reservations ADD COLUMN IF NOT EXISTS free_seen INTEGER",
)


def upgrade() -> None:
    for statement in COLUMNS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("ALTER TABLE reservations DROP COLUMN IF EXISTS free_seen")
    op.execute("ALTER TABLE reservations DROP COLUMN IF EXISTS next_attempt_at")
