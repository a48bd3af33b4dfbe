"""What a client sees of a failure it did not cause.

Validation errors and InventoryErrors are written for the caller and pass
unchanged. Anything else is either an expected outcome that no resolver
raised as one, or a bug:

- the database unreachable (code DATABASE_UNAVAILABLE: retry shortly);
- a statement PostgreSQL cancelled at its statement_timeout, as a loaded
  server does (code REQUEST_TIMEOUT, the time limit's: retry shortly);
- a text PostgreSQL cannot store (BAD_INPUT; the input boundary refuses such
  texts first, service/graphql/input_values.py);

each answered with its code and one log line for the request, no traceback
(`expected_outcome`, `log_expected`). Anything else is a bug: logged with
the traceback and the request id, and answered as "internal error" with only
that id, so a client never sees a stack trace or SQL but an operator can find
the log line.
"""

from __future__ import annotations

import logging

from graphql import GraphQLError
from strawberry.extensions import MaskErrors

from service.database.db_faults import (
    DatabaseUnavailable,
    StatementTimedOut,
    is_database_unavailable,
    is_statement_timeout,
)
from service.database.transactions import sqlstate
from service.errors import InventoryError

from .request_errors import code_of, give_code

log = logging.getLogger(__name__)

INTERNAL_ERROR = "internal error"
# character_not_in_repertoire, untranslatable_character
UNSTORABLE_TEXT = {"22021", "22P05"}


class UnstorableText(InventoryError):
    code = "BAD_INPUT"

    def __init__(self) -> None:
        super().__init__(
            "a text argument contains a NUL character, which cannot be stored or compared"
        )


def expected_outcome(original: BaseException | None) -> InventoryError | None:
    """The answer of a failure that is an expected outcome, though raised as something else."""
    if original is None or isinstance(original, GraphQLError):
        return None
    if is_database_unavailable(original):
        return DatabaseUnavailable()
    if is_statement_timeout(original):
        return StatementTimedOut()
    if sqlstate(original) in UNSTORABLE_TEXT:
        # A NUL (or undecodable) character in any argument that reaches
        # SQL: refused by PostgreSQL, whichever resolver passed it on.
        return UnstorableText()
    return None


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
    An expected outcome was logged with its request's other errors (log_expected).
    """
    outcome = expected_outcome(error.original_error)
    if outcome is not None:
        message, extensions = outcome.message, outcome.extensions
    else:
        log.error(
            "unexpected error at %s (request %s)",
            error.path,
            request_id,
            exc_info=error.original_error,
        )
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
    """One line for a request's expected errors: its code and first message, no traceback.

    A refused request is an answer, not an incident: before this every
    BAD_INPUT, FORBIDDEN or NODE_NOT_FOUND was logged at ERROR with a full
    traceback (15,513 tracebacks in one fuzzing run of 2,098 requests). INFO
    for a caller's own mistake; WARNING for the database's outcomes
    (unavailable, a statement timed out), however many fields met them (a
    DataLoader's failure reaches each field it serves). Unexpected errors are
    logged once, with their traceback, by `masked`. The request id is added
    by the log handler (service/web/logs.py).
    """
    refused = [give_code(e) for e in errors if not is_unexpected(e)]
    outcomes = [
        (e, outcome)
        for e in errors
        if is_unexpected(e) and (outcome := expected_outcome(e.original_error)) is not None
    ]
    if refused:
        _log_one(logging.INFO, "refused", refused[0], code_of(refused[0]) or "ERROR",
                 refused[0].message, len(refused))  # fmt: skip
    if outcomes:
        error, outcome = outcomes[0]
        cause = str(error.original_error).splitlines()[0] if str(error.original_error) else ""
        _log_one(logging.WARNING, "database outcome", error, outcome.code,
                 f"{outcome.message} ({cause})", len(outcomes))  # fmt: skip


def log_expected_outcome(outcome: InventoryError, where: str, cause: BaseException) -> None:
    """The one line of an expected outcome met outside graphql-core (the fast path's routes)."""
    first = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    log.warning("database outcome in %s: %s %s (%s)", where, outcome.code, outcome.message,
                first, extra={"code": outcome.code})  # fmt: skip


def _log_one(level: int, what: str, first: GraphQLError, code: str, said: str, count: int) -> None:
    more = f" (and {count - 1} more)" if count > 1 else ""
    where = f" at {'.'.join(map(str, first.path))}" if first.path else ""
    log.log(level, "%s%s: %s %s%s", what, where, code, said, more, extra={"code": code})


class MaskUnexpected(MaskErrors):
    """Strawberry's route: every error passes through anonymise_error, as mask_unexpected's do."""

    def __init__(self) -> None:
        super().__init__(should_mask_error=lambda error: True, error_message=INTERNAL_ERROR)

    def anonymise_error(self, error: GraphQLError) -> GraphQLError:
        request_id = getattr(self.execution_context.context, "request_id", None)
        return mask_unexpected([error], request_id)[0]
