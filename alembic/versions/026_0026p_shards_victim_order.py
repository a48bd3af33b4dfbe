"""An index of shards in the order preemption tries victims: priority, GPUs, youngest, id

Revision ID: 0026p
Revises: 0024
Create Date: 2027-02-04 02:00:00

Issue 46. A place that must preempt read every shard that could be a victim
(a hash join with the class's pools and an aggregate per replica, 9 ms of a
34.8 ms place at 10,000 nodes) to try the first few sets of one victim.
ix_shards_victim_order walks the shards in the order of sets of one
(service/scheduling/tenancy/victims.set_key: priority, GPUs, the youngest,
then the id as Python compares it, COLLATE "C"), so the window of
placement/preemption.py's _SINGLES reads as many index entries as it uses.

An expand migration (docs/deployment/upgrades.md): an index only, built
CONCURRENTLY (no write waits for it); 0024's code keeps working on it.
"""

from collections.abc import Sequence

from alembic import op
from service.database.online_migrations import create_index_concurrently

revision: str = "0026p"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
keeps_working = "0024"

COLUMNS = '(priority, cardinality(gpu_indices), created_at DESC, replica_id COLLATE "C")'


def upgrade() -> None:
    create_index_concurrently("ix_shards_victim_order", "shards", COLUMNS)


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_shards_victim_order")
