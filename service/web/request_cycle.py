"""The process's ASGI callable: what every request gets once, then where it goes.

Every HTTP request and websocket gets its request id (web/logs.py) for the
log lines written while it runs; every HTTP request also gets its latency
observed, its access-log line, and one Exchange (exchange.py) as its `send`:
the X-Request-Id header, `Connection: close` while draining, and its status.

Then GET, HEAD and POST on /graphql go straight to the GraphQL endpoint
(graphql_endpoint.py); everything else (websockets included) to the
Starlette app's routes. Starlette's router would do the same for /graphql:
match the path (with uvicorn's root path taken off, as Starlette does) and
the method, and call the endpoint. What it adds on the way, two send
wrappers, a router and exception middleware, is for endpoints that raise
Starlette's HTTPException, which this one never does. Other methods on
/graphql still meet the route, and its 405.

A bug (an exception escaping before the response started) is answered here
for the GraphQL endpoint: 500 with a GraphQL-shaped JSON error carrying the
request id, and one log line with the traceback and the id. Starlette's own
ServerErrorMiddleware still answers for its routes (plain text, then uvicorn
logs the traceback). After a response started, the exception goes on to
uvicorn, which closes the connection: the client cannot mistake half an
answer for a whole one.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette

from service.database import request_state
from service.graphql.masking import INTERNAL_ERROR
from service.metrics import observe_request
from service.web.draining import Drain
from service.web.exchange import REQUEST_ID_HEADER, Exchange
from service.web.http_guards import Receive, Scope, Send, header
from service.web.logs import (
    access_log,
    new_request_id,
    reset_request_id,
    sane_request_id,
    set_request_id,
)

log = logging.getLogger(__name__)

GRAPHQL_PATH = "/graphql"
GRAPHQL_METHODS = frozenset({"GET", "HEAD", "POST"})
# The path is the metrics' route label (no path parameters here); anything
# unknown is folded into one label so a scanner cannot mint a series per URL.
KNOWN_ROUTES = frozenset({GRAPHQL_PATH, "/healthz", "/readyz", "/metrics"})


class RequestCycle:
    """The ASGI app uvicorn runs: the Starlette app's routes, and /graphql without its detours."""

    def __init__(
        self,
        app: Starlette,
        graphql: Callable[[Scope, Receive, Exchange], Awaitable[None]],
        drain: Drain,
        exchange: type[Exchange] = Exchange,
    ) -> None:
        self.app = app
        # The GraphQL endpoint, or the same inside an operation span (web/tracing.py),
        # which also makes each request's Exchange one that can keep its answer.
        self.graphql = graphql
        self.drain = drain
        self.exchange = exchange

    @property
    def state(self) -> Any:
        """The Starlette app's state (the drain, the engine, the settings)."""
        return self.app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            token = _identify(scope)
            try:
                await self.app(scope, receive, send)
            finally:
                reset_request_id(token)
        else:  # lifespan
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        token = _identify(scope)
        request_id: str = scope["state"]["request_id"]
        # What the request asks of the database and learns from it (its time
        # limits, the database found unavailable): service/database/request_state.py.
        state, state_token = request_state.begin()
        exchange = self.exchange(send, request_id, self.drain, state)
        try:
            if _route_path(scope) == GRAPHQL_PATH and scope["method"] in GRAPHQL_METHODS:
                scope["app"] = self.app  # as Starlette's own dispatch leaves it
                try:
                    await self.graphql(scope, receive, exchange)
                except Exception:
                    if exchange.started:
                        raise
                    log.exception("bug: %s %s answered 500", scope["method"], scope["path"])
                    await exchange.answer(500, _internal_error(request_id))
            else:
                await self.app(scope, receive, exchange)
        finally:
            elapsed = time.perf_counter() - started
            path = scope["path"]
            observe_request(
                scope["method"], path if path in KNOWN_ROUTES else "other", exchange.status, elapsed
            )
            if access_log.isEnabledFor(logging.DEBUG):
                access_log.debug(
                    "%s %s %d %.1f ms",
                    scope["method"],
                    path,
                    exchange.status,
                    elapsed * 1000,
                    extra={"status": exchange.status, "duration_ms": round(elapsed * 1000, 2)},
                )
            request_state.end(state_token)
            reset_request_id(token)


def _identify(scope: Scope) -> contextvars.Token[str | None]:
    """Give the request its id (the caller's X-Request-Id when sane); reset_request_id undoes it."""
    incoming = header(scope, REQUEST_ID_HEADER)
    request_id = incoming if incoming and sane_request_id(incoming) else new_request_id()
    state = scope.get("state")
    if state is None:
        state = scope["state"] = {}
    state["request_id"] = request_id
    return set_request_id(request_id)


def _route_path(scope: Scope) -> str:
    """The path a Starlette route matches: uvicorn's root path (--root-path) taken off."""
    path: str = scope["path"]
    root_path = scope.get("root_path", "")
    if not root_path or not path.startswith(root_path):
        return path
    if path == root_path:
        return ""
    return path[len(root_path) :] if path[len(root_path)] == "/" else path


def _internal_error(request_id: str) -> bytes:
    error = {
        "message": INTERNAL_ERROR,
        "extensions": {"code": "INTERNAL_ERROR", "requestId": request_id},
    }
    return json.dumps({"errors": [error]}, separators=(",", ":")).encode()
