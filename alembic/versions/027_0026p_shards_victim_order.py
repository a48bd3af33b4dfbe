"""Shards in the order preemption tries victims, and a mark on replicas with several shards on one node

Revision ID: 0026p
Revises: 0026a
Create Date: 2027-02-04 02:00:00

Issue 46. A place that must preempt read every shard that could be a victim
(a hash join with the class's pools and an aggregate per replica, 9 ms of a
34.8 ms place at 10,000 nodes) to try the first few sets of one victim.

- ix_shards_victim_order walks the shards in the order of sets of one
  (service/scheduling/tenancy/victims.set_key: priority, GPUs, the
  youngest, then the id as Python compares it, COLLATE "C"), so the window
  of placement/preemption.py's _SINGLES reads as many index entries as it
  uses.
- shards.crowded (nullable, no default: no rewrite) is true on the shards of
  a replica that has another shard on the same node: together they may make
  room where none alone does, which a walk of single shards cannot see.
  Kept by the trigger shards_crowded (AFTER INSERT, per statement, with the
  inserted rows as a transition table) for every writer of shards, old code
  during an upgrade included; set on the rows there are by one UPDATE after
  the trigger exists. Never cleared while the shard lives (a sibling
  released leaves it true: the mark is only ever too wide, which costs the
  search a look, never a victim). ix_shards_crowded holds only the marked.

An expand migration (docs/deployment/upgrades.md): 0024's code keeps working
on it (it reads neither; the trigger marks what it writes). The indexes are
built CONCURRENTLY; the trigger's CREATE takes a SHARE ROW EXCLUSIVE lock on
shards for a moment, under the migration's lock_timeout and retry.
"""

from collections.abc import Sequence

from alembic import op
from service.database.online_migrations import create_index_concurrently

revision: str = "0026p"
down_revision: str | None = "0026a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
keeps_working = "0024"

COLUMN = "ALTER TABLE shards ADD COLUMN IF NOT EXISTS crowded BOOLEAN"
# The writer of the new shards holds their nodes' locks (every claim does),
# so a sibling stored by another transaction on the same node committed
# before this statement began, and this UPDATE (a statement of its own, with
# its own snapshot) sees it.
MARK = """
CREATE OR REPLACE FUNCTION shards_mark_crowded() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE shards s SET crowded = true
    WHERE s.replica_id IN (SELECT a.replica_id FROM added a)
      AND s.crowded IS NOT TRUE
      AND EXISTS (SELECT 1 FROM shards o
                  WHERE o.replica_id = s.replica_id AND o.node_id = s.node_id
                    AND o.shard_id <> s.shard_id);
    RETURN NULL;
END
$$
"""
TRIGGER = """
CREATE OR REPLACE TRIGGER shards_crowded AFTER INSERT ON shards
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT
    EXECUTE FUNCTION shards_mark_crowded()
"""
# The shards stored before the trigger: few rows change (replicas of several
# shards on one node), one pass reads the table.
BACKFILL = """
UPDATE shards s SET crowded = true
WHERE s.crowded IS NOT TRUE AND (s.replica_id, s.node_id) IN (
    SELECT x.replica_id, x.node_id FROM shards x GROUP BY 1, 2 HAVING count(*) > 1)
"""
VICTIM_ORDER = '(priority, cardinality(gpu_indices), created_at DESC, replica_id COLLATE "C")'


def upgrade() -> None:
    for statement in (COLUMN, MARK, TRIGGER, BACKFILL):
        op.execute(statement)
    create_index_concurrently("ix_shards_victim_order", "shards", VICTIM_ORDER)
    create_index_concurrently("ix_shards_crowded", "shards", "(replica_id)", where="crowded")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_shards_crowded")
    op.execute("DROP INDEX IF EXISTS ix_shards_victim_order")
    op.execute("DROP TRIGGER IF EXISTS shards_crowded ON shards")
    op.execute("DROP FUNCTION IF EXISTS shards_mark_crowded()")
    op.execute("ALTER TABLE shards DROP COLUMN IF EXISTS crowded")
