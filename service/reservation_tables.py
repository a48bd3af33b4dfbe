"""Reservations' table (issue 47; migration 0024): GPUs set aside for a tenant's window.

Part of the schema: on service/tables.py's metadata, apart only to keep each
module one idea (as service/tenancy_tables.py is); imported wherever the
whole schema is read from the metadata (alembic/env.py,
tests/operations/test_migrations.py). Which GPUs a reservation sets aside is
gpus.reservation (service/tables.py); shards.until and shards.reservation
are with their table. What the rows mean is
service/scheduling/reservations/'s.
"""

from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from service.bounds import id_length_check
from service.tables import metadata

# One row per reservation, kept after it ends (state ENDED, its GPUs'
# marks cleared) so a re-sent reserve of the id answers what is stored.
# Windows are half-open [starts_at, ends_at); ends_at NULL: until released.
reservations = Table(
    "reservations",
    metadata,
    Column("id", Text, primary_key=True),
    Column("tenant", Text, nullable=False),
    # The reserve as asked (shape, count, window, releaseIfUnusedAfter,
    # reason): a reserve re-sent with the same id is compared with it.
    Column("spec", JSONB, nullable=False),
    Column("gpu_class", Text, nullable=False),
    Column("gpus_per_replica", Integer, nullable=False),
    Column("count", Integer, nullable=False),
    Column("starts_at", DateTime(timezone=True), nullable=False),
    Column("ends_at", DateTime(timezone=True)),
    Column("state", Text, nullable=False, server_default=text("'SCHEDULED'")),
    Column("release_if_unused_after", Integer),
    Column("reason", Text),
    # GPUs it should set aside but could not replace (DEGRADED when > 0).
    Column("missing_gpus", Integer, nullable=False, server_default=text("0")),
    # When a replica was first placed into it (releaseIfUnusedAfter reads it).
    Column("placed_into_at", DateTime(timezone=True)),
    # When its start was made (the until-replicas on its GPUs stopped).
    Column("started_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("ended_at", DateTime(timezone=True)),
    # A DEGRADED one's missing slots are not tried again before then (migration
    # 0026a; reservations/replacing.py), unless free GPUs of its class
    # appeared since the last try: more than free_seen are offered.
    Column("next_attempt_at", DateTime(timezone=True)),
    Column("free_seen", Integer),
    CheckConstraint(id_length_check("id"), name="id_length"),
    CheckConstraint("count > 0", name="count"),
    CheckConstraint("gpus_per_replica > 0", name="gpus_per_replica"),
    CheckConstraint("ends_at IS NULL OR ends_at > starts_at", name="window"),
    CheckConstraint("state IN ('SCHEDULED', 'ACTIVE', 'DEGRADED', 'ENDED')", name="state"),
    CheckConstraint("release_if_unused_after >= 0", name="release_if_unused_after"),
    CheckConstraint("missing_gpus >= 0", name="missing_gpus"),
)
# A tenant's reservations in id order (the `reservations` list).
Index("ix_reservations_tenant_id", reservations.c.tenant, reservations.c.id)
# The live ones by start: what the timeline's transitions look at.
Index(
    "ix_reservations_live",
    reservations.c.starts_at,
    reservations.c.id,
    postgresql_where=text("state <> 'ENDED'"),
)
