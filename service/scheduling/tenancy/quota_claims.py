"""The limit, checked in the statement that claims the GPUs: exact from every service process.

How a claim (allocations/storing.store_statement) is charged, in the same
statement that writes its shards:

1. Per call the caller's checks passed for, the GPUs it asks for, by class
   (each GPU's class read by its key), charged to the call's tenant.
2. Per (tenant, class), in that order, tenancy_claim() (migration 0022):
   a shared advisory lock on the tenant (TENANT_LOCK), whether the tenant
   exists, and, when the tenant has a quota for the class, its row locked
   (FOR NO KEY UPDATE) with `used` and `limit`. `used` counts the
   tenant's reserved GPUs it holds none of itself (migration 0024:
   tenancy_reserved), so reserved GPUs count toward the limit from the
   reservation's creation; a GPU of the tenant's own reservation that a
   call takes is not asked again (it is counted once). The function is VOLATILE, so
   it reads what is committed when it runs, after any wait, not the
   statement's older snapshot: a quota set while the claim waited is the one
   it checks.
3. A call is admitted when its tenant exists and, for each class, `used` plus
   what this statement's calls of the tenant ask up to and including it (a
   running sum in call order) is within the limit. Only admitted calls write
   anything.

`used` is a counter on the quota row, kept by statement-level triggers on
allocated_gpus (AFTER INSERT and AFTER DELETE, with transition tables:
migration 0022), so every path that frees GPUs keeps it exact without
remembering to: releases, a node's removal (cascades), the undo of an
incomplete claim, a LOST node's shards freed, and whatever comes later
(preemption). allocated_gpus rows carry their tenant and class, written by
the claim, so the triggers join nothing. The quota row's lock is held until
the transaction ends, so two claims of one tenant's class serialize on it,
and the second sees the first's GPUs counted: N concurrent places with room
for K under the limit place exactly K.

Tenants and classes without a quota row (the default tenant, unless an
operator set one) have no counter and take no exclusive lock, so claims of
the fleet's unlimited majority never queue on one row; what they hold is an
aggregate over allocated_gpus (ix_allocated_gpus_tenant) when asked.

Setting or removing a tenant takes the tenant's advisory lock exclusively
(tenants.py), and every writer of the tenant's allocated_gpus holds it shared
until it commits (the claim from step 2, and the triggers for every other
write), so a quota set where there was none counts what is held with no
claim or release of the tenant in flight.

Lock order, deadlock-free: a claim holds its nodes, then the tenant's shared
lock, then its quota rows in (tenant, class) order. A transaction that holds
a quota row never waits for a node afterwards: place() claims once and
commits; a batch of places (place_batches.py) waits for nothing (its claims
ask tenancy_claim not to wait, and a busy quota sends the call to a
transaction of its own); placeGroup claims its members in a savepoint that
it rolls back, letting the rows go, before it waits for busy nodes, and a
group of several classes takes their rows in class order before any node
(charge_group), so two groups never hold one class each waiting for the
other's.

borrowed (one definition, here): a claim is borrowed when, for some class it
takes, the tenant holds more than its guarantee of it once the claim is
counted (without a quota row the guarantee is 0, so every claim is
borrowed). Recorded on the shards when they are claimed; a later release of
other replicas does not change it.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import text

from service.database.connections import Connection
from service.scheduling.tenancy.charges import (
    ChargeRefused,
    QuotaBusy,
    QuotaShortfall,
    Refusal,
    UnknownTenant,
)

# pg_advisory_xact_lock(TENANT_LOCK, hashtext(tenant)): the lock a tenant's
# writers hold shared and setTenant/removeTenant exclusively. The same number
# is written in migration 0022's tenancy_claim() and triggers.
TENANT_LOCK = 46


# The CTEs charged_calls defines, which a claim's own may not take.
CHARGE_CTES = ("classed", "asked", "quota", "charged", "admitted")


def charged_calls() -> str:
    """CTEs charging the calls of a store statement, after its want_shards, want_gpus and go.

    Reads want_shards (tenant per call), want_gpus (node_id, idx, shard_id per
    call) and go (call, ok), and the :quota_wait parameter (false: a claim
    that must not wait for another transaction's quota lock; the call is
    then refused as busy). Defines:

    - classed: every GPU of a call that passed its checks, with its class
      (what allocated_gpus records and quotas count);
    - admitted: per go row, `checked` (go.ok), `ok` (checked and admitted by
      its charge: nothing of the call is written otherwise), `borrowed` (see
      the module's docstring) and `refusal` (JSON: why a checked call was not
      admitted, the first by tenant and class; NULL otherwise).
    """
    # Each GPU's class by its key: the planner guesses 100 rows for a
    # statement's input and, as a join, may hash all of gpus (as storing.py
    # found for allocated_gpus); LIMIT keeps the lateral a probe.
    return """
    classed AS MATERIALIZED (
        SELECT w.call, w.node_id, w.idx, w.shard_id, g.gpu_class, g.reservation
        FROM want_gpus w JOIN go ON go.call = w.call AND go.ok
        JOIN LATERAL (SELECT x.gpu_class, x.reservation FROM gpus x
                      WHERE x.node_id = w.node_id AND x.idx = w.idx LIMIT 1) g ON true
    ), asked AS MATERIALIZED (
        -- A GPU set aside by a reservation of the call's own tenant is
        -- counted as used already (tenancy_reserved, migration 0024): asked
        -- again it would count twice.
        SELECT c.call, t.tenant, c.gpu_class,
               count(*) FILTER (WHERE c.reservation IS NULL OR NOT EXISTS (
                   SELECT 1 FROM reservations r
                   WHERE r.id = c.reservation AND r.tenant = t.tenant)) AS n
        FROM classed c
        JOIN (SELECT DISTINCT w.call, w.tenant FROM want_shards w) t ON t.call = c.call
        GROUP BY c.call, t.tenant, c.gpu_class
    ), quota AS MATERIALIZED (
        -- One call of tenancy_claim per (tenant, class), in that order: the
        -- order every claim takes quota rows in.
        SELECT k.tenant, k.gpu_class, r.known, r.busy, r.used, r.gpu_limit, r.guaranteed
        FROM (SELECT DISTINCT a.tenant, a.gpu_class FROM asked a ORDER BY 1, 2 OFFSET 0) k
        CROSS JOIN LATERAL tenancy_claim(k.tenant, k.gpu_class, CAST(:quota_wait AS boolean)) r
    ), charged AS MATERIALIZED (
        SELECT a.call, a.tenant, a.gpu_class, a.n, q.known, q.busy, q.used, q.gpu_limit,
               q.guaranteed,
               q.used + sum(a.n) OVER (PARTITION BY a.tenant, a.gpu_class ORDER BY a.call)
                   AS after
        FROM asked a JOIN quota q ON q.tenant = a.tenant AND q.gpu_class = a.gpu_class
    ), admitted AS MATERIALIZED (
        SELECT go.call, go.ok AS checked, go.ok AND r.call IS NULL AS ok,
               EXISTS (SELECT 1 FROM charged c
                       WHERE c.call = go.call AND coalesce(c.after, c.n) > c.guaranteed)
                   AS borrowed,
               CASE WHEN r.call IS NOT NULL THEN json_build_object(
                   'tenant', r.tenant, 'gpuClass', r.gpu_class, 'known', r.known,
                   'busy', r.busy, 'used', r.after - r.n, 'limit', r.gpu_limit, 'asked', r.n)
               END AS refusal
        FROM go
        LEFT JOIN LATERAL (
            SELECT c.* FROM charged c
            WHERE c.call = go.call AND (NOT c.known OR c.busy OR c.after > c.gpu_limit)
            ORDER BY c.tenant, c.gpu_class LIMIT 1
        ) r ON true
    )"""


def refusal_of(value: Mapping[str, object]) -> Refusal:
    """The refusal a store statement answered for a call (admitted.refusal), as the domain's record."""
    tenant = str(value["tenant"])
    if value["busy"]:
        return QuotaBusy(tenant)
    if not value["known"]:
        return UnknownTenant(tenant)
    return QuotaShortfall(
        tenant,
        str(value["gpuClass"]),
        _int(value["used"]),
        _int(value["limit"]),
        _int(value["asked"]),
    )


