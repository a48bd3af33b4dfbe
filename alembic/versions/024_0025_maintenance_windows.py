"""Maintenance windows: windows, their nodes, the replicas asked to move; shards.until; taint source MAINTENANCE

Revision ID: 0025
Revises: 0022
Create Date: 2027-02-03 22:00:00

Issue 47. A rack's firmware upgrade was a cordon and a drain that took
replicas away with no regard for how many of a deployment stayed up. A
maintenance window names the nodes and the time; the service drains them in
waves within the deployments' disruption budgets
(service/fleet/maintenance/).

- maintenance_windows (id, start_at, end_at, drain_lead, drain_at, reason,
  state, actor, created_at, changed_at), maintenance_nodes (window_id,
  node_id), maintenance_moves (window_id, replica_id, asked_at): new tables,
  empty, so their indexes are built with them.
- shards.until: the time a replica promised to be released by
  (PlaceInput.until), nullable, no default: no rewrite.
- taints' source CHECK admits MAINTENANCE: added NOT VALID beside the old
  one, validated (a scan under SHARE UPDATE EXCLUSIVE, which blocks no
  write), then the old one dropped, so no moment accepts a source neither
  allows.

An expand migration (docs/deployment/upgrades.md): 0022's code keeps
working on it (it reads none of the new tables and writes no `until`).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0025"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# 0022's code keeps working: it never reads the new tables, and its taints' sources are admitted.
keeps_working = "0022"

SOURCES = ("OPERATOR", "XID", "DRIFT", "POLICY", "VALIDATION", "MAINTENANCE")
STATES = ("SCHEDULED", "DRAINING", "IN_PROGRESS", "DONE", "CANCELLED")


def _listed(values: Sequence[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


# Every statement can run again (IF NOT EXISTS): a run that failed part way is
# run again from the top (squawk: prefer-robust-stmts).
STATEMENTS = (
    f"""
    CREATE TABLE IF NOT EXISTS maintenance_windows (
        id TEXT NOT NULL,
        start_at TIMESTAMP WITH TIME ZONE NOT NULL,
        end_at TIMESTAMP WITH TIME ZONE NOT NULL,
        drain_lead INTEGER NOT NULL,
        drain_at TIMESTAMP WITH TIME ZONE NOT NULL,
        reason TEXT NOT NULL,
        state TEXT DEFAULT 'SCHEDULED' NOT NULL,
        actor TEXT,
        created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
        changed_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
        CONSTRAINT pk_maintenance_windows PRIMARY KEY (id),
        CONSTRAINT ck_maintenance_windows_id_length CHECK (char_length(id) BETWEEN 1 AND 253),
        CONSTRAINT ck_maintenance_windows_window CHECK (end_at > start_at),
        CONSTRAINT ck_maintenance_windows_drain_lead CHECK (drain_lead >= 0),
        CONSTRAINT ck_maintenance_windows_state CHECK (state IN ({_listed(STATES)}))
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS ix_maintenance_windows_open ON maintenance_windows (drain_at)
        WHERE state IN ('SCHEDULED', 'DRAINING', 'IN_PROGRESS')
    """,
    """
    CREATE TABLE IF NOT EXISTS maintenance_nodes (
        window_id TEXT NOT NULL,
        node_id TEXT NOT NULL,
        CONSTRAINT pk_maintenance_nodes PRIMARY KEY (window_id, node_id),
        CONSTRAINT fk_maintenance_nodes_window_id_maintenance_windows FOREIGN KEY (window_id)
            REFERENCES maintenance_windows (id) ON DELETE CASCADE,
        CONSTRAINT fk_maintenance_nodes_node_id_nodes FOREIGN KEY (node_id)
            REFERENCES nodes (id) ON DELETE CASCADE
    )
    """,
    "CREATE INDEX IF NOT EXISTS ix_maintenance_nodes_node_id ON maintenance_nodes (node_id)",
    """
    CREATE TABLE IF NOT EXISTS maintenance_moves (
        window_id TEXT NOT NULL,
        replica_id TEXT NOT NULL,
        asked_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
        CONSTRAINT pk_maintenance_moves PRIMARY KEY (window_id, replica_id),
        CONSTRAINT fk_maintenance_moves_window_id_maintenance_windows FOREIGN KEY (window_id)
            REFERENCES maintenance_windows (id) ON DELETE CASCADE
    )
    """,
    "CREATE INDEX IF NOT EXISTS ix_maintenance_moves_replica_id ON maintenance_moves (replica_id)",
    "ALTER TABLE shards ADD COLUMN IF NOT EXISTS until TIMESTAMP WITH TIME ZONE",
    # The wider CHECK beside the old one, validated, then the old one dropped
    # and the new one named as tables.py names it; each step skipped once done.
    f"""
    DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conname IN ('ck_taints_source', 'ck_taints_source_0025')
                         AND pg_get_constraintdef(oid) LIKE '%MAINTENANCE%') THEN
            ALTER TABLE taints ADD CONSTRAINT ck_taints_source_0025
                CHECK (source IN ({_listed(SOURCES)})) NOT VALID;
        END IF;
        IF EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_taints_source_0025') THEN
            ALTER TABLE taints VALIDATE CONSTRAINT ck_taints_source_0025;
            ALTER TABLE taints DROP CONSTRAINT IF EXISTS ck_taints_source;
            ALTER TABLE taints RENAME CONSTRAINT ck_taints_source_0025 TO ck_taints_source;
        END IF;
    END $$
    """,
)


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DELETE FROM taints WHERE source = 'MAINTENANCE'")
    op.execute("ALTER TABLE taints DROP CONSTRAINT ck_taints_source")
    op.execute(
        "ALTER TABLE taints ADD CONSTRAINT ck_taints_source"
        f" CHECK (source IN ({_listed(SOURCES[:-1])}))"
    )
    op.drop_column("shards", "until")
    op.drop_table("maintenance_moves")
    op.drop_table("maintenance_nodes")
    op.drop_table("maintenance_windows")
