"""Token lookups arriving together are answered together: one SELECT per batch, not per request.

Every request with a token of api_tokens (each agent's heartbeats above all)
must find it there: nothing is cached, so a revoked token is refused from the
next request on. One statement per request was half of a heartbeat's service
CPU and a second statement of PostgreSQL's for every beat: 64 agents beating
with their own node tokens did 4,940 beats/s where the same beats with the
bootstrap token (compared in memory) did 10,196/s.

So, as for heartbeats (heartbeats.py), each process keeps one batch open: a
lookup that arrives while the previous batch is being read waits for the
next, which leaves as soon as the previous one is answered (no timer: a lone
request is looked up at once). The next batch's statement starts after every
lookup it carries arrived, so it sees every revocation committed before that
request came in, exactly as a statement of its own would.
"""

from __future__ import annotations

import asyncio
import weakref

from sqlalchemy.ext.asyncio import AsyncEngine

from service import connections, tokens
from service.tokens import TokenRecord

# Digests are 64 characters; a few hundred of them are one small array.
MAX_BATCH = 500


class TokenLookups:
    """One process's open batch of token lookups over one engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._waiting: dict[str, list[asyncio.Future[TokenRecord | None]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def find(self, secret: str) -> TokenRecord | None:
        """The live token with this secret, or None (unknown or revoked)."""
        future: asyncio.Future[TokenRecord | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tokens.digest(secret), []).append(future)
        if self._reader is None:
            self._reader = asyncio.create_task(self._read_batches())
        return await future

    async def _read_batches(self) -> None:
        try:
            while self._waiting:
                batch = self._take_batch()
                try:
                    async with connections.autocommit(self._engine) as conn:
                        found = await tokens.authenticate_many(conn, list(batch))
                except Exception as error:
                    for futures in batch.values():
                        for future in futures:
                            if not future.done():
                                future.set_exception(error)
                    continue
                for digest, futures in batch.items():
                    for future in futures:
                        if not future.done():  # its request was cancelled meanwhile
                            future.set_result(found.get(digest))
        finally:
            self._reader = None

    def _take_batch(self) -> dict[str, list[asyncio.Future[TokenRecord | None]]]:
        if len(self._waiting) <= MAX_BATCH:
            batch, self._waiting = self._waiting, {}
            return batch
        digests = list(self._waiting)[:MAX_BATCH]
        return {digest: self._waiting.pop(digest) for digest in digests}


_lookups: weakref.WeakKeyDictionary[AsyncEngine, TokenLookups] = weakref.WeakKeyDictionary()


async def find_token(engine: AsyncEngine, secret: str) -> TokenRecord | None:
    """The live token with this secret, looked up in this process's batch for `engine`."""
    lookups = _lookups.get(engine)
    if lookups is None:
        lookups = _lookups[engine] = TokenLookups(engine)
    return await lookups.find(secret)
