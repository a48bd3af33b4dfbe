"""GET and POST /graphql, step by step: media type, time limit, body, token, request shape, route.

In this order, each step answering a request it refuses:

1. the media type of the answer, from Accept (graphql_http.py): 406 when
   nothing fits, before anything else is read;
2. the time limit (INVENTORY_REQUEST_TIMEOUT, time_limits.py), around all after it,
   so that a body trickled in a byte at a time counts against it too: 503;
   and the client's deadline (X-Client-Timeout, http_guards.client_deadline),
   after which no write of the request commits: 400 BAD_INPUT when malformed;
3. the body, read whole, at most INVENTORY_MAX_BODY_BYTES: 413;
4. the caller's token: 401 (503 while the database cannot say);
5. the request's shape (graphql_http.check_request): 4xx;
6. the fast path's front door (service/graphql/fast/front_door.py) answers,
   or declines to Strawberry's view, which always answers. With
   INVENTORY_FAST_PATH=false there is no front door.

These were six ASGI layers, each wrapping the next one's `receive` or `send`
(the body replayed three times, the response start copied at each layer).
As steps of one call, a request the fast path answers passes no wrapper at
all: its answer goes out whole through the request's Exchange (exchange.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from service.access_control.auth import Authenticator, Principal
from service.config import Settings
from service.database import request_state
from service.graphql.context import Context
from service.web.exchange import Exchange
from service.web.graphql_http import (
    MalformedRequest,
    Negotiated,
    answer_json,
    check_request,
    refuse,
    response_media_type,
    unanswerable,
    with_read_source,
)
from service.web.http_guards import (
    ASGIApp,
    Receive,
    Refused,
    Scope,
    Send,
    caller,
    client_deadline,
    error_body,
    header,
    read_body,
    replay,
    time_limit_passed,
)
from service.web.time_limits import TimeLimits

log = logging.getLogger(__name__)


class FrontDoor(Protocol):
    """What may answer a request before Strawberry's view: the fast path's, when the app
    installed it (service/graphql/fast/front_door.py), named here by its shape only, so
    that the web layer loads and type-checks with the fast path removed.

    `answer` gives the response body (status 200, JSON), or None: Strawberry's view answers.
    """

    async def answer(
        self,
        request: object,
        plain_json_post: bool,
        principal: Principal | None,
        make_context: Callable[[], Context],
    ) -> bytes | None: ...


# Accept headers seen, and the media type each one answers in: clients send
# one or two distinct values, each parsed once. Bounded: a client inventing
# a new header per request only costs the parse.
_MEDIA_TYPES_KEPT = 64


class GraphQLEndpoint:
    """GET and POST /graphql (HEAD too, which Strawberry's view refuses)."""

    def __init__(
        self,
        view: ASGIApp,
        front_door: FrontDoor | None,
        authenticator: Authenticator,
        settings: Settings,
        context_for: Callable[[Scope, Receive], Context],
    ) -> None:
        self.view = view
        self.front_door = front_door
        # The request's GraphQL Context, for the front door to make if it needs one.
        self.context_for = context_for
        self.authenticator = authenticator
        self.limits = TimeLimits(settings.request_timeout)
        self.max_bytes = settings.max_body_bytes
        self._media_types: dict[str | None, str | None] = {}

    async def __call__(self, scope: Scope, receive: Receive, exchange: Exchange) -> None:
        accept = header(scope, b"accept")
        media_type = self._media_type(accept)
        if media_type is None:
            refusal = unanswerable(scope, accept)
            if refusal is not None:
                await refuse(exchange, None, refusal)
                return
        limit = exchange.limit = self.limits.begin()
        state = request_state.current()
        if state is not None:
            # Writes retried while the database is away stop in time for an answer.
            state.limit_at = limit.deadline
            try:
                # No write commits after the client stops waiting (connections.transaction).
                state.client_deadline = client_deadline(scope, limit.deadline - self.limits.seconds)
            except Refused as refused:
                exchange.limit = None
                limit.end()
                await self._refused(exchange, media_type, refused)
                return
        try:
            with limit:
                await self._in_time(scope, receive, exchange, media_type)
        except TimeoutError:
            exchange.limit = None
            if exchange.started or not limit.expired:
                raise
            await self._refused(exchange, media_type, time_limit_passed(self.limits.seconds, scope))
        finally:
            exchange.limit = None

    async def _in_time(
        self, scope: Scope, receive: Receive, exchange: Exchange, media_type: str | None
    ) -> None:
        try:
            body = await read_body(scope, receive, self.max_bytes)
            if body is None:  # the client went away
                return
            principal = await caller(scope, self.authenticator)
        except Refused as refused:
            await self._refused(exchange, media_type, refused)
            return
        try:
            request = check_request(scope, body)
        except MalformedRequest as refusal:
            await refuse(exchange, media_type, refusal)
            return
        if self.front_door is not None:
            answer = await self.front_door.answer(
                request,
                plain_json_post(scope),
                principal,
                lambda: self.context_for(scope, receive),
            )
            if answer is not None:
                await answer_json(exchange, media_type, 200, with_read_source(answer))
                return
        whole = {"type": "http.request", "body": body, "more_body": False}
        send: Send = exchange if media_type is None else Negotiated(exchange, media_type)
        await self.view(scope, replay(whole, receive), send)

    async def _refused(self, exchange: Exchange, media_type: str | None, refused: Refused) -> None:
        body = error_body(refused.message, refused.code, refused.extensions)
        await answer_json(exchange, media_type, refused.status, body, refused.headers)

    def _media_type(self, accept: str | None) -> str | None:
        try:
            return self._media_types[accept]
        except KeyError:
            pass
        media_type = response_media_type(accept)
        if len(self._media_types) < _MEDIA_TYPES_KEPT:
            self._media_types[accept] = media_type
        return media_type


def plain_json_post(scope: Scope) -> bool:
    """A POST of application/json that asks for no stream: the only requests the front door answers.

    multipart/mixed in Accept asks for incremental delivery, which only
    Strawberry's view streams.
    """
    if scope.get("method") != "POST":
        return False
    content_type = header(scope, b"content-type") or ""
    accept = header(scope, b"accept") or ""
    return content_type.split(";")[0].strip().lower() == "application/json" and (
        "multipart" not in accept.lower()
    )
