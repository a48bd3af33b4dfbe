"""GraphQL types of tenancy (contract-tenancy.graphql): tenants, quotas, usage, budgets, preemption."""

from __future__ import annotations

import strawberry

from service.scheduling.tenancy import charges, victims
from service.scheduling.tenancy.budgets import BudgetRecord
from service.scheduling.tenancy.tenants import QuotaSpec, TenantRecord, TenantSpec, Usage

strawberry.enum(
    charges.PreemptionPolicy,
    name="PreemptionPolicy",
    description=(
        "NEVER: no replica is stopped for this one. LOWER_PRIORITY: replicas of lower priority "
        "may be preempted, and replicas that other tenants hold beyond their guarantee may be "
        "reclaimed while this tenant is below its own."
    ),
)
strawberry.enum(
    victims.PreemptionKind,
    name="PreemptionKind",
    description=(
        "Why a replica was chosen as a victim: its priority is lower, or its tenant holds it "
        "beyond its guarantee while the placing tenant is below its own."
    ),
)


@strawberry.type
class Charged:
    """An Allocation's charge (service/scheduling/tenancy/): who it is charged to, how important it is."""

    tenant: strawberry.ID = strawberry.field(
        description="The tenant its replica is charged to (default when none was named)."
    )
    priority: int
    deployment: str | None
    borrowed: bool = strawberry.field(
        description=(
            "Whether the claim took its tenant beyond its guarantee of the class (held when it "
            "was placed; a later release of other replicas does not change it)."
        )
    )


@strawberry.type(
    description="Why a place or allocate went past a tenant's limit: the numbers, for a scheduler to act on."
)
class QuotaShortfall:
    tenant: strawberry.ID
    gpu_class: str
    used: int = strawberry.field(description="GPUs of the class the tenant holds now.")
    limit: int
    asked: int = strawberry.field(description="GPUs of the class this request asked for.")

    @classmethod
    def of(cls, q: charges.QuotaShortfall | None) -> QuotaShortfall | None:
        if q is None:
            return None
        return cls(
            tenant=strawberry.ID(q.tenant),
            gpu_class=q.gpu_class,
            used=q.used,
            limit=q.limit,
            asked=q.asked,
        )


@strawberry.type(
    description=(
        "A replica stopped to make room: its shards are told to stop (StopReason PREEMPTED) and "
        "its GPUs are held by the preemptor."
    )
)
class Preemption:
    replica_id: strawberry.ID
    tenant: strawberry.ID
    priority: int
    deployment: str | None
    gpus: int
    node_ids: list[strawberry.ID]
    kind: victims.PreemptionKind
    reason: str

    @classmethod
    def of(cls, p: victims.Preemption) -> Preemption:
        return cls(
            replica_id=strawberry.ID(p.replica_id),
            tenant=strawberry.ID(p.tenant),
            priority=p.priority,
            deployment=p.deployment,
            gpus=p.gpus,
            node_ids=[strawberry.ID(n) for n in p.node_ids],
            kind=p.kind,
            reason=p.reason,
        )


@strawberry.type(
    description=(
        "A deployment's disruption budget: preemption, maintenance and drains never leave it "
        "fewer than `minAvailable` placed replicas."
    )
)
class DisruptionBudget:
    deployment: str
    tenant: strawberry.ID
    min_available: int
    placed: int = strawberry.field(
        description="Replicas of the tenant's deployment that hold GPUs now."
    )

    @classmethod
    def of(cls, b: BudgetRecord) -> DisruptionBudget:
        return cls(
            deployment=b.deployment,
            tenant=strawberry.ID(b.tenant),
            min_available=b.min_available,
            placed=b.placed,
        )


@strawberry.type(
    description=(
        "Per GPU class: `guaranteed` GPUs the tenant can always get back (by preempting what "
        "others borrowed); `limit` it never exceeds, borrowed included (null: no limit)."
    )
)
class TenantQuota:
    gpu_class: str
    guaranteed: int
    limit: int | None

    @classmethod
    def of(cls, q: QuotaSpec) -> TenantQuota:
        return cls(gpu_class=q.gpu_class, guaranteed=q.guaranteed, limit=q.limit)


@strawberry.type(
    description=(
        "What a tenant holds of one class now. `borrowed`: held beyond `guaranteed`. "
        "`available`: GPUs of the class a place by this tenant could get now without "
        "preempting, within its limit."
    )
)
class TenantUsage:
    gpu_class: str
    used: int
    borrowed: int
    guaranteed: int
    limit: int | None
    available: int

    @classmethod
    def of(cls, u: Usage) -> TenantUsage:
        return cls(
            gpu_class=u.gpu_class,
            used=u.used,
            borrowed=u.borrowed,
            guaranteed=u.guaranteed,
            limit=u.limit,
            available=u.available,
        )


@strawberry.type
class Tenant:
    id: strawberry.ID
    description: str | None
    quotas: list[TenantQuota]
    usage: list[TenantUsage] = strawberry.field(
        description="Per class with a quota or with GPUs held, by class."
    )
    notices: list[str] = strawberry.field(
        description=(
            "What an operator should know now: a class held above its limit (a limit lowered "
            "below use is allowed; it evicts nothing, and refuses new places of the class)."
        )
    )

    @classmethod
    def of(cls, t: TenantRecord) -> Tenant:
        return cls(
            id=strawberry.ID(t.id),
            description=t.description,
            quotas=[TenantQuota.of(q) for q in t.quotas],
            usage=[TenantUsage.of(u) for u in t.usage],
            notices=list(t.notices),
        )


@strawberry.input
class TenantQuotaInput:
    gpu_class: str
    guaranteed: int = 0
    limit: int | None = None

    def to_spec(self) -> QuotaSpec:
        return QuotaSpec(self.gpu_class, self.guaranteed, self.limit)


@strawberry.input
class TenantInput:
    id: strawberry.ID
    description: str | None = None
    quotas: list[TenantQuotaInput]

    def to_spec(self) -> TenantSpec:
        return TenantSpec(str(self.id), self.description, tuple(q.to_spec() for q in self.quotas))


@strawberry.input(description="tenant null: the caller's bound tenant, else default.")
class DisruptionBudgetInput:
    deployment: str
    tenant: strawberry.ID | None = None
    min_available: int


def charge_of(
    tenant: strawberry.ID | None, priority: int | None, deployment: str | None
) -> charges.Charge:
    """A request's charge as named (its tenant not yet bound to the caller: charges.bind)."""
    return charges.Charge(
        None if tenant is None else str(tenant),
        0 if priority is None else priority,
        deployment,
    )
