"""Tenancy: tenants, quotas per GPU class counted in the claim, disruption budgets

Revision ID: 0022
Revises: 0021
Create Date: 2027-01-20 09:00:00

Issue 46. One fleet is shared by many teams; place was first come, first
served, and every control plane above the inventory kept its own GPU budget
outside it. Here the claim itself checks the tenant's limit
(service/scheduling/tenancy/quota_claims.py).

- tenants, tenant_quotas (per tenant and GPU class: guaranteed, gpu_limit,
  and `used`, the GPUs of the class the tenant holds, kept by the triggers
  below), disruption_budgets (per tenant and deployment: min_available).
  The tenant "default" needs no row.
- shards: tenant, priority, deployment, borrowed, each with a constant
  default (no rewrite): existing shards belong to "default" at priority 0 in
  no deployment, and are borrowed ("default" has no guarantee). Their bounds
  are the requests' checks (tenancy/charges.charge_problem): a CHECK would
  scan shards under an ACCESS EXCLUSIVE lock.
- allocated_gpus: tenant (default "default") and gpu_class, written by the
  claim, so the counters' triggers join nothing. gpu_class is filled for
  existing rows in batches (their GPU's class; UNKNOWN, the class of a GPU no
  longer reported, for a held GPU that left its node's report) and stays
  nullable: 0021's code, still serving during a roll, writes none, and such
  a row is counted against no quota.
- api_tokens.tenant: a scheduler token bound to a tenant places only as it.
- tenancy_claim(tenant, class, wait): what a claim asks of one (tenant,
  class); tenancy_count_claimed/freed: the triggers that keep `used`.
- The new indexes on shards and allocated_gpus are built CONCURRENTLY.

An expand migration (docs/deployment/upgrades.md): 0021's code keeps
working on it (its inserts take the defaults; it claims without quotas).
"""

from collections.abc import Sequence

from alembic import op
from service.database.online_migrations import backfill_in_batches, create_index_concurrently

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# 0021's code keeps working: it writes no charge, and its claims take the defaults.
keeps_working = "0021"

# 46: quota_claims.TENANT_LOCK, the advisory lock class of a tenant.
CLAIM = """
CREATE OR REPLACE FUNCTION tenancy_claim(
    p_tenant text, p_class text, p_wait boolean,
    OUT known boolean, OUT busy boolean, OUT used integer, OUT gpu_limit integer,
    OUT guaranteed integer)
LANGUAGE plpgsql VOLATILE AS $$
-- What a claim asks of one (tenant, class), in the claim's statement:
-- VOLATILE, so each query here reads what is committed when it runs (a quota
-- set while this waited is the one checked), not the statement's snapshot.
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
    -- No quota row: no counter (used NULL), no limit, nothing guaranteed.
    guaranteed := coalesce(guaranteed, 0);
END
$$
"""

# The counters, kept by every write of allocated_gpus. The writer holds its
# tenants' advisory locks shared (a claim took them already; a release, a
# cascade or an undo takes them here), then the quota rows in order.
COUNT = """
CREATE OR REPLACE FUNCTION tenancy_count_{name}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(46, hashtext(c.tenant))
    FROM (SELECT DISTINCT r.tenant FROM {name} r ORDER BY 1) c;
    PERFORM 1 FROM tenant_quotas q
    WHERE (q.tenant, q.gpu_class) IN (SELECT r.tenant, r.gpu_class FROM {name} r)
    ORDER BY q.tenant, q.gpu_class
    FOR NO KEY UPDATE;
    UPDATE tenant_quotas q SET used = q.used {sign} d.n
    FROM (SELECT r.tenant, r.gpu_class, count(*) AS n FROM {name} r GROUP BY 1, 2) d
    WHERE q.tenant = d.tenant AND q.gpu_class = d.gpu_class;
    RETURN NULL;
END
$$
"""
TRIGGERS = (
    """
    CREATE OR REPLACE TRIGGER tenancy_claimed AFTER INSERT ON allocated_gpus
        REFERENCING NEW TABLE AS claimed FOR EACH STATEMENT
        EXECUTE FUNCTION tenancy_count_claimed()
    """,
    """
    CREATE OR REPLACE TRIGGER tenancy_freed AFTER DELETE ON allocated_gpus
        REFERENCING OLD TABLE AS freed FOR EACH STATEMENT
        EXECUTE FUNCTION tenancy_count_freed()
    """,
)


