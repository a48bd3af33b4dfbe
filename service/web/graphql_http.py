"""GraphQL over HTTP, to the letter: which media type answers, and what a request must look like.

Both execution routes (the fast path and Strawberry's view) stand behind
these steps of the GraphQL endpoint (web/graphql_endpoint.py), so every
client gets the same answer whichever route runs its operation:

- The media type (first) from Accept. A client that asks for
  `application/graphql-response+json` (the GraphQL-over-HTTP spec's media
  type) gets it, and a request that failed before execution (a document that
  did not parse or validate, variables that did not coerce, an operation that
  does not exist) is then a 400 without a `data` key. With `application/json`
  (or no Accept, or `*/*`) the answer is what it always was: 200 with
  `"data": null`. Any plain-text refusal from Strawberry's view (an unknown
  operation name, a mutation sent with GET) is rewritten as a GraphQL-shaped
  JSON error, so no client ever has to parse a sentence. Answers held whole
  (the fast path's, every refusal) go out through `answer_json`; Strawberry's
  view's through `Negotiated`, the one wrapper of its `send`.
- The request's shape (`check_request`, last, after the body is read and the
  token checked) refuses a malformed request before either route sees it: a
  body that is not UTF-8, not JSON or not one JSON object, a missing or
  non-string `query`, `variables` or `extensions` that are not objects, an
  `operationName` that is not a string, a POST that is not
  `application/json`. Each is a 4xx with `extensions.code` BAD_REQUEST and a
  sentence naming what was wrong. Before this, a JSON string, number or null
  as the body was a 500 with a traceback.

The parsed body is handed to the fast path's front door, so the checks cost
no second parse on the hot path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any, Final
from urllib.parse import parse_qsl

from service.database import request_state
from service.errors import shown
from service.web.exchange import Exchange
from service.web.http_guards import Message, Scope, Send, error_body, header

log = logging.getLogger(__name__)

JSON: Final = "application/json"
GRAPHQL_RESPONSE: Final = "application/graphql-response+json"
# Strawberry's streaming transports (subscriptions over SSE, incremental
# delivery): their own media types, passed through untouched.
STREAMING: Final = ("text/event-stream", "multipart/mixed")
JSON_TYPE: Final = JSON.encode()
GRAPHQL_RESPONSE_TYPE: Final = f"{GRAPHQL_RESPONSE}; charset=utf-8".encode()

BAD_REQUEST: Final = "BAD_REQUEST"
_STATUS_CODES: Final = {
    400: BAD_REQUEST,
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    415: "UNSUPPORTED_MEDIA_TYPE",
}


class MalformedRequest(Exception):
    """What is wrong with a request's shape, said for the client; `status` is a 4xx."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _media_ranges(accept: str) -> list[tuple[str, float]]:
    """Accept as (media range, q), parameters other than q dropped."""
    ranges = []
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if not media:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        ranges.append((media.lower(), q))
    return ranges


def response_media_type(accept: str | None) -> str | None:
    """The media type of a GraphQL answer for this Accept header; None: nothing we serve fits.

    graphql-response+json when the client ranks it at least as high as
    application/json, else application/json (also for no Accept at all, as the
    spec asks during its migration to the new type).
    """
    if accept is None or not accept.strip():
        return JSON
    quality: dict[str, float] = {}
    for media, q in _media_ranges(accept):
        quality[media] = max(q, quality.get(media, 0.0))
    wildcard = max(quality.get("*/*", 0.0), quality.get("application/*", 0.0))
    new = quality.get(GRAPHQL_RESPONSE, 0.0)
    legacy = max(quality.get(JSON, 0.0), wildcard)
    if new > 0 and new >= legacy:
        return GRAPHQL_RESPONSE
    if legacy > 0:
        return JSON
    return None


def _streaming(accept: str | None) -> bool:
    return accept is not None and any(kind in accept.lower() for kind in STREAMING)


def _runs_an_operation(scope: Scope) -> bool:
    """POST, or GET with a query (a GET without one is the GraphiQL page)."""
    if scope.get("method") != "GET":
        return True
    params = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    return any(key == "query" for key, _ in params)


