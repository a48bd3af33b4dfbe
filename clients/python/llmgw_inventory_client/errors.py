"""What the service refused, or could not answer, as exceptions a scheduler can catch by kind.

Each carries the service's `code` (its `extensions.code`, stable) and
`message` (a sentence a person can act on), the whole `extensions`, the HTTP
status, and the Retry-After the answer came with. The kinds follow the codes
of docs/scheduler/errors.md; a code this client does not know is an
InventoryError with that code, so a newer service never breaks an older
client. An expected answer (Unplaceable, AllocationRejected) is a result, not
one of these.
"""

from __future__ import annotations

from typing import Any


class InventoryError(Exception):
    """The service refused the call, or it could not be answered."""

    def __init__(
        self,
        message: str,
        code: str | None = None,
        *,
        extensions: dict[str, Any] | None = None,
        status: int | None = None,
        retry_after: float | None = None,
        errors: list[dict[str, Any]] | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{message} [{code}]" if code else message)
        self.message = message
        self.code = code
        self.extensions = extensions or {}
        self.status = status
        # Seconds the service asked to wait before trying again (its Retry-After).
        self.retry_after = retry_after
        # Every error of the answer (the first one is this one), and its data if any.
        self.errors = errors or []
        self.data = data

    @property
    def request_id(self) -> str | None:
        """The id the service logged the request under (its X-Request-Id), when it said."""
        value = self.extensions.get("requestId")
        return value if isinstance(value, str) else None


class BadInput(InventoryError):
    """A value the service refuses (BAD_INPUT): `field` names it, `value` is what was sent."""

    @property
    def field(self) -> str | None:
        value = self.extensions.get("field")
        return value if isinstance(value, str) else None

    @property
    def value(self) -> Any:
        return self.extensions.get("value")


class InvalidRequest(InventoryError):
    """The document itself was refused (GRAPHQL_VALIDATION_FAILED, GRAPHQL_PARSE_FAILED,
    BAD_REQUEST...): a client generated from another schema than the service runs."""


class Conflict(InventoryError):
    """CONFLICT: the state changed under the call (a generation that is not current, a
    replica id released while it held nothing, a group placed with another input).
    Nothing was written; read again before deciding."""

    @property
    def current_generation(self) -> int | None:
        value = self.extensions.get("currentGeneration")
        return value if isinstance(value, int) else None

    @property
    def tombstone_until(self) -> str | None:
        """For a replica id released while it held nothing: until when it is refused."""
        value = self.extensions.get("tombstoneUntil")
        return value if isinstance(value, str) else None


class Unauthenticated(InventoryError):
    """UNAUTHENTICATED (HTTP 401): no token, or one the service does not accept."""


class Forbidden(InventoryError):
    """FORBIDDEN: the token's role may not do this (a reader placing, say)."""


class NodeNotFound(InventoryError):
    """NODE_NOT_FOUND: no node has that id."""


class PageTruncated(InventoryError):
    """PAGE_TRUNCATED: a list asked without `first` had more entries than one page.

    The client's list methods page by themselves when `first` is not given;
    this is raised only for a page asked another way."""


class Unavailable(InventoryError):
    """The call could not be served now, and may be tried again: the service was not
    reached, or it says so (REQUEST_TIMEOUT, HTTP 502/503/504)."""


class DatabaseUnavailable(Unavailable):
    """DATABASE_UNAVAILABLE: PostgreSQL is away (restarting, failing over). Nothing was
    written unless `outcome` is "unknown" (the connection failed during the commit of a
    call whose second run would answer otherwise: read it back before trying again)."""

    @property
    def outcome(self) -> str | None:
        value = self.extensions.get("outcome")
        return value if isinstance(value, str) else None


class DeadlineExceeded(InventoryError):
    """The call's timeout ran out. From the service (DEADLINE_EXCEEDED): the write could
    not commit before the X-Client-Timeout the client sent, and was rolled back. From
    the client (code None): no try could be sent, or none was answered, in the time
    left; with X-Client-Timeout sent, nothing commits after it either."""


class InternalError(InventoryError):
    """INTERNAL_ERROR: a bug in the service, logged there under `request_id`."""


# The service's codes (docs/scheduler/errors.md) -> the kind raised.
KINDS: dict[str, type[InventoryError]] = {
    "BAD_INPUT": BadInput,
    "GRAPHQL_PARSE_FAILED": InvalidRequest,
    "GRAPHQL_VALIDATION_FAILED": InvalidRequest,
    "BAD_REQUEST": InvalidRequest,
    "UNSUPPORTED_MEDIA_TYPE": InvalidRequest,
    "METHOD_NOT_ALLOWED": InvalidRequest,
    "NOT_ACCEPTABLE": InvalidRequest,
    "BODY_TOO_LARGE": InvalidRequest,
    "CONFLICT": Conflict,
    "UNAUTHENTICATED": Unauthenticated,
    "FORBIDDEN": Forbidden,
    "NODE_NOT_FOUND": NodeNotFound,
    "PAGE_TRUNCATED": PageTruncated,
    "DATABASE_UNAVAILABLE": DatabaseUnavailable,
    "REQUEST_TIMEOUT": Unavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "INTERNAL_ERROR": InternalError,
}

# Without a code (a proxy's page, an empty body): the kind by HTTP status.
_BY_STATUS: dict[int, type[InventoryError]] = {
    401: Unauthenticated,
    403: Forbidden,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
}


def from_answer(
    errors: list[dict[str, Any]],
    *,
    status: int,
    retry_after: float | None,
    data: dict[str, Any] | None,
) -> InventoryError:
    """The exception for a GraphQL answer's errors (the first decides the kind)."""
    first = errors[0] if errors and isinstance(errors[0], dict) else {}
    message = str(first.get("message") or f"HTTP {status} with an error without a message")
    extensions = first.get("extensions")
    if not isinstance(extensions, dict):
        extensions = {}
    code = extensions.get("code")
    code = code if isinstance(code, str) else None
    kind = KINDS.get(code or "") or _BY_STATUS.get(status) or InventoryError
    return kind(
        message,
        code,
        extensions=extensions,
        status=status,
        retry_after=retry_after,
        errors=errors,
        data=data,
    )


def without_graphql(status: int, url: str, retry_after: float | None, text: str) -> InventoryError:
    """The exception for an answer that is not GraphQL (a proxy's error page, a wrong URL)."""
    shown = " ".join(text.split())[:200]
    hint = "" if url.rstrip("/").endswith("/graphql") else " (the service's endpoint is /graphql)"
    kind = _BY_STATUS.get(status, InventoryError)
    return kind(
        f"{url} answered HTTP {status} without a GraphQL response{hint}: {shown or 'empty body'}",
        status=status,
        retry_after=retry_after,
    )
