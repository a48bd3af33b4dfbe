"""What one request asks of the database and learns from it, for every connection the request opens.

The web layer begins one per HTTP request (service/web/request_cycle.py) and
fills in its time limits; the database layer reads them where every write
passes (transactions.py, connections.py) and notes what happened (the
database unavailable, hence Retry-After). Kept in a context variable so that
no domain function has to carry it: a resolver's tasks inherit it, and code
that runs outside a request (the liveness sweep, the event stream) sees none
and is bounded by nothing but its own settings.

The state itself is a mutable object: graphql-core runs a query's root fields
in tasks of their own, which get a copy of the context, so a note made there
must land in the object the request's own task holds, not in a variable set
in the copy.
"""

from __future__ import annotations

from contextvars import Context, ContextVar, Token, copy_context
from dataclasses import dataclass, field
from typing import Any

from service.errors import InventoryError


@dataclass(frozen=True, slots=True)
class ClientDeadline:
    """When the client stops waiting for its answer: `at` on the event loop's clock (loop.time()).

    `timeout`: the seconds it said it waits, counted from its request's
    arrival (the web layer reads them from a header), for messages.
    """

    at: float
    timeout: float


class DeadlinePassed(InventoryError):
    """A write that would have committed after its client stopped waiting: rolled back, nothing written."""

    code = "DEADLINE_EXCEEDED"

    def __init__(self, deadline: ClientDeadline, where: str) -> None:
        super().__init__(
            f"the client's deadline ({deadline.timeout:g} s after its request arrived) passed "
            "before this write could commit: rolled back, nothing was written"
        )
        self.where = where
        self.timeout = deadline.timeout
        DEADLINES.count(where)

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "timeoutSeconds": self.timeout}


@dataclass
class DeadlineCounts:
    """Writes rolled back because their client's deadline passed, by where it was found (/metrics).

    before_begin (nothing sent), statement (a statement ran into the bounded
    statement_timeout), before_commit (checked last, in the service), at_commit
    (the server's own check, sent with COMMIT: the server was paused or slow).
    """

    by_where: dict[str, int] = field(default_factory=dict)

    def count(self, where: str) -> None:
        self.by_where[where] = self.by_where.get(where, 0) + 1


DEADLINES = DeadlineCounts()


@dataclass(slots=True)
class RequestState:
    # When the service stops the request (INVENTORY_REQUEST_TIMEOUT), on the
    # event loop's clock (loop.time()): retries end before it.
    limit_at: float | None = None
    # When the client stops waiting (it said so), if it did: no write of the
    # request commits after it (connections.py).
    client_deadline: ClientDeadline | None = None
    # Some database call of this request found the database unavailable, or
    # ran into its statement_timeout: its answer says when to come back
    # (Retry-After).
    unavailable: bool = False
    # Everything the request asks tolerates a stale answer (the GraphQL layer
    # says so per operation: service/graphql/read_routes.py): its reads may go
    # to a read replica (read_routing.py). False: the primary.
    replica_allowed: bool = False
    # Where its routed reads went ("replica" or "primary"; None: none was
    # routed) and how far behind at most, in seconds: the stalest of them
    # (the answer's extensions.readFrom).
    read_from: str | None = None
    read_lag: float = 0.0

    def note_read(self, source: str, lag: float) -> None:
        """A routed read went to `source`, at most `lag` seconds behind; the answer says the stalest."""
        if (
            self.read_from is None
            or lag > self.read_lag
            or (source == "replica" and self.read_from != "replica")
        ):
            self.read_from = source
            self.read_lag = lag


_current: ContextVar[RequestState | None] = ContextVar("llmgw_request_state", default=None)


def current() -> RequestState | None:
    """The running request's state; None outside a request."""
    return _current.get()


def begin() -> tuple[RequestState, Token[RequestState | None]]:
    """A new state for the request the current task runs; end(token) when it is answered."""
    state = RequestState()
    return state, _current.set(state)


def end(token: Token[RequestState | None]) -> None:
    _current.reset(token)


def without_request() -> Context:
    """The running context without the request's state, for a task that serves several requests.

    A place batch carries many requests, each with its own deadline, none of
    them its own. Everything else of the context stays (the trace the batch's
    statements belong to, the request id its log lines carry): an empty
    Context would drop those too, and the statements would trace nowhere.
    """
    context = copy_context()
    context.run(_current.set, None)
    return context


def note_unavailable() -> None:
    """The database could not serve part of the running request, for now (nothing outside one)."""
    state = _current.get()
    if state is not None:
        state.unavailable = True
