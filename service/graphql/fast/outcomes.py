"""What a fast route does with a request: answers it, or declines it with a reason.

A route never answers None. Its reason is a label of
inventory_fast_path_requests_total (service/metrics.py), so reasons are
fixed words, never values taken from the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from service.graphql.context import Context


@dataclass(frozen=True)
class Answered:
    body: bytes
    # How, when it is worth counting apart (the variables coerced by
    # graphql-core rather than the compiled plan, say); usually "".
    reason: str = ""


@dataclass(frozen=True)
class Declined:
    reason: str


Outcome = Answered | Declined


# json.dumps with any argument builds a new encoder per call.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def encode(body: dict[str, Any]) -> bytes:
    """A response body as the routes send it: compact JSON, as Strawberry's view writes it."""
    return _COMPACT.encode(body).encode()


class CompiledRoute(Protocol):
    """A route compiled for one operation of a prepared document."""

    async def run(self, variables: dict[str, Any] | None, context: Context) -> Outcome: ...
