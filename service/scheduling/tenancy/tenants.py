"""Tenants and their quotas: setTenant, removeTenant, and what each holds against its quotas.

Setting and removing take the tenant's advisory lock exclusively
(quota_claims.TENANT_LOCK): every writer of the tenant's allocated_gpus holds
it shared until it commits, so once it is granted no claim or release of the
tenant is in flight, and the counters setTenant writes (a recount of what
the tenant holds of each class) are exact; claims that arrive meanwhile wait
for it, then read the quota it set.

Lowering a limit below what the tenant holds is allowed: it evicts nothing,
and the tenant's places are refused until it holds less (Tenant.notices says
so). Only preemption stops replicas, and it never does so for a limit.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text

from service.bounds import MAX_QUOTA_GPUS, MAX_TENANT_QUOTAS, MAX_TEXT_LENGTH
from service.database.connections import Connection
from service.errors import InvalidInput, InventoryError
from service.scheduling.capacity import gpu_classes
from service.scheduling.tenancy.charges import DEFAULT_TENANT, id_problem
from service.scheduling.tenancy.quota_claims import TENANT_LOCK
from service.stored_text import storable


@dataclass(frozen=True)
class QuotaSpec:
    gpu_class: str
    guaranteed: int = 0
    # None: no limit.
    limit: int | None = None


@dataclass(frozen=True)
class TenantSpec:
    id: str
    description: str | None
    quotas: tuple[QuotaSpec, ...]


@dataclass(frozen=True)
class Usage:
    """What a tenant holds of one class now, against its quota (the contract's TenantUsage)."""

    gpu_class: str
    used: int
    guaranteed: int
    limit: int | None
    # GPUs of the class free now (schedulable, offered without tolerations).
    free: int

    @property
    def borrowed(self) -> int:
        """GPUs held beyond the guarantee now."""
        return max(0, self.used - self.guaranteed)

    @property
    def available(self) -> int:
        """GPUs of the class a place by the tenant could get now without preempting, within its limit."""
        if self.limit is None:
            return self.free
        return max(0, min(self.free, self.limit - self.used))

    def notice(self) -> str | None:
        if self.limit is None or self.used <= self.limit:
            return None
        return (
            f"{self.gpu_class}: holds {self.used}, above its limit {self.limit}; nothing is "
            f"evicted, and a place of {self.gpu_class} is refused (QUOTA_EXCEEDED) while it would "
            f"take the tenant past {self.limit}"
        )


@dataclass(frozen=True)
class TenantRecord:
    id: str
    description: str | None
    created_at: datetime | None
    quotas: tuple[QuotaSpec, ...]
    # Per class with a quota or with GPUs held, by class.
    usage: tuple[Usage, ...]

    @property
    def notices(self) -> tuple[str, ...]:
        """What an operator should know: classes held above their limit (a limit lowered below use)."""
        return tuple(n for u in self.usage if (n := u.notice()) is not None)


class DefaultTenantKept(InventoryError):
    code = "BAD_INPUT"

    def __init__(self) -> None:
        super().__init__(
            f"id={DEFAULT_TENANT!r}: the tenant of replicas placed without one cannot be removed; "
            "setTenant it with no quotas to lift its limits"
        )

    @property
    def extensions(self) -> dict[str, object]:
        return {"code": self.code, "field": "id", "value": DEFAULT_TENANT}


class TenantHolds(InventoryError):
    """removeTenant of a tenant that holds GPUs, or has reservations not ended: nothing removed."""

    code = "CONFLICT"

    def __init__(self, tenant: str, held: dict[str, int], reserving: Sequence[str] = ()) -> None:
        if held:
            what = ", ".join(f"{n} {c}" for c, n in sorted(held.items()))
            message = f"tenant {tenant!r} holds {what}: release its replicas before removing it"
        else:
            shown = ", ".join(reserving[:5]) + (", ..." if len(reserving) > 5 else "")
            message = (
                f"tenant {tenant!r} has reservations not ended ({shown}): release them "
                "(releaseReservation) before removing it"
            )
        super().__init__(message)
        self.tenant = tenant

    @property
    def extensions(self) -> dict[str, object]:
        return {"code": self.code, "field": "id", "value": self.tenant}


_LOCK_EXCLUSIVE = text("SELECT pg_advisory_xact_lock(:lock, hashtext(:tenant))")
_EXISTS = text("SELECT EXISTS (SELECT 1 FROM tenants WHERE id = :tenant)")
_DEFAULT_ROW = text("INSERT INTO tenants (id) VALUES (:tenant) ON CONFLICT (id) DO NOTHING")
_UPSERT = text(
    """
    INSERT INTO tenants AS t (id, description) VALUES (:tenant, :description)
    ON CONFLICT (id) DO UPDATE SET description = excluded.description
    """
)
_DROP_QUOTAS = text(
    "DELETE FROM tenant_quotas WHERE tenant = :tenant"
    " AND gpu_class <> ALL(CAST(:classes AS text[]))"
)
# Every quota row of the tenant, its counter recounted: exact under the
# exclusive lock (see the module's docstring), whatever it said before.
_WRITE_QUOTAS = text(
    """
    INSERT INTO tenant_quotas AS q (tenant, gpu_class, guaranteed, gpu_limit, used)
    SELECT :tenant, r.gpu_class, r.guaranteed, r.gpu_limit,
           (SELECT count(*) FROM allocated_gpus a
            WHERE a.tenant = :tenant AND a.gpu_class = r.gpu_class)
    FROM jsonb_to_recordset(CAST(:quotas AS jsonb)) AS r(gpu_class text, guaranteed int, gpu_limit int)
    ORDER BY r.gpu_class
    ON CONFLICT (tenant, gpu_class) DO UPDATE
        SET guaranteed = excluded.guaranteed, gpu_limit = excluded.gpu_limit, used = excluded.used
    """
)
_KNOWN_CLASSES = text(
    """
    SELECT c.gpu_class FROM unnest(CAST(:classes AS text[])) AS c(gpu_class)
    WHERE EXISTS (SELECT 1 FROM gpu_pools p WHERE p.gpu_class = c.gpu_class)
       OR EXISTS (SELECT 1 FROM tenant_quotas q
                  WHERE q.tenant = :tenant AND q.gpu_class = c.gpu_class)
    """
)
_HELD = text(
    """
    SELECT a.gpu_class, count(*) AS n FROM allocated_gpus a
    WHERE a.tenant = :tenant GROUP BY a.gpu_class
    """
)
# Its reservations not ENDED (service/scheduling/reservations/): their GPUs
# count as the tenant's used, and a tenant removed under them would leave GPUs
# set aside for no one.
_RESERVING = text(
    """
    SELECT r.id FROM reservations r
    WHERE r.tenant = :tenant AND r.state <> 'ENDED' ORDER BY r.id LIMIT 6
    """
)
_REMOVE = text("DELETE FROM tenants WHERE id = :tenant RETURNING id")

_NAMED = text(
    """
    SELECT t.id, t.description, t.created_at FROM tenants t
    WHERE CAST(:tenant AS text) IS NULL OR t.id = :tenant
    """
)
_QUOTAS = text(
    """
    SELECT q.tenant, q.gpu_class, q.guaranteed, q.gpu_limit,
           -- Reserved GPUs count as used from a reservation's creation (migration 0024).
           q.used + tenancy_reserved(q.tenant, q.gpu_class) AS used
    FROM tenant_quotas q
    WHERE CAST(:tenant AS text) IS NULL OR q.tenant = :tenant
    ORDER BY q.tenant, q.gpu_class
    """
)
# What tenants hold by class, for the classes without a quota row (no
# counter): an aggregate over ix_allocated_gpus_tenant.
_HOLDINGS = text(
    """
    SELECT a.tenant, a.gpu_class, count(*) AS n FROM allocated_gpus a
    WHERE CAST(:tenant AS text) IS NULL OR a.tenant = :tenant
    GROUP BY a.tenant, a.gpu_class
    """
)


def _text_problem(field: str, value: str | None) -> None:
    if value is not None and (len(value) > MAX_TEXT_LENGTH or not storable(value)):
        raise InvalidInput(field, value, f"at most {MAX_TEXT_LENGTH} characters of text, no NUL")


def check_spec(spec: TenantSpec) -> None:
    """What can be refused without the database (InvalidInput naming the field and value)."""
    problem = id_problem("id", spec.id)
    if problem is not None:
        raise InvalidInput(*problem)
    _text_problem("description", spec.description)
    if len(spec.quotas) > MAX_TENANT_QUOTAS:
        raise InvalidInput(
            "quotas",
            len(spec.quotas),
            f"a tenant has quotas for at most {MAX_TENANT_QUOTAS} classes",
        )
    seen: set[str] = set()
    for i, quota in enumerate(spec.quotas):
        where = f"quotas[{i}]"
        if (
            not quota.gpu_class
            or len(quota.gpu_class) > MAX_TEXT_LENGTH
            or not storable(quota.gpu_class)
        ):
            raise InvalidInput(f"{where}.gpuClass", quota.gpu_class, "not a GPU class")
        if quota.gpu_class in seen:
            raise InvalidInput(f"{where}.gpuClass", quota.gpu_class, "named twice in quotas")
        seen.add(quota.gpu_class)
        if not 0 <= quota.guaranteed <= MAX_QUOTA_GPUS:
            raise InvalidInput(
                f"{where}.guaranteed",
                quota.guaranteed,
                f"GPUs guaranteed are 0 to {MAX_QUOTA_GPUS}",
            )
        if quota.limit is not None:
            if not 0 <= quota.limit <= MAX_QUOTA_GPUS:
                raise InvalidInput(
                    f"{where}.limit",
                    quota.limit,
                    f"a limit is 0 to {MAX_QUOTA_GPUS} GPUs (null: none)",
                )
            if quota.limit < quota.guaranteed:
                raise InvalidInput(
                    f"{where}.limit",
                    quota.limit,
                    f"below guaranteed ({quota.guaranteed}): a tenant's limit includes what it "
                    "is guaranteed",
                )


async def lock_tenant(conn: Connection, tenant: str) -> None:
    """Take the tenant's advisory lock exclusively: no claim or release of its GPUs is in flight after."""
    await conn.execute(_LOCK_EXCLUSIVE, {"lock": TENANT_LOCK, "tenant": tenant})


async def tenant_exists(conn: Connection, tenant: str) -> bool:
    """Whether claims may be charged to `tenant` (DEFAULT_TENANT always)."""
    if tenant == DEFAULT_TENANT:
        return True
    return bool((await conn.execute(_EXISTS, {"tenant": tenant})).scalar_one())


async def make_default_row(conn: Connection) -> None:
    """The default tenant's row, for what references tenants (budgets); it needs none otherwise."""
    await conn.execute(_DEFAULT_ROW, {"tenant": DEFAULT_TENANT})


async def set_tenant(conn: Connection, spec: TenantSpec) -> TenantRecord:
    """Make or change a tenant: its description and its quotas, all of them (a class left out has none).

    Raises InvalidInput (nothing stored) for a bad field or a GPU class no
    registered GPU has (and that the tenant had no quota for).
    """
    check_spec(spec)
    classes = [q.gpu_class for q in spec.quotas]
    known = {
        r.gpu_class
        for r in await conn.execute(_KNOWN_CLASSES, {"classes": classes, "tenant": spec.id})
    }
    for i, quota in enumerate(spec.quotas):
        if quota.gpu_class not in known:
            listed = ", ".join(c.gpu_class for c in await gpu_classes(conn)) or "none registered"
            raise InvalidInput(
                f"quotas[{i}].gpuClass",
                quota.gpu_class,
                f"no registered GPU has this class (classes here: {listed})",
            )
    await lock_tenant(conn, spec.id)
    await conn.execute(_UPSERT, {"tenant": spec.id, "description": spec.description})
    await conn.execute(_DROP_QUOTAS, {"tenant": spec.id, "classes": classes})
    if spec.quotas:
        rows = [
            {"gpu_class": q.gpu_class, "guaranteed": q.guaranteed, "gpu_limit": q.limit}
            for q in spec.quotas
        ]
        await conn.execute(_WRITE_QUOTAS, {"tenant": spec.id, "quotas": json.dumps(rows)})
    found = await read_tenants(conn, spec.id)
    return found[0]


async def remove_tenant(conn: Connection, tenant: str) -> bool:
    """Forget a tenant, its quotas and its budgets; whether it existed.

    Refused (TenantHolds, CONFLICT) while it holds GPUs or has reservations
    not ended; the default tenant
    is never removed (DefaultTenantKept). A token bound to a removed tenant
    stays valid, and its places are refused (no such tenant) until an
    operator makes the tenant again.
    """
    problem = id_problem("id", tenant)
    if problem is not None:
        raise InvalidInput(*problem)
    if tenant == DEFAULT_TENANT:
        raise DefaultTenantKept()
    await lock_tenant(conn, tenant)
    held = {r.gpu_class: int(r.n) for r in await conn.execute(_HELD, {"tenant": tenant})}
    if held:
        raise TenantHolds(tenant, held)
    reserving = [r.id for r in await conn.execute(_RESERVING, {"tenant": tenant})]
    if reserving:
        raise TenantHolds(tenant, {}, reserving)
    return (await conn.execute(_REMOVE, {"tenant": tenant})).first() is not None


async def read_tenants(conn: Connection, tenant: str | None = None) -> Sequence[TenantRecord]:
    """Every tenant (or the one named; none when it does not exist), by id, with its usage.

    The default tenant is listed whether or not it has a row.
    """
    named = {r.id: r for r in await conn.execute(_NAMED, {"tenant": tenant})}
    if (tenant is None or tenant == DEFAULT_TENANT) and DEFAULT_TENANT not in named:
        named[DEFAULT_TENANT] = None
    if not named:
        return []
    quotas: dict[str, list[tuple[QuotaSpec, int]]] = defaultdict(list)
    for r in await conn.execute(_QUOTAS, {"tenant": tenant}):
        quotas[r.tenant].append((QuotaSpec(r.gpu_class, r.guaranteed, r.gpu_limit), r.used))
    held: dict[str, dict[str, int]] = defaultdict(dict)
    for r in await conn.execute(_HOLDINGS, {"tenant": tenant}):
        held[r.tenant][r.gpu_class] = int(r.n)
    free = {c.gpu_class: c.free for c in await gpu_classes(conn)}
    out = []
    for tenant_id in sorted(named):
        row = named[tenant_id]
        mine = quotas.get(tenant_id, [])
        usage = {
            q.gpu_class: Usage(q.gpu_class, used, q.guaranteed, q.limit, free.get(q.gpu_class, 0))
            for q, used in mine
        }
        for gpu_class, n in held.get(tenant_id, {}).items():
            if gpu_class not in usage:
                usage[gpu_class] = Usage(gpu_class, n, 0, None, free.get(gpu_class, 0))
        out.append(
            TenantRecord(
                id=tenant_id,
                description=None if row is None else row.description,
                created_at=None if row is None else row.created_at,
                quotas=tuple(q for q, _ in mine),
                usage=tuple(usage[c] for c in sorted(usage)),
            )
        )
    return out
