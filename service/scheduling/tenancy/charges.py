"""A charge: the tenant a replica is charged to, its priority and its deployment; checked without the database.

Also the refusals a claim answers for a charge (QuotaShortfall, UnknownTenant,
QuotaBusy), raised as ChargeRefused out of the claim paths and answered by
place() and allocate() as their result types; and the binding of a
scheduler token to its tenant (bind).

This module imports nothing of the service but bounds and errors: the claim
path and the verdicts read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from service import stored_text
from service.bounds import MAX_PRIORITY, MIN_PRIORITY
from service.errors import InventoryError

# Where a replica goes when its caller names no tenant (and its token is bound
# to none). Always a tenant: it needs no row in `tenants` (it has one only once
# an operator set quotas or a description on it), and cannot be removed.
DEFAULT_TENANT = "default"


class PreemptionPolicy(Enum):
    """Whether a place may stop other replicas to make room (the contract's words)."""

    NEVER = "NEVER"
    LOWER_PRIORITY = "LOWER_PRIORITY"


@dataclass(frozen=True)
class Charge:
    """Who a replica is charged to, and how important it is.

    `tenant` None: not named; bind() makes it the caller's bound tenant, else
    DEFAULT_TENANT (tenant_id). Every claim records the charge on its shards.
    """

    tenant: str | None = None
    priority: int = 0
    deployment: str | None = None

    @property
    def tenant_id(self) -> str:
        return DEFAULT_TENANT if self.tenant is None else self.tenant

    @property
    def named(self) -> bool:
        """Whether anything differs from an unnamed charge (a group's roles may name none)."""
        return self != UNNAMED


# A charge that names nothing: bind() makes it the caller's bound tenant, else
# DEFAULT_TENANT, at priority 0, in no deployment. The default of every request.
UNNAMED = Charge()


# A charge's columns as a claim's want_shards carries them, with their SQL types.
CHARGE_FIELDS = {"tenant": "text", "priority": "int", "deployment": "text"}


def id_problem(field: str, value: str) -> tuple[str, str, str] | None:
    """(field, value, why) when `value` is no id: empty, longer than an id, or text that cannot be stored."""
    if not value:
        return field, value, "empty"
    why = stored_text.id_problem(value)
    return None if why is None else (field, value, why)


def charge_problem(charge: Charge) -> tuple[str, Any, str] | None:
    """(field, value, why) for the first field of the charge that cannot be stored; None when all can."""
    if charge.tenant is not None:
        problem = id_problem("tenant", charge.tenant)
        if problem is not None:
            return problem
    if not MIN_PRIORITY <= charge.priority <= MAX_PRIORITY:
        return (
            "priority",
            charge.priority,
            f"a priority is from {MIN_PRIORITY} to {MAX_PRIORITY} (higher is more important)",
        )
    if charge.deployment is not None:
        return id_problem("deployment", charge.deployment)
    return None


class TenantForbidden(InventoryError):
    """A token bound to one tenant naming another: nothing is placed, held or written."""

    code = "FORBIDDEN"

    def __init__(self, operation: str, bound: str, named: str) -> None:
        super().__init__(
            f"{operation}: this scheduler token is bound to tenant {bound!r} and cannot act for "
            f"tenant {named!r}; name no tenant, or {bound!r}"
        )
        self.operation = operation
        self.bound = bound
        self.named = named

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "operation": self.operation, "field": "tenant",
                "value": self.named, "boundTenant": self.bound}  # fmt: skip


def bind(operation: str, bound: str | None, charge: Charge) -> Charge:
    """The charge as the caller may make it: a token bound to a tenant places only as that tenant.

    `bound`: the tenant the caller's token is bound to (None: unbound, which
    names any tenant, or none for DEFAULT_TENANT). Raises TenantForbidden
    when a bound token names another.
    """
    if bound is None:
        return charge if charge.tenant is not None else Charge(DEFAULT_TENANT, *_rest(charge))
    if charge.tenant is not None and charge.tenant != bound:
        raise TenantForbidden(operation, bound, charge.tenant)
    return Charge(bound, *_rest(charge))


def bound_tenant(operation: str, bound: str | None, named: str | None) -> str:
    """The tenant a caller acts for when it names `named` (None: none): bind()'s rule for one id."""
    return bind(operation, bound, Charge(named)).tenant_id


def _rest(charge: Charge) -> tuple[int, str | None]:
    return charge.priority, charge.deployment


@dataclass(frozen=True)
class QuotaShortfall:
    """A claim past the tenant's limit: what it holds of the class, the limit, and what was asked."""

    tenant: str
    gpu_class: str
    used: int
    limit: int
    asked: int

    def sentence(self) -> str:
        above = (
            " (above the limit: it was lowered below what the tenant held; nothing is evicted)"
            if self.used > self.limit
            else ""
        )
        return (
            f"tenant {self.tenant!r} holds {self.used} {self.gpu_class} of its limit "
            f"{self.limit}{above}; this asks {self.asked} more: release some of its replicas, "
            "or ask an operator to raise the limit"
        )


@dataclass(frozen=True)
class UnknownTenant:
    """A claim charged to a tenant no operator made (setTenant)."""

    tenant: str

    def sentence(self) -> str:
        return (
            f"tenant={self.tenant!r}: no such tenant (an operator makes one with setTenant; "
            f"name none for {DEFAULT_TENANT!r})"
        )


@dataclass(frozen=True)
class QuotaBusy:
    """A claim that would have waited for another transaction's lock on the tenant's quota.

    Only a claim that must not wait (a batch of places: place_batches.py)
    answers this; its caller makes the claim again in a transaction of its
    own, where it waits.
    """

    tenant: str


Refusal = QuotaShortfall | UnknownTenant | QuotaBusy


class ChargeRefused(Exception):
    """A claim refused for its charge: nothing of it was written.

    Raised out of the claim paths (placement, allocations) and answered by
    place(), allocate(), placeGroup and scaleGroup as their result types;
    never a GraphQL error by itself.
    """

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal)
        self.refusal = refusal
