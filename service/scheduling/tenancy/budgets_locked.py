"""What preemption reads of budgets and quotas: for its search, and under lock for its claim.

The search (placement/preemption.py) reads the budgets of the deployments
its candidates belong to and how much of the class each candidate's tenant
holds beyond its guarantee, on committed data, locking nothing. The claim
then locks them, in the order every claim takes locks (the victims' nodes
first, then budget rows by (tenant, deployment), then each tenant's shared
advisory lock and quota row by tenant). A budget's replicas are counted in
a statement after the one that locks its row: in READ COMMITTED a statement
that waited for a lock reads other tables as committed before it started,
so counting there would miss what a concurrent preemption of the same
deployment freed while this one waited. A quota row is read by the
statement that locks it (a row locked after a wait is read as committed).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import text

from service.database.connections import Connection
from service.scheduling.tenancy.victims import BudgetLine

# (tenant, deployment) pairs as two arrays of the same length.
_PAIRS = "(SELECT * FROM unnest(CAST(:tenants AS text[]), CAST(:deployments AS text[])) AS p(t, d))"
_LINES = text(
    f"""
    SELECT b.tenant, b.deployment, b.min_available,
           (SELECT count(DISTINCT s.replica_id) FROM shards s
            WHERE s.deployment = b.deployment AND s.tenant = b.tenant) AS placed
    FROM disruption_budgets b
    WHERE (b.tenant, b.deployment) IN {_PAIRS}
    ORDER BY b.tenant, b.deployment
    """
)
_LOCK_BUDGETS = text(
    f"""
    SELECT b.tenant FROM disruption_budgets b
    WHERE (b.tenant, b.deployment) IN {_PAIRS}
    ORDER BY b.tenant, b.deployment
    FOR NO KEY UPDATE
    """
)
# What the tenant of the quota row `q` holds of its class beyond its
# guarantee (negative when below it).
BEYOND = "q.used - q.guaranteed"
# Per tenant with a quota of the class: BEYOND.
_BEYOND = text(
    f"""
    SELECT q.tenant, {BEYOND} AS beyond FROM tenant_quotas q
    WHERE q.gpu_class = :cls AND q.tenant = ANY(CAST(:tenants AS text[]))
    ORDER BY q.tenant
    """
)
# The tenants' shared advisory locks (quota_claims.TENANT_LOCK, as a claim
# and the counting triggers take them), then their quota rows, by tenant, and
# what each holds beyond its guarantee: in READ COMMITTED a row locked after
# a wait is read again as committed, so the figures are the locked rows'.
# (A statement of its own, or a CTE of one: preemption's claim reads its
# victims' shards in the same statement, placement/preemption.py.)
LOCK_QUOTAS_SQL = f"""
    WITH shared AS MATERIALIZED (
        SELECT t, pg_advisory_xact_lock_shared(46, hashtext(t)) AS locked
        FROM unnest(CAST(:tenants AS text[])) AS t ORDER BY t
    )
    SELECT q.tenant, {BEYOND} AS beyond FROM tenant_quotas q
    WHERE q.gpu_class = :cls AND q.tenant IN (SELECT t FROM shared)
    ORDER BY q.tenant
    FOR NO KEY UPDATE OF q
    """
_LOCK_QUOTAS = text(LOCK_QUOTAS_SQL)


def _pairs(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    ordered = sorted(set(pairs))
    return {"tenants": [t for t, _ in ordered], "deployments": [d for _, d in ordered]}


async def budget_lines(
    conn: Connection, pairs: Iterable[tuple[str, str]], *, lock: bool = False
) -> dict[tuple[str, str], BudgetLine]:
    """The budgets of these (tenant, deployment) pairs, with what is placed now.

    `lock`: take the budget rows first (FOR NO KEY UPDATE, by key), so no
    other preemption of these deployments commits until this transaction
    ends, then count.
    """
    params = _pairs(pairs)
    if not params["tenants"]:
        return {}
    if lock:
        await conn.execute(_LOCK_BUDGETS, params)
    return {
        (r.tenant, r.deployment): BudgetLine(r.tenant, r.deployment, r.min_available, r.placed)
        for r in await conn.execute(_LINES, params)
    }


async def held_beyond_guarantee(
    conn: Connection, gpu_class: str, tenants: Iterable[str], *, lock: bool = False
) -> dict[str, int]:
    """Per tenant with a quota of the class, GPUs it holds beyond its guarantee (negative: below).

    A tenant without a quota of the class is absent: its guarantee is 0, so
    all it holds is beyond. `lock`: take the tenants' shared advisory locks
    and their quota rows (by tenant), reading them as locked.
    """
    names = sorted(set(tenants))
    if not names:
        return {}
    params = {"cls": gpu_class, "tenants": names}
    statement = _LOCK_QUOTAS if lock else _BEYOND
    return {r.tenant: r.beyond for r in await conn.execute(statement, params)}
