"""Reservations: GPUs set aside for a tenant's window, replicas that promise to be gone by a time

Revision ID: 0024
Revises: 0025
Create Date: 2027-02-01 09:00:00

Issue 47 (service/scheduling/reservations/, docs/scheduler/reservations.md).

- reservations: one row per reservation (its spec as asked, its window
  [starts_at, ends_at), its state).
- gpus.reservation: the live reservation that sets the GPU aside (NULL:
  none). One column, so a GPU is set aside by at most one live reservation
  whatever the windows (stronger than "no two overlapping": reserve chooses
  among GPUs free now, and a GPU set aside is not free). The mark is cleared
  when the reservation ends. ix_gpus_reservation finds a reservation's GPUs;
  gpus.reservation_slot, which of its `count` replicas a GPU is room for
  (a GPU that fails takes its slot's GPUs out, and the slot is set aside
  again whole, by the shape's rules).
- gpu_pools.reserved, reserved_indices: the usable, unheld, untainted GPUs
  set aside (availability.pool_counts), a bucket of the partition; the
  partition CHECK is replaced by one that counts it (0022's code writes 0
  there and counts those GPUs free, which the new CHECK also accepts).
- shards.reservation: the reservation a replica was placed into; an index
  on shards.until (the column is 0025's, a replica's promise to be gone by
  then).
- tenancy_claim() counts a tenant's reserved GPUs no replica of its own holds
  as used (reserved GPUs count toward the limit from creation).

An expand migration (docs/deployment/upgrades.md): 0022's code keeps
working on it (it writes none of the new columns, and its pools' recounts
write reserved 0, which the new partition accepts).
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op
from service.database.online_migrations import create_index_concurrently

revision: str = "0024"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
keeps_working = "0022"

TABLES = (
    """
    CREATE TABLE IF NOT EXISTS reservations (
        id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        spec JSONB NOT NULL,
        gpu_class TEXT NOT NULL,
        gpus_per_replica INTEGER NOT NULL,
        count INTEGER NOT NULL,
        starts_at TIMESTAMP WITH TIME ZONE NOT NULL,
        ends_at TIMESTAMP WITH TIME ZONE,
        state TEXT DEFAULT 'SCHEDULED' NOT NULL,
        release_if_unused_after INTEGER,
        reason TEXT,
        missing_gpus INTEGER DEFAULT 0 NOT NULL,
        placed_into_at TIMESTAMP WITH TIME ZONE,
        started_at TIMESTAMP WITH TIME ZONE,
        created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
        ended_at TIMESTAMP WITH TIME ZONE,
        CONSTRAINT pk_reservations PRIMARY KEY (id),
        CONSTRAINT ck_reservations_id_length CHECK (char_length(id) BETWEEN 1 AND 253),
        CONSTRAINT ck_reservations_count CHECK (count > 0),
        CONSTRAINT ck_reservations_gpus_per_replica CHECK (gpus_per_replica > 0),
        CONSTRAINT ck_reservations_window CHECK (ends_at IS NULL OR ends_at > starts_at),
        CONSTRAINT ck_reservations_state
            CHECK (state IN ('SCHEDULED', 'ACTIVE', 'DEGRADED', 'ENDED')),
        CONSTRAINT ck_reservations_release_if_unused_after
            CHECK (release_if_unused_after >= 0),
        CONSTRAINT ck_reservations_missing_gpus CHECK (missing_gpus >= 0)
    )
    """,
    "CREATE INDEX IF NOT EXISTS ix_reservations_tenant_id ON reservations (tenant, id)",
    """
    CREATE INDEX IF NOT EXISTS ix_reservations_live ON reservations (starts_at, id)
        WHERE state <> 'ENDED'
    """,
)
# Constant defaults: added without rewriting the tables.
COLUMNS = (
    "ALTER TABLE gpus ADD COLUMN IF NOT EXISTS reservation TEXT",
    "ALTER TABLE gpus ADD COLUMN IF NOT EXISTS reservation_slot INTEGER",
    "ALTER TABLE gpu_pools ADD COLUMN IF NOT EXISTS reserved INTEGER DEFAULT 0 NOT NULL",
    """
    ALTER TABLE gpu_pools ADD COLUMN IF NOT EXISTS reserved_indices INTEGER[]
        DEFAULT '{}' NOT NULL
    """,
    "ALTER TABLE shards ADD COLUMN IF NOT EXISTS reservation TEXT",
)
# The partition with the reserved bucket, added NOT VALID and validated
# apart (a SHARE UPDATE EXCLUSIVE lock: pools keep being written meanwhile).
PARTITION = """
    DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conname = 'ck_gpu_pools_partition_reserved') THEN
            ALTER TABLE gpu_pools ADD CONSTRAINT ck_gpu_pools_partition_reserved
                CHECK (total = free + allocated + unhealthy + withheld + reserved) NOT VALID;
            ALTER TABLE gpu_pools ADD CONSTRAINT ck_gpu_pools_reserved_indices
                CHECK (cardinality(reserved_indices) = reserved) NOT VALID;
        END IF;
    END $$
