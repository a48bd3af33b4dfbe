"""Tenancy's tables (issue 46; migration 0022): tenants, their quotas per GPU class, disruption budgets.

Part of the schema: every table here is on service/tables.py's metadata,
apart only to keep each module one idea (and under its size), as
service/health_tables.py is. Whoever reads the whole schema from the
metadata imports this module too: alembic/env.py,
tests/operations/test_migrations.py. What the rows mean is
service/scheduling/tenancy/'s; the tenancy columns of shards,
allocated_gpus and api_tokens are in service/tables.py with their tables.
"""

from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
    text,
)

from service.bounds import id_length_check
from service.tables import metadata

# Tenants (issue 46; migration 0022): teams or environments sharing the
# fleet. "default", where replicas placed without a tenant go, needs no row.
tenants = Table(
    "tenants",
    metadata,
    Column("id", Text, primary_key=True),
    Column("description", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(id_length_check("id"), name="id_length"),
)

# A tenant's quota for one GPU class: GPUs it can always get back
# (guaranteed) and a limit it never exceeds (NULL: none). `used` is what it
# holds of the class, kept by triggers on allocated_gpus in every write's
# transaction and checked by every claim under this row's lock
# (service/scheduling/tenancy/quota_claims.py).
tenant_quotas = Table(
    "tenant_quotas",
    metadata,
    Column("tenant", Text, ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_class", Text, nullable=False),
    Column("guaranteed", Integer, nullable=False),
    Column("gpu_limit", Integer),
    Column("used", Integer, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("tenant", "gpu_class"),
    CheckConstraint("guaranteed >= 0", name="guaranteed"),
    CheckConstraint("gpu_limit >= guaranteed", name="gpu_limit"),
    CheckConstraint("used >= 0", name="used"),
)

# A deployment's disruption budget: preemption never leaves it fewer than
# min_available placed replicas (service/scheduling/tenancy/budgets.py).
disruption_budgets = Table(
    "disruption_budgets",
    metadata,
    Column("tenant", Text, ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
    Column("deployment", Text, nullable=False),
    Column("min_available", Integer, nullable=False),
    PrimaryKeyConstraint("tenant", "deployment"),
    CheckConstraint("min_available >= 0", name="min_available"),
    CheckConstraint(id_length_check("deployment"), name="deployment_length"),
)
