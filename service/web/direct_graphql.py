"""POST /graphql answered by the direct executor when it can, by Strawberry's view otherwise.

Stands behind the guards (time limit, body size, token check), so the body is
already read and the caller's Principal is in the scope's state. A request is
answered here only when it is the ordinary case: a POST with a JSON body that
is an object with a string `query`, optional `variables` (an object) and
`operationName` (a string), no `extensions`, and a document that parsed and
validated (service/graphql/direct.py). Anything else, the GraphiQL page, GET
queries, batches, multipart uploads, streamed responses and every malformed
request, is replayed unchanged to Strawberry, which answers it as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from service.graphql.context import Context
from service.graphql.direct import DirectExecutor
from service.metrics import count_executor
from service.web.graphql_http import PARSED_BODY
from service.web.http_guards import ASGIApp, Receive, Scope, Send, replay

_KNOWN_KEYS = frozenset({"query", "variables", "operationName"})


def _is_plain_json_post(scope: Scope) -> bool:
    if scope.get("method") != "POST":
        return False
    content_type = accept = b""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            content_type = value
        elif name == b"accept":
            accept = value
    # multipart/mixed asks for incremental delivery, which only Strawberry's
    # view streams.
    return content_type.split(b";")[0].strip().lower() == b"application/json" and (
        b"multipart" not in accept.lower()
    )


def _ordinary(request: object) -> tuple[str, str | None, dict[str, Any] | None] | None:
    """(query, operationName, variables) of an ordinary request body, else None."""
    if not isinstance(request, dict) or not _KNOWN_KEYS.issuperset(request):
        return None
    query = request.get("query")
    operation_name = request.get("operationName")
    variables = request.get("variables")
    if not isinstance(query, str):
        return None
    if operation_name is not None and not isinstance(operation_name, str):
        return None
    if variables is not None and not isinstance(variables, dict):
        return None
    return query, operation_name, variables


class DirectGraphQL:
    def __init__(
        self,
        strawberry_app: ASGIApp,
        executor: DirectExecutor,
        context_for: Callable[[Request], Context],
    ) -> None:
        self.app = strawberry_app
        self.executor = executor
        self.context_for = context_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not _is_plain_json_post(scope):
            count_executor("strawberry")
            await self.app(scope, receive, send)
            return
        message = await receive()
        if message["type"] != "http.request" or message.get("more_body", False):
            # BodySizeLimit hands the body over whole; anything else is not
            # ours to reassemble.
            count_executor("strawberry")
            await self.app(scope, replay(message, receive), send)
            return
        # Parsed and checked by service/web/graphql_http.CheckRequest.
        ordinary = _ordinary(scope.get("state", {}).get(PARSED_BODY))
        prepared = None
        if ordinary is not None:
            prepared = self.executor.prepare(ordinary[0], ordinary[1])
        if ordinary is None or prepared is None:
            count_executor("strawberry")
            await self.app(scope, replay(message, receive), send)
            return
        count_executor("direct")
        _, operation_name, variables = ordinary
        context = self.context_for(Request(scope, receive))
        encoded = await self.executor.execute(prepared, operation_name, variables, context)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(encoded)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": encoded})