"""
VALIDATE = (
    "ALTER TABLE gpu_pools VALIDATE CONSTRAINT ck_gpu_pools_partition_reserved",
    "ALTER TABLE gpu_pools VALIDATE CONSTRAINT ck_gpu_pools_reserved_indices",
    "ALTER TABLE gpu_pools DROP CONSTRAINT IF EXISTS ck_gpu_pools_partition",
)

# What a tenant has set aside of a class and holds none of itself: counted
# as used by tenancy_claim (and fit's headroom), so reserved GPUs count
# toward the limit from the reservation's creation, and a replica of the
# tenant placed on them (into the reservation) is counted once, as held.
RESERVED = """
CREATE OR REPLACE FUNCTION tenancy_reserved(p_tenant text, p_class text) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT CAST(count(*) AS integer)
    FROM reservations r JOIN gpus g ON g.reservation = r.id
    WHERE r.tenant = p_tenant AND r.gpu_class = p_class AND g.gpu_class = p_class
      AND r.state <> 'ENDED'
      AND NOT EXISTS (SELECT 1 FROM allocated_gpus a
                      WHERE a.node_id = g.node_id AND a.gpu_index = g.idx
                        AND a.tenant = p_tenant)
$$
"""

# 0022's tenancy_claim, with the reserved GPUs counted as used.
CLAIM = """
CREATE OR REPLACE FUNCTION tenancy_claim(
    p_tenant text, p_class text, p_wait boolean,
    OUT known boolean, OUT busy boolean, OUT used integer, OUT gpu_limit integer,
    OUT guaranteed integer)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    busy := false;
    guaranteed := 0;
    IF p_wait THEN
        PERFORM pg_advisory_xact_lock_shared(46, hashtext(p_tenant));
    ELSIF NOT pg_try_advisory_xact_lock_shared(46, hashtext(p_tenant)) THEN
        known := true;
        busy := true;
        RETURN;
    END IF;
    known := p_tenant = 'default' OR EXISTS (SELECT 1 FROM tenants t WHERE t.id = p_tenant);
    IF p_wait THEN
        SELECT q.used, q.gpu_limit, q.guaranteed INTO used, gpu_limit, guaranteed
        FROM tenant_quotas q WHERE q.tenant = p_tenant AND q.gpu_class = p_class
        FOR NO KEY UPDATE;
    ELSE
        SELECT q.used, q.gpu_limit, q.guaranteed INTO used, gpu_limit, guaranteed
        FROM tenant_quotas q WHERE q.tenant = p_tenant AND q.gpu_class = p_class
        FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM tenant_quotas q
                                 WHERE q.tenant = p_tenant AND q.gpu_class = p_class) THEN
            busy := true;
        END IF;
    END IF;
    IF used IS NOT NULL THEN
        used := used + tenancy_reserved(p_tenant, p_class);
    END IF;
    guaranteed := coalesce(guaranteed, 0);
END
$$
"""


def upgrade() -> None:
    for statement in (*TABLES, *COLUMNS, PARTITION, *VALIDATE, RESERVED, CLAIM):
        op.execute(statement)
    create_index_concurrently(
        "ix_gpus_reservation", "gpus", "(reservation)", where="reservation IS NOT NULL"
    )
    create_index_concurrently(
        "ix_gpu_pools_reserved",
        "gpu_pools",
        "(gpu_class, node_id)",
        where="schedulable AND reserved > 0",
    )
    create_index_concurrently(
        "ix_shards_reservation", "shards", "(reservation)", where="reservation IS NOT NULL"
    )
    create_index_concurrently("ix_shards_until", "shards", '("until")', where='"until" IS NOT NULL')


def downgrade() -> None:
    # 0022's tenancy_claim again, before the function it calls goes.
    spec = importlib.util.spec_from_file_location(
        "tenancy_0022", Path(__file__).with_name("023_0022_tenancy.py")
    )
    assert spec is not None and spec.loader is not None
    tenancy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tenancy)
    op.execute(tenancy.CLAIM)
    op.execute("DROP INDEX IF EXISTS ix_shards_until")
    op.execute("DROP INDEX IF EXISTS ix_shards_reservation")
    op.execute("DROP INDEX IF EXISTS ix_gpu_pools_reserved")
    op.execute("DROP INDEX IF EXISTS ix_gpus_reservation")
    op.execute(
        "ALTER TABLE gpu_pools ADD CONSTRAINT ck_gpu_pools_partition"
        " CHECK (total = free + allocated + unhealthy + withheld)"
    )
    op.execute("ALTER TABLE gpu_pools DROP CONSTRAINT ck_gpu_pools_partition_reserved")
    op.execute("ALTER TABLE gpu_pools DROP CONSTRAINT ck_gpu_pools_reserved_indices")
    op.drop_column("shards", "reservation")
    op.drop_column("gpu_pools", "reserved_indices")
    op.drop_column("gpu_pools", "reserved")
    op.drop_column("gpus", "reservation_slot")
    op.drop_column("gpus", "reservation")
    op.execute("DROP TABLE reservations")
    op.execute("DROP FUNCTION tenancy_reserved(text, text)")
