"""Disruption budgets: a deployment's minimum of placed replicas that preemption never goes below.

A budget belongs to a tenant and names one of its deployments (the
`deployment` its replicas were placed with). `placed` counts the replicas of
that tenant and deployment that hold GPUs now, read from shards through
ix_shards_deployment. A budget for a deployment whose replicas another tenant
holds is refused: a tenant protects only its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text

from service.bounds import MAX_MIN_AVAILABLE
from service.database.connections import Connection
from service.errors import InvalidInput, InventoryError
from service.scheduling.tenancy.charges import DEFAULT_TENANT, id_problem
from service.scheduling.tenancy.tenants import make_default_row, tenant_exists


@dataclass(frozen=True)
class BudgetRecord:
    deployment: str
    tenant: str
    min_available: int
    # Replicas of the tenant's deployment that hold GPUs now.
    placed: int


class ForeignDeployment(InventoryError):
    """A budget for a deployment whose replicas another tenant holds: nothing stored."""

    code = "FORBIDDEN"

    def __init__(self, deployment: str, tenant: str, holder: str) -> None:
        super().__init__(
            f"deployment={deployment!r}: its replicas belong to tenant {holder!r}, not "
            f"{tenant!r}; a tenant sets budgets only for its own deployments"
        )
        self.deployment, self.tenant, self.holder = deployment, tenant, holder

    @property
    def extensions(self) -> dict[str, object]:
        return {"code": self.code, "field": "deployment", "value": self.deployment,
                "tenant": self.tenant, "heldBy": self.holder}  # fmt: skip


# Replicas of (tenant, deployment) holding GPUs: per shard row, counted by replica.
_PLACED = "(SELECT count(DISTINCT s.replica_id) FROM shards s WHERE s.deployment = {d} AND s.tenant = {t})"

_OTHER_HOLDER = text(
    """
    SELECT s.tenant FROM shards s
    WHERE s.deployment = :deployment AND s.tenant <> :tenant
    ORDER BY s.tenant LIMIT 1
    """
)
_SET = text(
    f"""
    WITH b AS (
        INSERT INTO disruption_budgets AS b (tenant, deployment, min_available)
        VALUES (:tenant, :deployment, :min_available)
        ON CONFLICT (tenant, deployment) DO UPDATE SET min_available = excluded.min_available
        RETURNING b.tenant, b.deployment, b.min_available
    )
    SELECT b.*, {_PLACED.format(d="b.deployment", t="b.tenant")} AS placed FROM b
    """
)
_REMOVE = text(
    "DELETE FROM disruption_budgets WHERE tenant = :tenant AND deployment = :deployment"
    " RETURNING deployment"
)
_LIST = text(
    f"""
    SELECT b.tenant, b.deployment, b.min_available,
           {_PLACED.format(d="b.deployment", t="b.tenant")} AS placed
    FROM disruption_budgets b
    WHERE CAST(:tenant AS text) IS NULL OR b.tenant = :tenant
    ORDER BY b.tenant, b.deployment
    """
)


def _checked(tenant: str, deployment: str) -> None:
    for field, value in (("tenant", tenant), ("deployment", deployment)):
        problem = id_problem(field, value)
        if problem is not None:
            raise InvalidInput(*problem)


async def set_budget(
    conn: Connection, tenant: str, deployment: str, min_available: int
) -> BudgetRecord:
    """Set (or change) a deployment's budget; raises InvalidInput or ForeignDeployment, nothing stored."""
    _checked(tenant, deployment)
    if not 0 <= min_available <= MAX_MIN_AVAILABLE:
        raise InvalidInput(
            "minAvailable", min_available, f"a budget keeps 0 to {MAX_MIN_AVAILABLE} replicas"
        )
    if not await tenant_exists(conn, tenant):
        raise InvalidInput(
            "tenant", tenant, "no such tenant (an operator makes one with setTenant)"
        )
    holder = (
        await conn.execute(_OTHER_HOLDER, {"tenant": tenant, "deployment": deployment})
    ).first()
    if holder is not None:
        raise ForeignDeployment(deployment, tenant, holder.tenant)
    if tenant == DEFAULT_TENANT:
        await make_default_row(conn)
    row = (
        await conn.execute(
            _SET, {"tenant": tenant, "deployment": deployment, "min_available": min_available}
        )
    ).one()
    return BudgetRecord(row.deployment, row.tenant, row.min_available, row.placed)


async def remove_budget(conn: Connection, tenant: str, deployment: str) -> bool:
    """Forget a budget; whether there was one."""
    _checked(tenant, deployment)
    return (
        await conn.execute(_REMOVE, {"tenant": tenant, "deployment": deployment})
    ).first() is not None


async def list_budgets(conn: Connection, tenant: str | None) -> Sequence[BudgetRecord]:
    """Every budget (of one tenant, when named), by tenant and deployment, with what is placed."""
    rows = await conn.execute(_LIST, {"tenant": tenant})
    return [BudgetRecord(r.deployment, r.tenant, r.min_available, r.placed) for r in rows]
