"""Who is calling, and what their role lets them do.

Roles and what each may call:

- reader: queries.
- agent: registerNode and heartbeat, for the one node its token is bound to,
  so a token leaked from one machine cannot rewrite another machine's report.
- scheduler: allocation (allocate, place, release...) and queries.
- operator: everything, including cordon, drain, remove and token admin.

Tokens are in force once any token was ever created (revoked ones count) or
INVENTORY_BOOTSTRAP_TOKEN is set. Before that, on a service that the bind
policy kept on loopback (or that was started --insecure), every caller acts as
an operator: that is how a fresh deployment creates its first token.

Framework-free: the HTTP/websocket glue lives in service/web/app.py and
service/graphql/permissions.py.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import token_lookups, tokens
from service.config import Settings
from service.database import connections
from service.errors import InventoryError, shown

# INVENTORY_BOOTSTRAP_TOKEN's id: it lives in the environment, not in api_tokens.
BOOTSTRAP_TOKEN_ID = "bootstrap"

# What each role may do, as the set of roles' permissions it holds.
GRANTS: dict[str, frozenset[str]] = {
    "reader": frozenset({"reader"}),
    "agent": frozenset({"agent"}),
    "scheduler": frozenset({"reader", "scheduler"}),
    "operator": frozenset(tokens.ROLES),
}

# Once no token existed, how long a process believes that before asking the
# database again. A token created through this process takes effect at once
# (the cache is cleared); one created through another process within this
# long. Without the cache every request of a token-less deployment would pay
# a database round trip for a question whose answer almost never changes.
OPEN_CHECK_INTERVAL = 1.0


@dataclass(frozen=True)
class Principal:
    """The caller of one request (or one websocket connection)."""

    role: str
    token_id: str | None = None
    node_id: str | None = None
    description: str | None = None
    # A scheduler token's tenant: it places only as that tenant (service/scheduling/tenancy/charges.bind).
    tenant: str | None = None

    @property
    def actor(self) -> str | None:
        """Who made a change, as events and an operator's cordon record it."""
        if self.token_id is None:
            return None
        if self.description:
            return f"{self.description} ({self.token_id})"
        return self.token_id

    @property
    def stored(self) -> bool:
        """Made by createToken (in api_tokens), so it can be revoked or expire."""
        return self.token_id is not None and self.token_id != BOOTSTRAP_TOKEN_ID

    def may(self, role: str) -> bool:
        return role in GRANTS.get(self.role, frozenset())


# No tokens configured: the bind policy keeps such a service on loopback.
OPEN_ACCESS = Principal(role="operator")
BOOTSTRAP = Principal(role="operator", token_id=BOOTSTRAP_TOKEN_ID, description="bootstrap token")


class Unauthenticated(InventoryError):
    """No token, a malformed header, or a token that is unknown, revoked or expired."""

    code = "UNAUTHENTICATED"


class Forbidden(InventoryError):
    """A valid token whose role does not allow the operation."""

    code = "FORBIDDEN"

    def __init__(self, operation: str, needed: str, principal: Principal) -> None:
        super().__init__(
            f"{operation} needs the {needed} role; this token has the {principal.role} role"
        )
        self.operation = operation
        self.needed = needed

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "operation": self.operation, "requiredRole": self.needed}


class WrongNode(InventoryError):
    """An agent token used for a node other than its own."""

    code = "FORBIDDEN"

    def __init__(self, operation: str, bound_to: str, node_id: str) -> None:
        super().__init__(
            f"{operation}: this agent token is bound to node '{shown(bound_to)}' "
            f"and cannot act for node '{shown(node_id)}'"
        )
        self.operation = operation

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "operation": self.operation}


def check_node(operation: str, principal: Principal, node_id: str) -> None:
    """An agent acts only for the node its token names; other roles are not bound."""
    if principal.role == "agent" and principal.node_id != node_id:
        raise WrongNode(operation, principal.node_id or "", node_id)


def bearer_secret(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None when there is none."""
    if authorization is None or not authorization.strip():
        return None
    scheme, _, secret = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthenticated("expected the header 'Authorization: Bearer <token>'")
    return secret.strip()


class Authenticator:
    """Turns a request's Authorization header into a Principal, or refuses it."""

    def __init__(self, engine: Callable[[], AsyncEngine], settings: Settings) -> None:
        self._engine = engine
        self._bootstrap = settings.bootstrap_token
        # Tokens are never deleted, so once in force they stay in force.
        self._in_force = bool(self._bootstrap)
        self._open_checked_at: float | None = None

    def forget(self) -> None:
        """A token was just created here: stop believing there are none."""
        self._open_checked_at = None

    async def in_force(self) -> bool:
        if self._in_force:
            return True
        now = time.monotonic()
        if self._open_checked_at is not None and now - self._open_checked_at < OPEN_CHECK_INTERVAL:
            return False
        async with connections.autocommit(self._engine()) as conn:
            found = await tokens.any_tokens(conn)
        if found:
            self._in_force = True
        else:
            self._open_checked_at = now
        return found

    async def principal(self, authorization: str | None) -> Principal:
        """Who sent this header. Raises Unauthenticated; database errors propagate."""
        secret = bearer_secret(authorization)
        if secret is None:
            if await self.in_force():
                raise Unauthenticated(
                    "this service requires a token: send 'Authorization: Bearer <token>' "
                    "(in GraphiQL, in the Headers pane)"
                )
            return OPEN_ACCESS
        if self._bootstrap and hmac.compare_digest(secret.encode(), self._bootstrap.encode()):
            return BOOTSTRAP
        record = await token_lookups.find_token(self._engine(), secret)
        if record is None:
            raise Unauthenticated("the token is unknown or revoked")
        self._in_force = True
        if record.status == "revoked":
            raise Unauthenticated("the token was revoked")
        if record.status == "expired":
            assert record.expires_at is not None
            raise Unauthenticated(
                f"token expired at {record.expires_at.isoformat(timespec='seconds')}: "
                "ask an operator for a new one"
            )
        return Principal(
            role=record.role,
            token_id=record.id,
            node_id=record.node_id,
            description=record.description,
            tenant=record.tenant,
        )
