"""What a fast route does with a request: answers it, or declines it with a reason.

A route never answers None. Its reason is a label of
inventory_fast_path_requests_total (service/metrics.py), so reasons are
fixed words, never values taken from the request.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from service.database.db_faults import is_database_unavailable, is_statement_timeout
from service.database.read_routing import replica_failure
from service.database.transactions import sqlstate
from service.errors import InventoryError
from service.graphql.masking import UNSTORABLE_TEXT

from .fast_request import FastRequest
from .hand_over import HandedOver

T = TypeVar("T")


# Not frozen: a frozen dataclass sets each field through object.__setattr__,
# and every request the fast path answers makes one.
@dataclass(slots=True)
class Answered:
    body: bytes
    # How, when it is worth counting apart (the variables coerced by
    # graphql-core rather than the compiled plan, say); usually "".
    reason: str = ""


@dataclass(slots=True)
class Declined:
    reason: str
    # A write the route made before declining, for graphql-core's run of the
    # same document to answer from instead of writing again (hand_over.py).
    handed_over: HandedOver | None = None


Outcome = Answered | Declined


# json.dumps with any argument builds a new encoder per call.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


async def compiled_read(read: Callable[[], Awaitable[T]]) -> T | Declined:
    """A compiled read's value, or a decline for what graphql-core must word; a bug raises.

    Declined, graphql-core runs the read again and answers as it would
    (reading twice writes nothing): an InventoryError (the resolver's words),
    the database down, a statement it cancelled at its statement_timeout, a
    text it cannot store (a NUL in an id: masking.py's words).
    """
    try:
        return await read()
    except InventoryError:
        return Declined("refused")
    except Exception as error:
        if is_database_unavailable(error):
            return Declined("database_unavailable")
        if is_statement_timeout(error):
            # graphql-core reads again, and answers REQUEST_TIMEOUT if that
            # times out too (masking.py), as Strawberry's view would.
            return Declined("statement_timeout")
        if replica_failure(error):
            # Cancelled on a read replica by a conflict with recovery: graphql-core's
            # read falls back to the primary (service/database/read_routing.py).
            return Declined("replica_failed")
        if sqlstate(error) in UNSTORABLE_TEXT:
            return Declined("text_not_storable")
        raise


def encode(body: dict[str, Any]) -> bytes:
    """A response body as the routes send it: compact JSON, as Strawberry's view writes it."""
    return _COMPACT.encode(body).encode()


class CompiledRoute(Protocol):
    """A route compiled for one operation of a prepared document.

    The front door runs it in two steps with the gate between them
    (front_door.py): `arguments` are the root field's arguments as its
    resolver would receive them (Python names, Strawberry's conversion), which
    the gate checks; `run` answers with them. A route has no step of its own
    before the gate, so none can skip it.
    """

    def arguments(self, variables: dict[str, Any] | None) -> dict[str, Any] | Declined: ...

    async def run(self, arguments: dict[str, Any], request: FastRequest) -> Outcome: ...
