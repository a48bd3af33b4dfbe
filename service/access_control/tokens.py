"""API tokens: who may call the service, in which role, kept as digests only.

A token's secret is shown once, when it is created; the database keeps its
SHA-256 digest. The secret carries 256 random bits, so a digest lookup is as
good as a password hash here (nothing to brute-force) and needs no constant-time
comparison: an attacker cannot learn anything from how long a lookup of a
wrong digest takes. A leaked database backup therefore holds no usable token.

Functions run inside the caller's transaction and never commit.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import text
from sqlalchemy.engine import Row

from service.bounds import MAX_ID_LENGTH, MAX_TEXT_LENGTH
from service.database.connections import Connection, cached_text
from service.errors import InvalidInput, InventoryError, shown
from service.scheduling.tenancy.tenants import tenant_exists
from service.stored_text import storable

ROLES = ("reader", "agent", "scheduler", "operator")

# A prefix makes a leaked secret recognisable to secret scanners and people.
SECRET_PREFIX = "llmgw_"


Status = Literal["active", "expired", "revoked"]


@dataclass(frozen=True)
class TokenRecord:
    id: str
    role: str
    node_id: str | None
    description: str | None
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None
    # Judged by the database's clock when the record was read (STATUS below).
    status: Status
    # The tenant a scheduler token places as (service/scheduling/tenancy/); None: unbound.
    tenant: str | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def active(self) -> bool:
        return self.status == "active"


@dataclass(frozen=True)
class NewToken:
    """A token just created: the only moment its secret exists outside the caller's hands."""

    token: TokenRecord
    secret: str
    # No token existed before this one: from now on every caller needs one.
    first: bool = False


# What creating the first token changes, said where it is created (createToken's
# `warning`, `ctl tokens create`): the running agents, ctl and dashboards that
# sent no token stop working at once.
FIRST_TOKEN_WARNING = (
    "this is the first token: tokens are now in force, so every caller without one "
    "(running agents, ctl, the dashboard, GraphiQL) is refused with HTTP 401 from its "
    "next request; give each an agent, reader, scheduler or operator token"
)


class TokenNotFound(InventoryError):
    code = "TOKEN_NOT_FOUND"

    def __init__(self, token_id: str) -> None:
        super().__init__(f"token '{shown(token_id)}' does not exist")
        self.token_id = token_id


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _record(row: Row[tuple[object, ...]]) -> TokenRecord:
    m = row._mapping
    return TokenRecord(
        id=m["id"],
        role=m["role"],
        node_id=m["node_id"],
        description=m["description"],
        created_at=m["created_at"],
        revoked_at=m["revoked_at"],
        expires_at=m["expires_at"],
        status=m["status"],
        tenant=m["tenant"],
    )


# The one definition of a token's status, by the database's clock: every
# process agrees when a token ended, whatever its own clock says. Revoked
# wins over expired: an operator's act says more than the calendar.
STATUS = (
    "CASE WHEN revoked_at IS NOT NULL THEN 'revoked' "
    "WHEN expires_at <= now() THEN 'expired' ELSE 'active' END"
)

_COLUMNS = (
    f"id, role, node_id, description, created_at, revoked_at, expires_at, {STATUS} AS status,"
    " tenant"
)


def check_token_request(
    role: str,
    node_id: str | None,
    description: str | None,
    expires_at: datetime | None = None,
    tenant: str | None = None,
) -> None:
    if tenant is not None:
        if role != "scheduler":
            raise InvalidInput(
                "tenant", tenant, f"only scheduler tokens are bound to a tenant, not {role}"
            )
        if not tenant or len(tenant) > MAX_ID_LENGTH or not storable(tenant):
            raise InvalidInput("tenant", tenant, f"not a tenant id (1-{MAX_ID_LENGTH} characters)")
    if role not in ROLES:
        raise InvalidInput("role", role, f"expected one of {', '.join(ROLES)}")
    if role == "agent":
        if node_id is None or not node_id.strip():
            raise InvalidInput(
                "nodeId", node_id, "an agent token is bound to one node: give its node id"
            )
        if len(node_id) > MAX_ID_LENGTH or node_id != node_id.strip() or not storable(node_id):
            raise InvalidInput("nodeId", node_id, f"not a node id (1-{MAX_ID_LENGTH} characters)")
    elif node_id is not None:
        raise InvalidInput("nodeId", node_id, f"only agent tokens are bound to a node, not {role}")
    if description is not None and (
        len(description) > MAX_TEXT_LENGTH or not storable(description)
    ):
        raise InvalidInput(
            "description",
            description,
            f"at most {MAX_TEXT_LENGTH} characters of text that can be stored (no NUL)",
        )
    if expires_at is not None and expires_at.tzinfo is None:
        # A time without a zone means a different instant on every machine.
        raise InvalidInput(
            "expiresAt", expires_at.isoformat(), "give a time zone, e.g. 2027-01-31T00:00:00Z"
        )


