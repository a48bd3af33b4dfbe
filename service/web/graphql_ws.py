"""WebSocket messages of the wrong shape: refused with a reason, never a crash.

Strawberry's handler reads `message["type"]` and `message["payload"]["query"]`
as given, so a message that was JSON but not an object (`[1]`, `"x"`), or a
subscribe whose payload was not one, raised a TypeError out of the
connection: a traceback in the log and a dropped socket with no word why.
The same checks as an HTTP request's (service/web/graphql_http.py) run first:

- a subscribe with a usable id whose payload is malformed gets that
  operation's `error` message, GraphQL-shaped with `extensions.code`
  BAD_REQUEST, and the connection stays open;
- any other malformed message closes the socket with 4400 and the reason,
  as the protocol prescribes for a message it does not define.

The legacy `graphql-ws` protocol (subscriptions-transport-ws, still spoken by
older Apollo clients) had the same crash: its handler reads
`message["type"]` as well. Its messages get the same checks; a malformed
`start` with a usable id gets that operation's `error`, anything else a
`connection_error` with the reason, then the same 4400 close (the old
protocol defines no close code for it).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
)
from strawberry.subscriptions.protocols.graphql_transport_ws.types import ErrorMessage, Message
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler
from strawberry.subscriptions.protocols.graphql_ws.types import OperationMessage

from service.errors import shown_value
from service.graphql.context import Context
from service.web.graphql_http import BAD_REQUEST, MalformedRequest, check_parameters

log = logging.getLogger(__name__)

_TYPES = ("connection_init", "ping", "pong", "subscribe", "complete")
_LEGACY_TYPES = ("connection_init", "connection_terminate", "start", "stop")
# A close frame's reason is at most 123 bytes.
_MAX_REASON = 120


def check_message(message: object) -> None:
    """MalformedRequest unless `message` has the shape graphql-transport-ws defines."""
    _check(message, _TYPES, ("connection_init", "ping", "pong"), "subscribe")


def check_legacy_message(message: object) -> None:
    """MalformedRequest unless `message` has the shape the legacy graphql-ws protocol defines."""
    _check(message, _LEGACY_TYPES, ("connection_init", "connection_terminate"), "start")


def _check(
    message: object, types: tuple[str, ...], without_id: tuple[str, ...], start: str
) -> None:
    if not isinstance(message, dict):
        raise MalformedRequest(f"a message must be a JSON object, got {type(message).__name__}")
    kind = message.get("type")
    if kind not in types:
        raise MalformedRequest(f"unknown message type {shown_value(kind)}")
    payload = message.get("payload")
    if kind in without_id:
        if payload is not None and not isinstance(payload, dict):
            raise MalformedRequest(f"{kind} payload must be an object")
        return
    operation_id = message.get("id")
    if not isinstance(operation_id, str) or not operation_id:
        raise MalformedRequest(f"{kind} needs an `id` that is a non-empty string")
    if kind == start:
        if not isinstance(payload, dict):
            raise MalformedRequest(f"{start} `payload` must be an object with a `query`")
        check_parameters(payload)


def _log_refusal(refusal: MalformedRequest) -> None:
    log.info("refused a websocket message (%s): %s", BAD_REQUEST, refusal.message,
             extra={"code": BAD_REQUEST})  # fmt: skip


def _operation_to_answer(message: Any, start: str, acknowledged: bool, taken: Any) -> str | None:
    """The id of a malformed start/subscribe that can be answered on its own, else None."""
    if not (acknowledged and isinstance(message, dict) and message.get("type") == start):
        return None
    operation_id = message.get("id")
    if isinstance(operation_id, str) and operation_id and operation_id not in taken:
        return operation_id
    return None


def _close_reason(refusal: MalformedRequest) -> str:
    return f"{BAD_REQUEST}: {refusal.message}".encode()[:_MAX_REASON].decode("utf-8", "ignore")


async def _checked(
    message: Any,
    check: Callable[[object], None],
    refuse: Callable[[Any, MalformedRequest], Awaitable[None]],
    handle: Callable[[Any], Awaitable[None]],
) -> None:
    """The protocol's handling of a well-formed message; a malformed one is refused, once logged."""
    try:
        check(message)
    except MalformedRequest as refusal:
        _log_refusal(refusal)
        await refuse(message, refusal)
        return
    await handle(message)


def _error(refusal: MalformedRequest) -> Any:
    return {"message": refusal.message, "extensions": {"code": BAD_REQUEST}}


class CheckedTransportWS(BaseGraphQLTransportWSHandler[Context, None]):
    async def handle_message(self, message: Message) -> None:
        await _checked(message, check_message, self._refuse, super().handle_message)

    async def _refuse(self, message: Any, refusal: MalformedRequest) -> None:
        acknowledged, taken = self.connection_acknowledged, self.operations
        operation_id = _operation_to_answer(message, "subscribe", acknowledged, taken)
        if operation_id is not None:
            payload = [_error(refusal)]
            await self.send_message(ErrorMessage(id=operation_id, type="error", payload=payload))
            return
        await self.handle_invalid_message(_close_reason(refusal))


class CheckedLegacyWS(BaseGraphQLWSHandler[Context, None]):
    async def handle_message(self, message: OperationMessage) -> None:
        await _checked(message, check_legacy_message, self._refuse, super().handle_message)

    async def _refuse(self, message: Any, refusal: MalformedRequest) -> None:
        acknowledged, taken = self.connection_acknowledged, self.subscriptions
        operation_id = _operation_to_answer(message, "start", acknowledged, taken)
        if operation_id is not None:
            await self.send_message(
                {"type": "error", "id": operation_id, "payload": _error(refusal)}
            )
            return
        await self.send_message({"type": "connection_error", "payload": _error(refusal)})
        await self.websocket.close(code=4400, reason=_close_reason(refusal))
