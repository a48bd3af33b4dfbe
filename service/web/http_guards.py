"""What stands in front of POST /graphql: body size, time limit, and the token check.

Plain ASGI, so each refusal is decided before Strawberry parses anything and
is answered as a GraphQL-shaped JSON error ({"errors": [{"message", "extensions":
{"code"}}]}) that every GraphQL client already knows how to show.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from service.auth import Authenticator, Unauthenticated
from service.config import Settings
from service.db_faults import RETRY_AFTER_SECONDS, DatabaseUnavailable, is_database_unavailable

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def error_body(message: str, code: str) -> bytes:
    """A GraphQL-shaped error of a request refused before execution (no `data` key)."""
    return json.dumps({"errors": [{"message": message, "extensions": {"code": code}}]}).encode()


async def send_error(
    send: Send,
    status: int,
    message: str,
    code: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = error_body(message, code)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def decode_json_body(data: str | bytes) -> object:
    """json.loads, with undecodable bytes reported as bad JSON (a 400), not a crash (a 500).

    json.loads guesses UTF-16/32 from the first bytes and raises
    UnicodeDecodeError, which Strawberry does not expect, for a body such as
    b"\\xff\\xfe...".
    """
    try:
        return json.loads(data)
    except (UnicodeDecodeError, RecursionError) as error:
        raise json.JSONDecodeError(f"not JSON: {type(error).__name__}", "", 0) from None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def replay(first: Message, receive: Receive) -> Receive:
    """A receive that hands out `first` again, then what the client sends next."""
    replayed = False

    async def receive_again() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return first
        return await receive()

    return receive_again


class BodySizeLimit:
    """413 for a body over `max_bytes`, before any of it is parsed.

    The body is read here (it is parsed whole anyway) so an oversized one is
    refused whether or not the client declared its length.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = (
            f"the request body is larger than {self.max_bytes} bytes (INVENTORY_MAX_BODY_BYTES)"
        )
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await send_error(send, 413, too_big, "BODY_TOO_LARGE")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await send_error(send, 413, too_big, "BODY_TOO_LARGE")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, replay(whole, receive), send)


class RequestTimeout:
    """A request that has not started answering after `seconds` is cancelled and told so.

    Cancelling rolls back an open transaction, so a timed-out mutation leaves
    nothing behind (unless the cancel lands during COMMIT itself, when the
    client cannot know either way, as with any lost connection). Once the
    response started (a streamed subscription), the limit no longer applies.
    """

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        timeout = asyncio.timeout(self.seconds)

        async def send_started(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                timeout.reschedule(None)
            await send(message)

        try:
            async with timeout:
                await self.app(scope, receive, send_started)
        except TimeoutError:
            if started or not timeout.expired():
                raise
            log.warning("request stopped after %gs: %s", self.seconds, scope.get("path"))
            await send_error(
                send,
                503,
                f"the request took longer than {self.seconds:g}s and was stopped "
                "(INVENTORY_REQUEST_TIMEOUT)",
                "REQUEST_TIMEOUT",
            )


class RequireToken:
    """401 before any resolver runs when tokens are in force and the request has no valid one.

    Open: GET without a `query` parameter (the GraphiQL page itself, where an
    operator types the token into the Headers pane). Everything that can run
    an operation needs a token. The caller's Principal is left in
    scope["state"]["principal"] for the GraphQL context.
    """

    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        runs_nothing = scope.get("method") == "GET" and not _asks_for_a_query(scope)
        if not runs_nothing:
            try:
                principal = await self.authenticator.principal(_header(scope, b"authorization"))
            except Unauthenticated as refused:
                # An expected outcome: one line, no traceback.
                log.info("refused a request (%s 401): %s", refused.code, refused.message,
                         extra={"code": refused.code})  # fmt: skip
                await send_error(
                    send, 401, refused.message, refused.code, [(b"www-authenticate", b"Bearer")]
                )
                return
            except Exception as error:
                if not is_database_unavailable(error):
                    raise
                log.warning("cannot check a token, database unavailable: %s", error)
                unavailable = DatabaseUnavailable()
                retry_after = (b"retry-after", str(RETRY_AFTER_SECONDS).encode())
                await send_error(send, 503, unavailable.message, unavailable.code, [retry_after])
                return
            scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


def _asks_for_a_query(scope: Scope) -> bool:
    # Decoded as Starlette decodes it (so `qu%65ry=` counts as `query=`):
    # anything Strawberry would execute must not pass as the IDE page.
    params = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    return any(key == "query" for key, _ in params)


def guard_graphql(app: ASGIApp, authenticator: Authenticator, settings: Settings) -> ASGIApp:
    """The GraphQL endpoint behind its time limit, size limit and token check (outermost first).

    The time limit is outermost so that a body trickled in slowly counts
    against it too: a client cannot hold a request open by sending its body
    a byte at a time.
    """
    return RequestTimeout(
        BodySizeLimit(RequireToken(app, authenticator), settings.max_body_bytes),
        settings.request_timeout,
    )
