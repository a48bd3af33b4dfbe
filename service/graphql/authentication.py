"""Putting the caller into the GraphQL context, for HTTP requests and websocket connections.

HTTP: service/web/http_guards.caller already checked the token and left the
Principal in the request's state. Websockets: the browser's WebSocket API
cannot set headers, so graphql-transport-ws clients send the token in the
connection_init payload ({"Authorization": "Bearer <token>"}); the connection
is refused (close code 4403) without a valid one when tokens are in force.
A token in the upgrade request's Authorization header is accepted too.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.types import Scope
from starlette.websockets import WebSocket
from strawberry.exceptions import ConnectionRejectionError

from service.access_control.auth import Authenticator, Principal, Unauthenticated
from service.database.db_faults import is_database_unavailable

from .context import Context

log = logging.getLogger(__name__)


async def identify(context: Context, request: Request | WebSocket, auth: Authenticator) -> None:
    if not isinstance(request, WebSocket):
        identify_http(context, request, auth)
        return
    context.authenticator = auth
    # Provisional: connection_init decides (accept_connection below).
    try:
        context.principal = await auth.principal(request.headers.get("authorization"))
    except Exception as error:
        if not (isinstance(error, Unauthenticated) or is_database_unavailable(error)):
            raise
        context.principal = None
    if context.principal is not None:
        context.actor = context.principal.actor


def caller_of(scope: Scope) -> Principal | None:
    """The Principal http_guards.caller left in an HTTP request's state (None: no token checked)."""
    principal: Principal | None = scope.get("state", {}).get("principal")
    return principal


def identify_http(context: Context, request: Request, auth: Authenticator) -> None:
    """Put the caller_of the request into its context."""
    context.authenticator = auth
    context.principal = caller_of(request.scope)
    if context.principal is not None:
        context.actor = context.principal.actor


def _authorization(params: dict[str, Any] | None) -> str | None:
    if not params:
        return None
    for key in ("Authorization", "authorization"):
        value = params.get(key)
        if isinstance(value, str):
            return value
    headers = params.get("headers")  # some clients nest their headers
    if isinstance(headers, dict):
        return _authorization(headers)
    token = params.get("token")
    return f"Bearer {token}" if isinstance(token, str) else None


def _reject(message: str, code: str) -> ConnectionRejectionError:
    return ConnectionRejectionError({"message": message, "extensions": {"code": code}})


async def accept_connection(context: Context) -> None:
    """Called on connection_init: a valid token in its payload, or refuse the connection."""
    auth = context.authenticator
    if auth is None:
        raise _reject("authentication is not set up", "UNAUTHENTICATED")
    header = _authorization(context.connection_params)
    if header is None and context.principal is not None:
        return  # the upgrade request's header, or no tokens in force
    try:
        context.principal = await auth.principal(header)
    except Unauthenticated as refused:
        raise _reject(refused.message, refused.code) from None
    except Exception as error:
        if not is_database_unavailable(error):
            raise
        raise _reject("database unavailable; retry shortly", "DATABASE_UNAVAILABLE") from None
    context.actor = context.principal.actor
