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
- shards: tenant, priority, deployment, borrowed. Existing shards belong to
  "default" at priority 0 in no deployment; as "default" has no quota,
  nothing they hold is within a guarantee, so they are borrowed.
- allocated_gpus: tenant and gpu_class, written by the claim, so the
  counters' triggers join nothing. Existing rows take their shard's tenant
  ("default") and their GPU's class (UNKNOWN, the class of a GPU no longer
  reported, for a held GPU that left its node's report).
- api_tokens.tenant: a scheduler token bound to a tenant places only as it.
- tenancy_claim(tenant, class, wait): what a claim asks of one (tenant,
  class); tenancy_count_claimed/freed: the triggers that keep `used`.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 46: quota_claims.TENANT_LOCK, the advisory lock class of a tenant.
CLAIM = """
CREATE FUNCTION tenancy_claim(
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
CREATE FUNCTION tenancy_count_{name}() RETURNS trigger
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
    CREATE TRIGGER tenancy_claimed AFTER INSERT ON allocated_gpus
        REFERENCING NEW TABLE AS claimed FOR EACH STATEMENT
        EXECUTE FUNCTION tenancy_count_claimed()
    """,
    """
    CREATE TRIGGER tenancy_freed AFTER DELETE ON allocated_gpus
        REFERENCING OLD TABLE AS freed FOR EACH STATEMENT
        EXECUTE FUNCTION tenancy_count_freed()
    """,
)


def _id_check(column: str) -> str:
    return f"char_length({column}) BETWEEN 1 AND 253"


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("description", sa.Text()),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.CheckConstraint(_id_check("id"), name=op.f("ck_tenants_id_length")),
    )
    op.create_table(
        "tenant_quotas",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("gpu_class", sa.Text(), nullable=False),
        sa.Column("guaranteed", sa.Integer(), nullable=False),
        sa.Column("gpu_limit", sa.Integer()),
        sa.Column("used", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "gpu_class", name=op.f("pk_tenant_quotas")),
        sa.ForeignKeyConstraint(
            ["tenant"],
            ["tenants.id"],
            name=op.f("fk_tenant_quotas_tenant_tenants"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("guaranteed >= 0", name=op.f("ck_tenant_quotas_guaranteed")),
        sa.CheckConstraint("gpu_limit >= guaranteed", name=op.f("ck_tenant_quotas_gpu_limit")),
        sa.CheckConstraint("used >= 0", name=op.f("ck_tenant_quotas_used")),
    )
    op.create_table(
        "disruption_budgets",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("deployment", sa.Text(), nullable=False),
        sa.Column("min_available", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "deployment", name=op.f("pk_disruption_budgets")),
        sa.ForeignKeyConstraint(
            ["tenant"],
            ["tenants.id"],
            name=op.f("fk_disruption_budgets_tenant_tenants"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("min_available >= 0", name=op.f("ck_disruption_budgets_min_available")),
        sa.CheckConstraint(
            _id_check("deployment"), name=op.f("ck_disruption_budgets_deployment_length")
        ),
    )

    op.add_column(
        "shards",
        sa.Column("tenant", sa.Text(), server_default=sa.text("'default'"), nullable=False),
    )
    op.add_column(
        "shards", sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.add_column("shards", sa.Column("deployment", sa.Text()))
    op.add_column(
        "shards",
        sa.Column("borrowed", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    # What existing shards were: "default" has no quota, so all it holds is borrowed.
    op.execute("UPDATE shards SET borrowed = true")
    op.create_check_constraint(op.f("ck_shards_tenant_length"), "shards", _id_check("tenant"))
    op.create_check_constraint(
        op.f("ck_shards_priority"), "shards", "priority BETWEEN -1000000 AND 1000000"
    )
    op.create_check_constraint(
        op.f("ck_shards_deployment_length"), "shards", _id_check("deployment")
    )
    op.create_index(
        "ix_shards_deployment",
        "shards",
        ["deployment", "tenant"],
        postgresql_where=sa.text("deployment IS NOT NULL"),
    )

    op.add_column(
        "allocated_gpus",
        sa.Column("tenant", sa.Text(), server_default=sa.text("'default'"), nullable=False),
    )
    op.add_column("allocated_gpus", sa.Column("gpu_class", sa.Text()))
    op.execute(
        """
        UPDATE allocated_gpus a SET gpu_class = coalesce(
            (SELECT g.gpu_class FROM gpus g WHERE g.node_id = a.node_id AND g.idx = a.gpu_index),
            'UNKNOWN')
        """
    )
    op.alter_column("allocated_gpus", "gpu_class", nullable=False)
    op.create_index("ix_allocated_gpus_tenant", "allocated_gpus", ["tenant", "gpu_class"])

    op.add_column("api_tokens", sa.Column("tenant", sa.Text()))
    op.create_check_constraint(
        op.f("ck_api_tokens_scheduler_tenant"),
        "api_tokens",
        "tenant IS NULL OR role = 'scheduler'",
    )

    op.execute(CLAIM)
    op.execute(COUNT.format(name="claimed", sign="+"))
    op.execute(COUNT.format(name="freed", sign="-"))
    for trigger in TRIGGERS:
        op.execute(trigger)


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