async def create_token(
    conn: Connection,
    role: str,
    node_id: str | None = None,
    description: str | None = None,
    expires_at: datetime | None = None,
    tenant: str | None = None,
) -> NewToken:
    """A new token of `role`; an agent token names the one node it may report for.

    The node need not be registered yet: the token is made before the agent's
    first report. `expires_at` (None: never) must be in the future by the
    database's clock, the clock that later decides the token expired.
    `tenant`: a scheduler token bound to it places only as it; the tenant
    must exist (InvalidInput otherwise).
    """
    check_token_request(role, node_id, description, expires_at, tenant)
    if tenant is not None and not await tenant_exists(conn, tenant):
        raise InvalidInput(
            "tenant", tenant, "no such tenant (an operator makes one with setTenant)"
        )
    first = not await any_tokens(conn)
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    token_id = "tok_" + secrets.token_hex(6)
    row = (
        await conn.execute(
            text(
                f"INSERT INTO api_tokens (id, digest, role, node_id, description, expires_at, "
                f"tenant) "
                f"SELECT :id, :digest, :role, :node_id, :description, "
                f"CAST(:expires_at AS timestamptz), :tenant "
                f"WHERE CAST(:expires_at AS timestamptz) IS NULL "
                f"OR CAST(:expires_at AS timestamptz) > now() "
                f"RETURNING {_COLUMNS}"
            ),
            {
                "id": token_id,
                "digest": digest(secret),
                "role": role,
                "node_id": node_id,
                "description": description,
                "expires_at": expires_at,
                "tenant": tenant,
            },
        )
    ).one_or_none()
    if row is None:
        now = await conn.scalar(text("SELECT now()"))
        assert expires_at is not None and isinstance(now, datetime)
        raise InvalidInput(
            "expiresAt",
            expires_at.isoformat(),
            f"already past (the service's clock says {now.isoformat(timespec='seconds')})",
        )
    return NewToken(token=_record(row), secret=secret, first=first)


async def revoke_token(conn: Connection, token_id: str) -> TokenRecord:
    """Stop accepting a token from now on. Revoking twice keeps the first time."""
    row = (
        await conn.execute(
            text(
                f"UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) "
                f"WHERE id = :id RETURNING {_COLUMNS}"
            ),
            {"id": token_id},
        )
    ).one_or_none()
    if row is None:
        raise TokenNotFound(token_id)
    return _record(row)


async def list_tokens(
    conn: Connection,
    *,
    include_revoked: bool = False,
    first: int | None = None,
    after: str | None = None,
) -> Sequence[TokenRecord]:
    """Sorted by id; `after` is the last id of the previous page (one agent token per node
    makes this list as long as the cluster)."""
    rows = await conn.execute(
        text(
            f"SELECT {_COLUMNS} FROM api_tokens "
            "WHERE (CAST(:all AS boolean) OR revoked_at IS NULL) "
            "AND (CAST(:after AS text) IS NULL OR id > :after) "
            "ORDER BY id LIMIT :first"
        ),
        {"all": include_revoked, "after": after, "first": first},
    )
    return [_record(r) for r in rows]


async def authenticate(conn: Connection, secret: str) -> TokenRecord | None:
    """The active token with this secret, or None (unknown, revoked or expired)."""
    key = digest(secret)
    record = (await find_by_digests(conn, [key])).get(key)
    return record if record is not None and record.active else None


async def find_by_digests(conn: Connection, digests: Sequence[str]) -> dict[str, TokenRecord]:
    """The tokens with these digests, whatever their status, by digest (unknown ones absent).

    Revoked and expired tokens are returned too, so the caller can tell the
    client which of the two ended its token.
    """
    rows = await conn.execute(
        cached_text(
            f"SELECT digest, {_COLUMNS} FROM api_tokens"
            " WHERE digest = ANY(CAST(:digests AS text[]))"
        ),
        {"digests": list(digests)},
    )
    return {row.digest: _record(row) for row in rows}


async def ended_tokens(conn: Connection, token_ids: Sequence[str]) -> dict[str, Status]:
    """Which of these tokens are no longer active (revoked or expired), with their status."""
    rows = await conn.execute(
        cached_text(
            f"SELECT id, status FROM (SELECT id, {STATUS} AS status FROM api_tokens"
            " WHERE id = ANY(CAST(:ids AS text[]))) t WHERE status <> 'active'"
        ),
        {"ids": list(token_ids)},
    )
    return {row.id: row.status for row in rows}


async def count_tokens(conn: Connection) -> int:
    """How many tokens were ever created, revoked ones included: each locks callers out (any_tokens)."""
    return int(await conn.scalar(text("SELECT count(*) FROM api_tokens")))


async def any_tokens(conn: Connection) -> bool:
    """Has a token ever been created? Revoked ones count.

    Tokens are enforced from the first one on; counting revoked tokens too
    means revoking the last token locks the API rather than opening it to
    anyone who can reach the port.
    """
    found = await conn.scalar(text("SELECT EXISTS (SELECT 1 FROM api_tokens)"))
    return bool(found)
