"""A convoy is split in two; requests arriving while a batch is out keep batches whole.

service/batches.py: clients in a closed loop can all end up in one batch, and
the process then idles while PostgreSQL answers it. A batch during which
nothing arrived (at least SPLIT_AT of them, and not itself a split) makes the next one carry
the earlier half of what waits; the rest leaves right after it. Against the
real database; a batch is held out (its answer waits on an event) for as long
as a test needs requests to arrive meanwhile, never for a guessed time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from service.batches import SPLIT_AT, Batches
from service.database import connections
from service.database.connections import NativeConnection, cached_text
from tests.support.waiting import until

ECHO = cached_text("SELECT k FROM unnest(CAST(:keys AS text[])) AS k")


class Recorded:
    """Batches over the engine's pool whose batches are recorded as they leave."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.sent: list[list[str]] = []
        # Set: each batch stays out until it is released.
        self.hold: asyncio.Event | None = None
        self.batches: Batches[NativeConnection, str, str] = Batches(
            lambda: connections.autocommit(engine), self._answer, LookupError, max_batch=500
        )

    async def _answer(self, conn: NativeConnection, keys: Sequence[str]) -> dict[str, str]:
        self.sent.append(list(keys))
        if self.hold is not None:
            await self.hold.wait()
        rows = await conn.execute(ECHO, {"keys": list(keys)})
        return {row[0]: row[0] for row in rows}

    async def ask_together(self, keys: list[str]) -> list[str]:
        return list(await asyncio.gather(*(self.batches.ask(k) for k in keys)))


def keys(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i:02d}" for i in range(n)]


async def test_a_closed_loop_round_after_a_quiet_batch_is_sent_as_two_halves(
    engine: AsyncEngine,
) -> None:
    recorded = Recorded(engine)

    # 16 clients, each asking again once answered: the first round goes whole
    # (nothing known yet), and nothing arrives while it is out.
    assert await recorded.ask_together(keys("a", 16)) == keys("a", 16)
    assert recorded.sent == [keys("a", 16)]

    # The next round: the earlier half first, the rest right after it, whole
    # (a split's second half is not split again).
    assert await recorded.ask_together(keys("b", 16)) == keys("b", 16)
    assert recorded.sent[1:] == [keys("b", 8), keys("b", 16)[8:]]

    # Fewer than SPLIT_AT waiting: taken whole even after a quiet batch.
    few = keys("c", SPLIT_AT - 1)
    assert await recorded.ask_together(few) == few
    assert recorded.sent[3:] == [few]

    # And a quiet batch that small is no convoy: the next round goes whole.
    assert await recorded.ask_together(keys("d", 16)) == keys("d", 16)
    assert recorded.sent[4:] == [keys("d", 16)]


async def test_requests_arriving_while_a_batch_is_out_keep_the_next_batch_whole(
    engine: AsyncEngine,
) -> None:
    recorded = Recorded(engine)
    recorded.hold = asyncio.Event()
    first = [recorded.batches.ask(k) for k in keys("a", 16)]

    async def first_batch_out() -> bool:
        return len(recorded.sent) == 1

    await until(first_batch_out, "the first batch to be out")
    late = [recorded.batches.ask(k) for k in keys("late", 16)]  # while it is out
    recorded.hold.set()
    recorded.hold = None

    assert (await asyncio.gather(*first), await asyncio.gather(*late)) == (
        keys("a", 16),
        keys("late", 16),
    )
    # The late 16 arrived while the first batch was out: one batch, whole.
    assert recorded.sent == [keys("a", 16), keys("late", 16)]

    # Nothing arrived while the late batch was out: the next round is split.
    await recorded.ask_together(keys("b", 16))
    assert recorded.sent[2:] == [keys("b", 8), keys("b", 16)[8:]]