def _is_request_error(body: bytes) -> bool:
    """A JSON answer whose `data` is null and whose errors all came before execution.

    Execution errors carry the path of the field that failed; a parse,
    validation or variable error has none. Only bodies that begin with a null
    `data` are read at all, so a successful answer is never parsed again.
    """
    head = body[:16].replace(b" ", b"")
    if not head.startswith(b'{"data":null'):
        return False
    answer = json.loads(body)
    errors = answer.get("errors") if isinstance(answer, dict) else None
    if not isinstance(errors, list) or not errors:
        return False
    return all(isinstance(error, dict) and "path" not in error for error in errors)


def unanswerable(scope: Scope, accept: str | None) -> MalformedRequest | None:
    """The 406 of a request whose Accept names nothing a GraphQL answer comes in.

    None also for the streaming transports (SSE, multipart) and the GraphiQL
    page, which Strawberry's view answers in their own media types.
    """
    if _streaming(accept) or not _runs_an_operation(scope):
        return None
    return MalformedRequest(
        f"cannot answer in any media type of Accept: '{shown(accept or '')}'; "
        f"ask for {GRAPHQL_RESPONSE} or {JSON}",
        406,
    )


def _logged(refusal: MalformedRequest) -> str:
    """The code of a refusal, after its one log line (an expected outcome: INFO, no traceback)."""
    code = _STATUS_CODES.get(refusal.status, BAD_REQUEST)
    log.info("refused a malformed request (%s %d): %s", code, refusal.status, refusal.message,
             extra={"code": code})  # fmt: skip
    return code


async def refuse(exchange: Exchange, media_type: str | None, refusal: MalformedRequest) -> None:
    """The GraphQL-shaped error of a malformed request, in the media type negotiated."""
    body = error_body(refusal.message, _logged(refusal))
    await answer_json(exchange, media_type, refusal.status, body)


