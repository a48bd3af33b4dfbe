"""What a client sees of a failure it did not cause.

Validation errors and InventoryErrors are written for the caller and pass
unchanged. Anything else is either the database being unreachable, which is
said plainly (code DATABASE_UNAVAILABLE: retry shortly), or a bug: logged with
the traceback and the request id, and answered as "internal error" with only
that id, so a client never sees a stack trace or SQL but an operator can find
the log line.
"""

from __future__ import annotations

import logging

from graphql import GraphQLError
from strawberry.extensions import MaskErrors

from service.database.db_faults import DatabaseUnavailable, is_database_unavailable
from service.database.transactions import sqlstate
from service.errors import InventoryError

from .request_errors import code_of, give_code

log = logging.getLogger(__name__)

INTERNAL_ERROR = "internal error"
# character_not_in_repertoire, untranslatable_character
UNSTORABLE_TEXT = {"22021", "22P05"}


def is_unexpected(error: GraphQLError) -> bool:
    """Mask only bugs and outages: validation errors and InventoryErrors are for the caller.

    An error without a path did not come from a resolver: it is the parser's,
    the validator's or a scalar's refusal of the request's own values (e.g.
    "Expected value of type 'Bytes', but encountered error 'Bytes must be
    between 0 and 2^63-1, got -60'"), which the caller needs to read.
    """
    original = error.original_error
    if original is None or isinstance(original, (GraphQLError, InventoryError)):
        return False
    return error.path is not None


def masked(error: GraphQLError, request_id: str | None) -> GraphQLError:
    """What the client sees of an unexpected error: a sentence and a code, never the cause.

    Used by MaskUnexpected on Strawberry's path and by the direct path
    (service/graphql/fast/direct.py), so both answer a failure in the same words.
    """
    original = error.original_error
    if is_database_unavailable(original):
        log.warning("database unavailable at %s: %s", error.path, original)
        unavailable = DatabaseUnavailable()
        message, extensions = unavailable.message, unavailable.extensions
    elif original is not None and sqlstate(original) in UNSTORABLE_TEXT:
        # A NUL (or undecodable) character in any argument that reaches
        # SQL: refused by PostgreSQL, whichever resolver passed it on.
        message = "a text argument contains a NUL character, which cannot be stored or compared"
        extensions = {"code": "BAD_INPUT"}
    else:
        log.error("unexpected error at %s (request %s)", error.path, request_id, exc_info=original)
        message, extensions = INTERNAL_ERROR, {"code": "INTERNAL_ERROR"}
    return GraphQLError(
        message=message,
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        original_error=None,
        extensions={**extensions, "requestId": request_id},
    )


def mask_unexpected(errors: list[GraphQLError], request_id: str | None) -> list[GraphQLError]:
    """What the client sees of a result's errors, on either route: bugs masked, the rest coded."""
    return [masked(e, request_id) if is_unexpected(e) else give_code(e) for e in errors]


def log_expected(errors: list[GraphQLError]) -> None:
    """One INFO line for a request's expected errors: its code and first message, no traceback.

    A refused request is an answer, not an incident: before this every
    BAD_INPUT, FORBIDDEN or NODE_NOT_FOUND was logged at ERROR with a full
    traceback (15,513 tracebacks in one fuzzing run of 2,098 requests).
    Unexpected errors are logged once, with their traceback, by `masked`.
    The request id is added by the log handler (service/web/logs.py).
    """
    expected = [give_code(e) for e in errors if not is_unexpected(e)]
    if not expected:
        return
    first = expected[0]
    code = code_of(first) or "ERROR"
    more = f" (and {len(expected) - 1} more)" if len(expected) > 1 else ""
    where = f" at {'.'.join(map(str, first.path))}" if first.path else ""
    log.info("refused%s: %s %s%s", where, code, first.message, more, extra={"code": code})


class MaskUnexpected(MaskErrors):
    """Strawberry's route: every error passes through anonymise_error, as mask_unexpected's do."""

    def __init__(self) -> None:
        super().__init__(should_mask_error=lambda error: True, error_message=INTERNAL_ERROR)

    def anonymise_error(self, error: GraphQLError) -> GraphQLError:
        request_id = getattr(self.execution_context.context, "request_id", None)
        return mask_unexpected([error], request_id)[0]