def _int(value: object) -> int:
    assert isinstance(value, int), value
    return value


# What charge_group asks of one (tenant, class): tenancy_claim itself, waiting.
_CLAIM_ONE = text(
    "SELECT known, busy, used, gpu_limit, guaranteed FROM tenancy_claim(:tenant, :gpu_class, true)"
)


async def charge_group(conn: Connection, tenant: str, asked: Mapping[str, int]) -> None:
    """Lock the tenant's quota rows for these classes and check a whole group's GPUs against them.

    For placeGroup and scaleGroup of several classes (a group of one class
    needs no round trip for it: its members' claims take the one row, and a
    member past the limit refuses the whole group). Called in the savepoint
    that claims the members, before any of their nodes is locked, so the
    rows are taken in class order, as every claim takes them, and the group
    never waits for a node while holding them: when a member's node is busy
    the savepoint is rolled back, which lets the rows go, before it waits.
    Each member's claim then finds the rows its own and the group's total
    within the limit. Raises ChargeRefused.
    """
    for gpu_class in sorted(asked):
        row = (await conn.execute(_CLAIM_ONE, {"tenant": tenant, "gpu_class": gpu_class})).one()
        if not row.known:
            raise ChargeRefused(UnknownTenant(tenant))
        if row.gpu_limit is not None and row.used + asked[gpu_class] > row.gpu_limit:
            raise ChargeRefused(
                QuotaShortfall(tenant, gpu_class, row.used, row.gpu_limit, asked[gpu_class])
            )