async def answer_json(
    exchange: Exchange,
    media_type: str | None,
    status: int,
    body: bytes,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """A whole JSON answer in the media type the client asked for (None: plain JSON)."""
    if media_type == GRAPHQL_RESPONSE:
        status, body = _as_graphql_response(status, body)
        await exchange.answer(status, body, GRAPHQL_RESPONSE_TYPE, headers)
    else:
        await exchange.answer(status, body, JSON_TYPE, headers)


def _as_graphql_response(status: int, body: bytes) -> tuple[int, bytes]:
    """A JSON answer as application/graphql-response+json says: a request error is a 400 without `data`."""
    if status == 200 and _is_request_error(body):
        answer = json.loads(body)
        del answer["data"]
        return 400, json.dumps(answer, separators=(",", ":")).encode()
    return status, body


def with_read_source(body: bytes) -> bytes:
    """A JSON answer with `extensions.readFrom` when its reads were routed (service/database/read_routing.py).

    {"source": "replica" or "primary", "lagSeconds": at most this far behind
    the primary}: the stalest of the request's reads. Only requests that
    tolerate staleness are routed, and only when read replicas are
    configured (INVENTORY_READ_DATABASE_URL); no other answer changes.
    """
    state = request_state.current()
    if state is None or state.read_from is None or body[:1] != b"{" or body[-1:] != b"}":
        return body
    entry = json.dumps(
        {"readFrom": {"source": state.read_from, "lagSeconds": round(state.read_lag, 3)}},
        separators=(",", ":"),
    ).encode()
    return body[:-1] + b',"extensions":' + entry + b"}"


class Negotiated:
    """The `send` of one request: holds the response start until its body says what it is."""

    def __init__(self, send: Send, media_type: str) -> None:
        # A wrapper of its own, for Strawberry's view only: the fast path and
        # the guards answer whole (answer_json).
        self.send = send
        self.media_type = media_type
        self.start: Message | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            return
        if message["type"] != "http.response.body" or self.start is None:
            await self.send(message)
            return
        start, self.start = self.start, None
        if message.get("more_body", False):
            # A streamed answer (SSE, multipart): its transport's own type.
            await self.send(start)
            await self.send(message)
            return
        await self._send_whole(start, message.get("body", b""))

    async def _send_whole(self, start: Message, body: bytes) -> None:
        status = int(start["status"])
        headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"content-length"]
        content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
        kind = content_type.split(b";")[0].strip().lower()
        if kind == b"text/plain" and status >= 400:
            # Strawberry's view refuses some requests in plain text (an
            # unknown operation name, a mutation sent with GET).
            refusal = MalformedRequest(body.decode("utf-8", "replace").strip(), status)
            body = error_body(refusal.message, _logged(refusal))
            kind = JSON_TYPE
            headers = [(k, v) for k, v in headers if k.lower() != b"content-type"]
            headers.append((b"content-type", JSON_TYPE))
        if kind == JSON_TYPE:
            body = with_read_source(body)
        if kind == JSON_TYPE and self.media_type == GRAPHQL_RESPONSE:
            status, body = _as_graphql_response(status, body)
            headers = [(k, v) for k, v in headers if k.lower() != b"content-type"]
            headers.append((b"content-type", GRAPHQL_RESPONSE_TYPE))
        headers.append((b"content-length", str(len(body)).encode()))
        await self.send({**start, "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})


def check_body(body: bytes) -> dict[str, Any]:
    """The request object of a POST body, or MalformedRequest saying what is wrong with it."""
    if not body.strip():
        raise MalformedRequest("the request body is empty; send a JSON object with a `query`")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise MalformedRequest(
            f"the request body is not UTF-8: byte 0x{body[error.start]:02x} at offset {error.start}"
        ) from None
    try:
        request = json.loads(text)
    except json.JSONDecodeError as error:
        raise MalformedRequest(f"the request body is not JSON: {error}") from None
    except RecursionError:
        raise MalformedRequest("the request body is not JSON: nested too deeply") from None
    if isinstance(request, list):
        raise MalformedRequest(
            "the request body is a JSON array; batching is not supported: "
            "send one JSON object per request"
        )
    if not isinstance(request, dict):
        raise MalformedRequest(
            f"the request body must be a JSON object with a `query`, got a JSON "
            f"{_json_type(request)}"
        )
    check_parameters(request)
    return request


def check_parameters(request: dict[str, Any]) -> None:
    query = request.get("query")
    if query is None:
        raise MalformedRequest("the request has no `query`: send the GraphQL document as `query`")
    if not isinstance(query, str):
        raise MalformedRequest(f"`query` must be a string, got a JSON {_json_type(query)}")
    for name in ("variables", "extensions"):
        value = request.get(name)
        if value is not None and not isinstance(value, dict):
            raise MalformedRequest(
                f"`{name}` must be a JSON object or null, got a JSON {_json_type(value)}"
            )
    operation_name = request.get("operationName")
    if operation_name is not None and not isinstance(operation_name, str):
        raise MalformedRequest(
            f"`operationName` must be a string or null, got a JSON {_json_type(operation_name)}"
        )


def _check_query_string(scope: Scope) -> None:
    """A GET's parameters: variables and extensions are JSON objects, as in a POST body."""
    params = dict(
        parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    )
    request: dict[str, Any] = {"query": params.get("query")}
    if "operationName" in params:
        request["operationName"] = params["operationName"]
    for name in ("variables", "extensions"):
        if params.get(name):
            try:
                request[name] = json.loads(params[name])
            except json.JSONDecodeError as error:
                raise MalformedRequest(f"`{name}` is not JSON: {error}") from None
    check_parameters(request)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _check_content_type(scope: Scope) -> None:
    content_type = header(scope, b"content-type")
    if content_type is None:
        raise MalformedRequest(f"a POST needs Content-Type: {JSON}", 415)
    media, *params = (p.strip() for p in content_type.split(";"))
    if media.lower() != JSON:
        raise MalformedRequest(f"Content-Type must be {JSON}, got '{shown(media)}'", 415)
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() != "utf-8":
            raise MalformedRequest(
                f"the body must be UTF-8, got charset '{shown(value.strip())}'", 415
            )


def check_request(scope: Scope, body: bytes) -> dict[str, Any] | None:
    """The request object of a POST; a GET's parameters checked (None); MalformedRequest if malformed.

    Other methods, and a GET without a query (the GraphiQL page), are Strawberry's view's to answer.
    """
    method = scope.get("method")
    if method == "POST":
        _check_content_type(scope)
        return check_body(body)
    if method == "GET" and _runs_an_operation(scope):
        _check_query_string(scope)
    return None