# Every statement can run again (IF NOT EXISTS, OR REPLACE): the indexes are
# built CONCURRENTLY and the backfill in batches, outside the migration's
# transaction, so a run that failed part way is run again from the top
# (squawk: prefer-robust-stmts).
TABLES = (
    """
    CREATE TABLE IF NOT EXISTS tenants (
        id TEXT NOT NULL,
        description TEXT,
        created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
        CONSTRAINT pk_tenants PRIMARY KEY (id),
        CONSTRAINT ck_tenants_id_length CHECK (char_length(id) BETWEEN 1 AND 253)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS tenant_quotas (
        tenant TEXT NOT NULL,
        gpu_class TEXT NOT NULL,
        guaranteed INTEGER NOT NULL,
        gpu_limit INTEGER,
        used INTEGER DEFAULT 0 NOT NULL,
        CONSTRAINT pk_tenant_quotas PRIMARY KEY (tenant, gpu_class),
        CONSTRAINT fk_tenant_quotas_tenant_tenants FOREIGN KEY (tenant)
            REFERENCES tenants (id) ON DELETE CASCADE,
        CONSTRAINT ck_tenant_quotas_guaranteed CHECK (guaranteed >= 0),
        CONSTRAINT ck_tenant_quotas_gpu_limit CHECK (gpu_limit >= guaranteed),
        CONSTRAINT ck_tenant_quotas_used CHECK (used >= 0)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS disruption_budgets (
        tenant TEXT NOT NULL,
        deployment TEXT NOT NULL,
        min_available INTEGER NOT NULL,
        CONSTRAINT pk_disruption_budgets PRIMARY KEY (tenant, deployment),
        CONSTRAINT fk_disruption_budgets_tenant_tenants FOREIGN KEY (tenant)
            REFERENCES tenants (id) ON DELETE CASCADE,
        CONSTRAINT ck_disruption_budgets_min_available CHECK (min_available >= 0),
        CONSTRAINT ck_disruption_budgets_deployment_length
            CHECK (char_length(deployment) BETWEEN 1 AND 253)
    )
    """,
)
# Constant defaults: the columns are added without rewriting the tables.
COLUMNS = (
    "ALTER TABLE shards ADD COLUMN IF NOT EXISTS tenant TEXT DEFAULT 'default' NOT NULL",
    "ALTER TABLE shards ADD COLUMN IF NOT EXISTS priority INTEGER DEFAULT 0 NOT NULL",
    "ALTER TABLE shards ADD COLUMN IF NOT EXISTS deployment TEXT",
    "ALTER TABLE shards ADD COLUMN IF NOT EXISTS borrowed BOOLEAN DEFAULT true NOT NULL",
    "ALTER TABLE allocated_gpus ADD COLUMN IF NOT EXISTS tenant TEXT DEFAULT 'default' NOT NULL",
    "ALTER TABLE allocated_gpus ADD COLUMN IF NOT EXISTS gpu_class TEXT",
    "ALTER TABLE api_tokens ADD COLUMN IF NOT EXISTS tenant TEXT",
    # api_tokens holds a row per token ever made (hundreds at most) and none
    # has a tenant yet: the check's scan is instant.
    """
    DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conname = 'ck_api_tokens_scheduler_tenant') THEN
            ALTER TABLE api_tokens ADD CONSTRAINT ck_api_tokens_scheduler_tenant
                CHECK (tenant IS NULL OR role = 'scheduler');
        END IF;
    END $$
    """,
)


def upgrade() -> None:
    for statement in (*TABLES, *COLUMNS, CLAIM):
        op.execute(statement)
    op.execute(COUNT.format(name="claimed", sign="+"))
    op.execute(COUNT.format(name="freed", sign="-"))
    for trigger in TRIGGERS:
        op.execute(trigger)
    backfill_in_batches(
        """
        UPDATE allocated_gpus a SET gpu_class = coalesce(
            (SELECT g.gpu_class FROM gpus g WHERE g.node_id = a.node_id AND g.idx = a.gpu_index),
            'UNKNOWN')
        WHERE (a.node_id, a.gpu_index) IN (
            SELECT node_id, gpu_index FROM allocated_gpus WHERE gpu_class IS NULL LIMIT :batch)
        """
    )
    create_index_concurrently(
        "ix_shards_deployment", "shards", "(deployment, tenant)", where="deployment IS NOT NULL"
    )
    create_index_concurrently("ix_allocated_gpus_tenant", "allocated_gpus", "(tenant, gpu_class)")


def downgrade() -> None:
    op.execute("DROP TRIGGER tenancy_freed ON allocated_gpus")
    op.execute("DROP TRIGGER tenancy_claimed ON allocated_gpus")
    op.execute("DROP FUNCTION tenancy_count_freed()")
    op.execute("DROP FUNCTION tenancy_count_claimed()")
    op.execute("DROP FUNCTION tenancy_claim(text, text, boolean)")
    op.drop_constraint(op.f("ck_api_tokens_scheduler_tenant"), "api_tokens")
    op.drop_column("api_tokens", "tenant")
    op.drop_index("ix_allocated_gpus_tenant", table_name="allocated_gpus")
    op.drop_column("allocated_gpus", "gpu_class")
    op.drop_column("allocated_gpus", "tenant")
    op.drop_index("ix_shards_deployment", table_name="shards")
    for column in ("borrowed", "deployment", "priority", "tenant"):
        op.drop_column("shards", column)
    op.drop_table("disruption_budgets")
    op.drop_table("tenant_quotas")
    op.drop_table("tenants")
