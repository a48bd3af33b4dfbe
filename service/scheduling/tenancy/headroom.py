"""What a read learns of a tenant's room under its limit: for fit, explainPlacement and an Unplaceable answer.

Read on committed data, locking nothing: a what-if, or the reason given for
a place that found no room anyway. Only the claim decides
(quota_claims.py), under the quota's lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text

from service.database.connections import Connection
from service.scheduling.availability import gpu_held_by
from service.scheduling.tenancy.charges import (
    DEFAULT_TENANT,
    QuotaShortfall,
    Refusal,
    UnknownTenant,
)


@dataclass(frozen=True)
class Headroom:
    """A tenant's standing for one class: whether it exists, what it holds, its limit (None: none)."""

    tenant: str
    gpu_class: str
    known: bool
    used: int
    limit: int | None
    guaranteed: int

    @property
    def room(self) -> int | None:
        """GPUs of the class it may still take; None: no limit."""
        return None if self.limit is None else max(0, self.limit - self.used)

    def refusal(self, asked: int) -> Refusal | None:
        """Why a claim of `asked` GPUs of the class would be refused now; None if it would not."""
        if not self.known:
            return UnknownTenant(self.tenant)
        if self.limit is not None and self.used + asked > self.limit:
            return QuotaShortfall(self.tenant, self.gpu_class, self.used, self.limit, asked)
        return None


# A class with a quota row: its counter, and the GPUs its reservations set
# aside that it holds none of (tenancy_reserved, migration 0024: counted as
# used from a reservation's creation, as the claim counts them). Without one, nothing bounds the
# claim, and what the tenant holds is not needed (used is reported as 0).
_HEADROOM = text(
    """
    SELECT c.gpu_class,
           CAST(:tenant AS text) = :default OR EXISTS (
               SELECT 1 FROM tenants t WHERE t.id = :tenant) AS known,
           coalesce(q.used + tenancy_reserved(q.tenant, q.gpu_class), 0) AS used, q.gpu_limit,
           coalesce(q.guaranteed, 0) AS guaranteed
    FROM unnest(CAST(:classes AS text[])) AS c(gpu_class)
    LEFT JOIN tenant_quotas q ON q.tenant = :tenant AND q.gpu_class = c.gpu_class
    """
)


# What a tenant holds now that is gone by :at, by class: GPUs of its
# replicas whose `until` is at or before it, and GPUs its reservations that
# end by then set aside and it holds none of (fit with `at`).
_GONE_BY = text(
    f"""
    SELECT c.gpu_class,
           (SELECT count(*) FROM allocated_gpus a JOIN shards s ON s.shard_id = a.shard_id
            WHERE a.tenant = :tenant AND a.gpu_class = c.gpu_class
              AND s.until <= CAST(:at AS timestamptz))
         + (SELECT count(*) FROM reservations r JOIN gpus g ON g.reservation = r.id
            WHERE r.tenant = :tenant AND g.gpu_class = c.gpu_class
              AND r.ends_at <= CAST(:at AS timestamptz)
              AND NOT {gpu_held_by("g", "a.tenant = CAST(:tenant AS text)")}) AS gone
    FROM unnest(CAST(:classes AS text[])) AS c(gpu_class)
    """
)


async def headroom(
    conn: Connection, tenant: str, classes: Iterable[str], *, at: datetime | None = None
) -> dict[str, Headroom]:
    """The tenant's Headroom for each of these classes, by class; `at`: at that later instant."""
    wanted = sorted(set(classes))
    rows = list(
        await conn.execute(
            _HEADROOM, {"tenant": tenant, "default": DEFAULT_TENANT, "classes": wanted}
        )
    )
    if at is not None:
        gone = {
            r.gpu_class: int(r.gone)
            for r in await conn.execute(_GONE_BY, {"tenant": tenant, "classes": wanted, "at": at})
        }
        return {
            r.gpu_class: Headroom(
                tenant,
                r.gpu_class,
                r.known,
                max(0, r.used - gone[r.gpu_class]) if r.gpu_limit is not None else r.used,
                r.gpu_limit,
                r.guaranteed,
            )
            for r in rows
        }
    return {
        r.gpu_class: Headroom(tenant, r.gpu_class, r.known, r.used, r.gpu_limit, r.guaranteed)
        for r in rows
    }


async def refusal_now(conn: Connection, tenant: str, gpu_class: str, asked: int) -> Refusal | None:
    """What a claim of `asked` GPUs of the class charged to `tenant` would be refused for now, if anything."""
    return (await headroom(conn, tenant, [gpu_class]))[gpu_class].refusal(asked)
