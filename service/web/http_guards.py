"""What stands in front of POST /graphql: body size, time limit, and the token check.

Steps of the GraphQL endpoint (web/graphql_endpoint.py), each decided before
Strawberry parses anything. A refusal (Refused) is answered as a GraphQL-shaped
JSON error ({"errors": [{"message", "extensions": {"code"}}]}) that every
GraphQL client already knows how to show.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from service.access_control.auth import Authenticator, Principal, Unauthenticated
from service.bounds import MAX_CLIENT_TIMEOUT
from service.database.db_faults import (
    RETRY_AFTER_SECONDS,
    DatabaseUnavailable,
    StatementTimedOut,
    is_database_unavailable,
    is_statement_timeout,
)
from service.database.request_state import ClientDeadline
from service.errors import InventoryError, shown

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def error_body(message: str, code: str, extensions: dict[str, Any] | None = None) -> bytes:
    """A GraphQL-shaped error of a request refused before execution (no `data` key)."""
    error = {"message": message, "extensions": {"code": code, **(extensions or {})}}
    return json.dumps({"errors": [error]}).encode()


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


# Where a request's headers are kept by name once read (an ASGI scope may
# carry keys of its own): six steps read one header each, and each scanned the
# list again, a microsecond and a half of every request.
_HEADERS_BY_NAME = "llmgw.headers"


def header(scope: Scope, name: bytes) -> str | None:
    """A request header's first value (as latin-1), None when absent; `name` in lower case.

    ASGI servers give header names in lower case. A header sent twice
    answers with its first value, as a scan of the list would.
    """
    by_name: dict[bytes, bytes] | None = scope.get(_HEADERS_BY_NAME)
    if by_name is None:
        # Reversed: the first of a repeated header is the one kept.
        by_name = scope[_HEADERS_BY_NAME] = dict(reversed(scope.get("headers") or ()))
    value = by_name.get(name)
    return None if value is None else value.decode("latin-1")


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


class Refused(Exception):
    """A guard's refusal, answered as a GraphQL-shaped JSON error (error_body)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        extensions: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers
        # More of the error's extensions (a BAD_INPUT's field and value).
        self.extensions = extensions


async def read_body(scope: Scope, receive: Receive, max_bytes: int) -> bytes | None:
    """The whole request body, or Refused (413) once it is over `max_bytes`; None: the client left.

    Read before any of it is parsed (it is parsed whole anyway), so an
    oversized body is refused whether or not the client declared its length.
    """
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_big(max_bytes)
    message = await receive()
    if message["type"] != "http.request":  # the client went away
        return None
    body: bytes = message.get("body", b"")
    if len(body) > max_bytes:
        raise _too_big(max_bytes)
    if not message.get("more_body", False):
        return body  # nearly always: the whole body in one message
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise _too_big(max_bytes)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_big(max_bytes: int) -> Refused:
    return Refused(
        413,
        f"the request body is larger than {max_bytes} bytes (INVENTORY_MAX_BODY_BYTES)",
        "BODY_TOO_LARGE",
    )


def time_limit_passed(seconds: float, scope: Scope) -> Refused:
    """The answer of a request that had not started answering after `seconds` and was cancelled.

    Cancelling rolls back an open transaction, so a timed-out mutation leaves
    nothing behind (unless the cancel lands during COMMIT itself, when the
    client cannot know either way, as with any lost connection). Once the
    response started (a streamed subscription), the limit no longer applies
    (web/exchange.py ends it).
    """
    log.warning("request stopped after %gs: %s", seconds, scope.get("path"))
    return Refused(
        503,
        f"the request took longer than {seconds:g}s and was stopped (INVENTORY_REQUEST_TIMEOUT)",
        "REQUEST_TIMEOUT",
    )


# How long the client waits for this answer, in seconds from its arrival: no
# write of the request commits after that (docs/scheduler/deadlines.md).
# Relative, not a time of day: the client's clock and the service's need not
# agree.
CLIENT_TIMEOUT = "X-Client-Timeout"
_CLIENT_TIMEOUT_HEADER = CLIENT_TIMEOUT.lower().encode()
_SECONDS = re.compile(r"-?[0-9]{1,12}(\.[0-9]{1,9})?")


def client_deadline(scope: Scope, now: float) -> ClientDeadline | None:
    """The client's deadline from X-Client-Timeout (on the clock `now` is read from), if it sent one.

    Refused (400, BAD_INPUT naming the header and its value) when it is not a
    number of seconds, is 0 or less (the client stopped waiting before it
    asked), or is more than MAX_CLIENT_TIMEOUT.
    """
    raw = header(scope, _CLIENT_TIMEOUT_HEADER)
    if raw is None:
        return None
    text = raw.strip()
    if not _SECONDS.fullmatch(text):
        problem = "expected the seconds the client waits for this answer, e.g. 2.5"
    elif float(text) <= 0:
        problem = "the deadline is already past: the client stopped waiting before it asked"
    elif float(text) > MAX_CLIENT_TIMEOUT:
        problem = f"at most {MAX_CLIENT_TIMEOUT:g} seconds (is it milliseconds?)"
    else:
        seconds = float(text)
        return ClientDeadline(now + seconds, seconds)
    value = shown(raw)
    log.info(
        "refused a request (BAD_INPUT 400): %s='%s'",
        CLIENT_TIMEOUT,
        value,
        extra={"code": "BAD_INPUT"},
    )
    raise Refused(
        400,
        f"{CLIENT_TIMEOUT}='{value}': {problem}",
        "BAD_INPUT",
        extensions={"field": CLIENT_TIMEOUT, "value": value},
    )


async def caller(scope: Scope, authenticator: Authenticator) -> Principal | None:
    """Who sent a request that can run an operation; Refused (401) without a valid token.

    Open (None): GET without a `query` parameter (the GraphiQL page itself,
    where an operator types the token into the Headers pane). Everything that
    can run an operation needs a token when tokens are in force. The caller's
    Principal is also left in scope["state"]["principal"] for the GraphQL context.
    """
    if scope.get("method") == "GET" and not _asks_for_a_query(scope):
        return None
    try:
        principal = await authenticator.principal(header(scope, b"authorization"))
    except Unauthenticated as refused:
        # An expected outcome: one line, no traceback.
        log.info("refused a request (%s 401): %s", refused.code, refused.message,
                 extra={"code": refused.code})  # fmt: skip
        raise Refused(
            401, refused.message, refused.code, ((b"www-authenticate", b"Bearer"),)
        ) from None
    except Exception as error:
        if is_database_unavailable(error):
            outcome: InventoryError = DatabaseUnavailable()
        elif is_statement_timeout(error):
            outcome = StatementTimedOut()
        else:
            raise
        # An expected outcome of the database, not a bug: one line, no traceback.
        log.warning("cannot check a token: %s (%s)", outcome.code, _first_line(error),
                    extra={"code": outcome.code})  # fmt: skip
        retry_after = (b"retry-after", str(RETRY_AFTER_SECONDS).encode())
        raise Refused(503, outcome.message, outcome.code, (retry_after,)) from None
    scope.setdefault("state", {})["principal"] = principal
    return principal


def _first_line(error: BaseException) -> str:
    return (str(error) or type(error).__name__).splitlines()[0]


def _asks_for_a_query(scope: Scope) -> bool:
    # Decoded as Starlette decodes it (so `qu%65ry=` counts as `query=`):
    # anything Strawberry would execute must not pass as the IDE page.
    params = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    return any(key == "query" for key, _ in params)
