"""graphql-transport-ws messages of the wrong shape: refused with a reason, never a crash.

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
"""

from __future__ import annotations

import logging
from typing import Any

from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
)
from strawberry.subscriptions.protocols.graphql_transport_ws.types import ErrorMessage, Message

from service.graphql.context import Context
from service.web.graphql_http import BAD_REQUEST, MalformedRequest, check_parameters

log = logging.getLogger(__name__)

_TYPES = ("connection_init", "ping", "pong", "subscribe", "complete")
# A close frame's reason is at most 123 bytes.
_MAX_REASON = 120


def check_message(message: object) -> None:
    """MalformedRequest unless `message` has the shape graphql-transport-ws defines."""
    if not isinstance(message, dict):
        raise MalformedRequest(f"a message must be a JSON object, got {type(message).__name__}")
    kind = message.get("type")
    if kind not in _TYPES:
        raise MalformedRequest(f"unknown message type {kind!r}")
    payload = message.get("payload")
    if kind in ("connection_init", "ping", "pong"):
        if payload is not None and not isinstance(payload, dict):
            raise MalformedRequest(f"{kind} payload must be an object")
        return
    operation_id = message.get("id")
    if not isinstance(operation_id, str) or not operation_id:
        raise MalformedRequest(f"{kind} needs an `id` that is a non-empty string")
    if kind == "subscribe":
        if not isinstance(payload, dict):
            raise MalformedRequest("subscribe `payload` must be an object with a `query`")
        check_parameters(payload)


class CheckedTransportWS(BaseGraphQLTransportWSHandler[Context, None]):
    async def handle_message(self, message: Message) -> None:
        try:
            check_message(message)
        except MalformedRequest as refusal:
            await self._refuse(message, refusal)
            return
        await super().handle_message(message)

    async def _refuse(self, message: Any, refusal: MalformedRequest) -> None:
        log.info("refused a websocket message (%s): %s", BAD_REQUEST, refusal.message,
                 extra={"code": BAD_REQUEST})  # fmt: skip
        is_dict = isinstance(message, dict)
        operation_id = message.get("id") if is_dict else None
        if (
            self.connection_acknowledged
            and is_dict
            and message.get("type") == "subscribe"
            and isinstance(operation_id, str)
            and operation_id
            and operation_id not in self.operations
        ):
            error: Any = {"message": refusal.message, "extensions": {"code": BAD_REQUEST}}
            await self.send_message(ErrorMessage(id=operation_id, type="error", payload=[error]))
            return
        reason = f"{BAD_REQUEST}: {refusal.message}".encode()[:_MAX_REASON]
        await self.handle_invalid_message(reason.decode("utf-8", "ignore"))
