"""Tenancy's root fields: tenants and their usage, setTenant, removeTenant, disruption budgets.

Also bound_charge, which every placing resolver (place, allocate, placeGroup,
scaleGroup, fit, fitGroup, explainPlacement, explainGroupPlacement) passes
its request's charge through: a scheduler token bound to a tenant acts only
as that tenant (charges.bind).
"""

from __future__ import annotations

import strawberry

from service.database.connections import Connection
from service.scheduling.tenancy import budgets, charges, tenants
from service.scheduling.tenancy.budgets import BudgetRecord
from service.scheduling.tenancy.tenants import TenantRecord

from ..context import Context, Info
from ..tenancy_types import DisruptionBudget, DisruptionBudgetInput, Tenant, TenantInput


def bound_to(context: Context) -> str | None:
    """The tenant the caller's token is bound to; None: unbound (or no token in force)."""
    principal = context.principal
    return None if principal is None else principal.tenant


def bound_charge(context: Context, operation: str, charge: charges.Charge) -> charges.Charge:
    """The charge as the caller may make it (raises TenantForbidden): see charges.bind."""
    return charges.bind(operation, bound_to(context), charge)


@strawberry.type
class TenancyQueries:
    @strawberry.field(description="Every tenant by id (default among them), with its usage.")
    async def tenants(self, info: Info) -> list[Tenant]:
        found = await info.context.read(lambda conn: tenants.read_tenants(conn))
        return [Tenant.of(t) for t in found]

    @strawberry.field(description="One tenant with its usage; null when there is no such tenant.")
    async def tenant(self, info: Info, id: strawberry.ID) -> Tenant | None:
        found = await info.context.read(lambda conn: tenants.read_tenants(conn, str(id)))
        return Tenant.of(found[0]) if found else None

    @strawberry.field(
        description=(
            "Disruption budgets by tenant and deployment, with how many replicas each has "
            "placed; of one tenant when named."
        )
    )
    async def disruption_budgets(
        self, info: Info, tenant: strawberry.ID | None = None
    ) -> list[DisruptionBudget]:
        named = None if tenant is None else str(tenant)
        found = await info.context.read(lambda conn: budgets.list_budgets(conn, named))
        return [DisruptionBudget.of(b) for b in found]


@strawberry.type
class TenancyMutations:
    @strawberry.mutation(
        description=(
            "Operator: make or change a tenant, its description and all its quotas (a class "
            "left out has none: no limit). A limit below what the tenant holds is allowed: it "
            "evicts nothing, refuses the tenant's new places of the class, and `notices` says so."
        )
    )
    async def set_tenant(self, info: Info, input: TenantInput) -> Tenant:
        spec = input.to_spec()

        async def work(conn: Connection) -> TenantRecord:
            return await tenants.set_tenant(conn, spec)

        return Tenant.of(await info.context.write(work, idempotent=True))

    @strawberry.mutation(
        description=(
            "Operator: forget a tenant, its quotas and budgets; false when there was none. "
            "Refused (CONFLICT) while the tenant holds GPUs."
        )
    )
    async def remove_tenant(self, info: Info, id: strawberry.ID) -> bool:
        async def work(conn: Connection) -> bool:
            return await tenants.remove_tenant(conn, str(id))

        return await info.context.write(work)

    @strawberry.mutation(
        description=(
            "Scheduler: a deployment's disruption budget (tenant null: the token's tenant, else "
            "default). A deployment whose replicas another tenant holds: FORBIDDEN."
        )
    )
    async def set_disruption_budget(
        self, info: Info, input: DisruptionBudgetInput
    ) -> DisruptionBudget:
        tenant = charges.bound_tenant(
            "setDisruptionBudget",
            bound_to(info.context),
            None if input.tenant is None else str(input.tenant),
        )

        async def work(conn: Connection) -> BudgetRecord:
            return await budgets.set_budget(conn, tenant, input.deployment, input.min_available)

        return DisruptionBudget.of(await info.context.write(work, idempotent=True))

    @strawberry.mutation(
        description="Scheduler: forget a deployment's budget; false when it had none."
    )
    async def remove_disruption_budget(
        self, info: Info, deployment: str, tenant: strawberry.ID | None = None
    ) -> bool:
        owner = charges.bound_tenant(
            "removeDisruptionBudget",
            bound_to(info.context),
            None if tenant is None else str(tenant),
        )

        async def work(conn: Connection) -> bool:
            return await budgets.remove_budget(conn, owner, deployment)

        return await info.context.write(work)
