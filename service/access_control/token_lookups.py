"""Token lookups arriving together are answered together: one SELECT per batch, not per request.

Every request with a token of api_tokens (each agent's heartbeats above all)
must find it there: nothing is cached, so a revoked token is refused from the
next request on. One statement per request would make every beat pay a
second round trip and a second statement of PostgreSQL's, the largest share
of a heartbeat's cost (the figures are in the commit that introduced this).

So, as for heartbeats, each process keeps one batch open (service/batches.py):
a lookup that arrives while the previous batch is being read waits for the
next. The next batch's statement starts after every lookup it carries
arrived, so it sees every revocation committed before that request came in,
exactly as a statement of its own would.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable

from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import tokens
from service.access_control.tokens import TokenRecord
from service.batches import Batches
from service.database import connections
from service.database.connections import NativeConnection

# Digests are 64 characters; a few hundred of them are one small array.
MAX_BATCH = 500


class TokenLookups:
    """One process's open batch of token lookups over one engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._batches: Batches[NativeConnection, str, TokenRecord | None] = Batches(
            lambda: connections.autocommit(engine), tokens.find_by_digests, _unknown, MAX_BATCH
        )

    def find(self, secret: str) -> Awaitable[TokenRecord | None]:
        """The token with this secret, whatever its status (None: unknown).

        Its status is the database's verdict when the batch was read, so a
        revocation or an expiry before this request arrived is seen.
        """
        return self._batches.ask(tokens.digest(secret))


def _unknown(digest: str) -> None:
    return None


_lookups: weakref.WeakKeyDictionary[AsyncEngine, TokenLookups] = weakref.WeakKeyDictionary()


def find_token(engine: AsyncEngine, secret: str) -> Awaitable[TokenRecord | None]:
    """The token with this secret (any status), looked up in this process's batch for `engine`.

    Await it: the batch's future, not a coroutine around it (service/batches.py).
    """
    lookups = _lookups.get(engine)
    if lookups is None:
        lookups = _lookups[engine] = TokenLookups(engine)
    return lookups.find(secret)
