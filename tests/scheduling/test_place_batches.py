"""Concurrent place calls share transactions, and one call's failure costs no other its placement.

The failures are real database errors, raised by triggers made for the test:
one in the middle of a claim (the batch is rolled back, the claims before it
are made again alone, the ones after it by the next batch), and one at
COMMIT (the whole batch is rolled back, and every call in it is placed again
alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.metrics import render
from service.scheduling.allocations import Allocated
from service.scheduling.place_batches import COUNTS, PlaceQueue
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import Unplaceable
from service.scheduling.rejections import Rejection
from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.placing import hold
from tests.support.races import shard_uncommitted, until_blocked
from tests.support.reports import REGISTER, node_input
from tests.support.statements import StatementCounter
from tests.support.topology import bridged_pairs, no_nvlink
from tests.support.waiting import until


async def register(api: Api, *node_ids: str) -> None:
    for node_id in node_ids:
        await api(REGISTER, {"input": node_input(node_id)})


def request(replica_id: str, gpus: int = 1) -> PlaceRequest:
    return PlaceRequest(replica_id, "H100-80GB", gpus_per_shard=gpus)


async def stored_replicas(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT replica_id FROM shards ORDER BY replica_id"))
        return list(rows.scalars())


async def place_all(
    queue: PlaceQueue, replica_ids: Sequence[str]
) -> list[Allocated | Unplaceable | Rejection | BaseException]:
    return await asyncio.gather(
        *(queue.place(request(r), "test") for r in replica_ids), return_exceptions=True
    )


@pytest.fixture
async def poisoned(engine: AsyncEngine) -> AsyncIterator[None]:
    """Inserting a shard of replica `poison` fails at once, of `late-poison` at COMMIT."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                """
                CREATE FUNCTION test_poison() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.replica_id = TG_ARGV[0] THEN
                        RAISE EXCEPTION 'poisoned replica %', NEW.replica_id;
                    END IF;
                    RETURN NEW;
                END $$
                """
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER test_poison_now BEFORE INSERT ON shards"
                " FOR EACH ROW EXECUTE FUNCTION test_poison('poison')"
            )
        )
        await conn.execute(
            text(
                "CREATE CONSTRAINT TRIGGER test_poison_late AFTER INSERT ON shards"
                " DEFERRABLE INITIALLY DEFERRED"
                " FOR EACH ROW EXECUTE FUNCTION test_poison('late-poison')"
            )
        )
    try:
        yield
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("DROP TRIGGER test_poison_now ON shards"))
            await conn.execute(text("DROP TRIGGER test_poison_late ON shards"))
            await conn.execute(text("DROP FUNCTION test_poison()"))


async def test_concurrent_places_share_one_transaction(
    api: Api, engine: AsyncEngine, count_statements: StatementCounter
) -> None:
    await register(api, "gpu-01", "gpu-02")
    queue = PlaceQueue(engine, size=8, transactions=1)
    before = count_statements.transactions
    answers = await place_all(queue, [f"r{i}" for i in range(8)])
    assert all(isinstance(a, Allocated) for a in answers), answers
    # Eight claims, one transaction: they arrived together and it took them all.
    assert count_statements.transactions - before == 1
    held = [(s.node_id, s.gpu_indices) for a in answers for s in a.shards]  # type: ignore[union-attr]
    assert len(set(held)) == 8
    assert await inconsistencies(engine) == []


async def test_a_batch_never_holds_more_than_its_size(
    api: Api, engine: AsyncEngine, count_statements: StatementCounter
) -> None:
    await register(api, "gpu-01", "gpu-02")
    queue = PlaceQueue(engine, size=3, transactions=1)
    before = count_statements.transactions
    answers = await place_all(queue, [f"r{i}" for i in range(7)])
    assert all(isinstance(a, Allocated) for a in answers), answers
    assert count_statements.transactions - before == 3  # 3 + 3 + 1
    assert len(await stored_replicas(engine)) == 7


async def test_a_place_that_must_wait_or_fails_runs_alone_and_says_why(
    api: Api, engine: AsyncEngine
) -> None:
    # Room for one 8-GPU replica: the second call finds no room, which only a
    # transaction of its own may say (the batch never waits and never judges).
    await register(api, "gpu-01")
    queue = PlaceQueue(engine, size=8, transactions=1)
    alone = COUNTS.alone.get("waits", 0)
    answers = await asyncio.gather(
        queue.place(request("big-1", gpus=8), None), queue.place(request("big-2", gpus=8), None)
    )
    assert [type(a) for a in answers] == [Allocated, Unplaceable]
    assert COUNTS.alone.get("waits", 0) == alone + 1
    assert await stored_replicas(engine) == ["big-1"]


@pytest.mark.usefixtures("poisoned")
async def test_a_claim_that_fails_in_a_batch_costs_the_others_nothing(
    api: Api, engine: AsyncEngine
) -> None:
    await register(api, "gpu-01", "gpu-02")
    queue = PlaceQueue(engine, size=8, transactions=1)
    errors, abandoned = COUNTS.alone.get("error", 0), COUNTS.alone.get("abandoned", 0)
    # Three shapes, so three groups in this order: [a], [b, poison, c], [d].
    answers = await asyncio.gather(
        queue.place(request("a", gpus=2), None),
        *(queue.place(request(r), None) for r in ("b", "poison", "c")),
        queue.place(request("d", gpus=3), None),
        return_exceptions=True,
    )
    # The poisoned call gets its own error, from its own transaction...
    assert isinstance(answers[2], asyncpg.RaiseError), answers[2]
    assert "poisoned replica poison" in str(answers[2])
    # ...and the others are all placed, each GPU once: a (placed before it,
    # rolled back with the batch) and b and c (its group) made again alone,
    # d (not tried) by the next batch.
    assert [type(a) for i, a in enumerate(answers) if i != 2] == [Allocated] * 4
    assert await stored_replicas(engine) == ["a", "b", "c", "d"]
    assert COUNTS.alone.get("error", 0) == errors + 3
    assert COUNTS.alone.get("abandoned", 0) == abandoned + 1
    assert await inconsistencies(engine) == []


@pytest.mark.usefixtures("poisoned")
async def test_a_batch_whose_commit_fails_is_placed_again_call_by_call(
    api: Api, engine: AsyncEngine
) -> None:
    await register(api, "gpu-01", "gpu-02")
    queue = PlaceQueue(engine, size=8, transactions=1)
    commits = COUNTS.alone.get("commit", 0)
    answers = await place_all(queue, ["a", "late-poison", "b", "c"])
    assert isinstance(answers[1], asyncpg.RaiseError), answers[1]
    assert [type(a) for i, a in enumerate(answers) if i != 1] == [Allocated] * 3
    # Nothing of the failed batch was kept, and each call was placed once.
    assert await stored_replicas(engine) == ["a", "b", "c"]
    assert COUNTS.alone.get("commit", 0) == commits + 4
    assert await inconsistencies(engine) == []
    exposition = await render(None)
    assert f'inventory_place_alone_total{{reason="commit"}} {commits + 4}' in exposition


async def test_calls_of_one_shape_fill_the_smallest_holes_as_one_by_one_would(
    api: Api, engine: AsyncEngine, count_statements: StatementCounter
) -> None:
    await register(api, "roomy", "half", "nearly-full")
    await hold(api, "half", 4)
    await hold(api, "nearly-full", 6)
    queue = PlaceQueue(engine, size=8, transactions=1)
    count_statements.statements.clear()
    answers = await place_all(queue, ["r1", "r2", "r3", "r4"])
    where = [(s.node_id, s.gpu_indices) for a in answers for s in a.shards]  # type: ignore[union-attr]
    assert where == [
        ("nearly-full", (6,)),
        ("nearly-full", (7,)),
        ("half", (4,)),
        ("half", (5,)),
    ]
    # One pick for the four calls, then one claim for all four.
    sent = [s for s in count_statements.statements if "pg_notify" not in s]
    assert len(sent) == 2, sent
    assert "FOR NO KEY UPDATE" in sent[0]
    assert "INSERT INTO shards" in sent[1]


async def test_a_retried_call_in_a_group_answers_what_is_stored(
    api: Api, engine: AsyncEngine
) -> None:
    await register(api, "gpu-01")
    queue = PlaceQueue(engine, size=8, transactions=1)
    first = await queue.place(request("r1"), None)
    again = await place_all(queue, ["r2", "r1", "r3"])
    assert again[1] == first
    assert all(isinstance(a, Allocated) for a in again)
    assert await stored_replicas(engine) == ["r1", "r2", "r3"]
    assert await inconsistencies(engine) == []


async def test_more_calls_than_room_place_what_fits_and_say_no_room_for_the_rest(
    api: Api, engine: AsyncEngine
) -> None:
    await register(api, "gpu-01")
    queue = PlaceQueue(engine, size=16, transactions=1)
    answers = await place_all(queue, [f"r{i}" for i in range(10)])
    assert [type(a) for a in answers].count(Allocated) == 8
    assert [type(a) for a in answers].count(Unplaceable) == 2
    assert await inconsistencies(engine) == []


async def test_nvlink_calls_placed_together_each_get_one_group(
    api: Api, engine: AsyncEngine
) -> None:
    # Pairs {0,1}..{6,7} with GPU 0 busy: three whole pairs are left. A node
    # without NVLink groups ranks first (fewer free GPUs) but fits none.
    await api(REGISTER, {"input": node_input("pairs", gpus=bridged_pairs())})
    await api(REGISTER, {"input": node_input("flat", gpus=no_nvlink())})
    await hold(api, "pairs", 1)
    await hold(api, "flat", 4)
    queue = PlaceQueue(engine, size=8, transactions=1)
    nvlink = PlaceRequest("", "H100-80GB", gpus_per_shard=2, nvlink_shards=True)
    answers = await asyncio.gather(
        *(queue.place(replace(nvlink, replica_id=f"tp{i}"), None) for i in range(4))
    )
    placed = sorted(s.gpu_indices for a in answers if isinstance(a, Allocated) for s in a.shards)
    assert placed == [(2, 3), (4, 5), (6, 7)]
    assert [type(a) for a in answers].count(Unplaceable) == 1
    assert await inconsistencies(engine) == []


async def test_calls_arriving_while_a_batch_places_wait_for_the_next_one_until_a_full_batch_waits(
    api: Api, engine: AsyncEngine
) -> None:
    await register(api, "gpu-01", "gpu-02")
    queue = PlaceQueue(engine, size=3, transactions=4)
    # Another process placing replica r0 at this moment, uncommitted: the
    # batch that claims r0 waits for it inside its claim statement.
    async with shard_uncommitted(engine, "r0-s0", "gpu-02", 7, holding=False) as (pid, tx):
        first = asyncio.ensure_future(queue.place(request("r0"), None))
        await until_blocked(engine, pid, first)
        # Two more calls: fewer than a batch, so they wait for the running one...
        waiting = [asyncio.ensure_future(queue.place(request(r), None)) for r in ("r1", "r2")]

        async def queued() -> bool:
            return (queue.running, len(queue.waiting)) == (1, 2)

        await until(queued, "r1 and r2 to wait behind the running batch")
        # ...and a third makes a full batch, which gets a transaction of its own.
        waiting.append(asyncio.ensure_future(queue.place(request("r3"), None)))
        done, _ = await asyncio.wait(waiting, timeout=10)
        assert done == set(waiting)
        assert queue.running == 1
        await tx.rollback()
    await first
    assert await stored_replicas(engine) == ["r0", "r1", "r2", "r3"]
    assert await inconsistencies(engine) == []
