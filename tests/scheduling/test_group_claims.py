"""One claim statement for a group of same-shape place calls: each call holds what it alone would have.

place_batches hands the calls of one shape in a batch to
placement.place_several_without_waiting, which locks their nodes with one
statement and claims them all with one more (topology_fit.claim_wanted over
allocations.store_statement). These stories check that statement against
the claims made one call at a time, each counting the node afresh after the
ones before (what the batches did before, and what a lone call does), on the
same database: the same GPUs, shards, adapters and events, call by call; and
that a call the statement could not finish (a GPU or a shard id that another
transaction took meanwhile) leaves nothing behind and is made again alone.
The one-call claim itself is pinned GPU by GPU by test_place.py and
test_topology_placement.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.database import connections
from service.database.connections import Connection, NativeConnection
from service.database.db import create_engine, dispose
from service.database.transactions import in_transaction
from service.metrics import render
from service.scheduling.allocations import Allocated, NotStored, lock_nodes
from service.scheduling.place_batches import COUNTS, PlaceQueue
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import (
    Unplaceable,
    claim_calls,
    place_several_without_waiting,
)
from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.placing import hold_gpus as hold
from tests.support.races import shard_uncommitted, until_blocked
from tests.support.reports import H100, REGISTER, gpus, node_input
from tests.support.topology import (
    IB_A,
    IB_B,
    bridged_pairs,
    gb200_tray,
    hgx_h100,
    no_nvlink,
    with_peers,
)

T = TypeVar("T")
Calls = list[tuple[PlaceRequest, str | None]]

H100_NODES = ["mixed", "hgx", "pairs", "flat"]
GB200_NODES = ["tray-a1", "tray-a2", "tray-none"]


async def cluster(api: Api) -> None:
    """Nodes of every topology, each with some GPUs already held."""
    mixed = with_peers(gpus(H100), [[0, 1], [2, 3], [4, 5, 6, 7]])
    for node_id, entries in (
        ("mixed", mixed),
        ("hgx", hgx_h100()),
        ("pairs", bridged_pairs()),
        ("flat", no_nvlink()),
        ("tray-a1", gb200_tray("cluster-a/1")),
        ("tray-a2", gb200_tray("cluster-a/1")),
        ("tray-none", gb200_tray(None)),
    ):
        report = node_input(node_id, gpus=entries, fabrics=[IB_A, IB_B])
        await api(REGISTER, {"input": report})
    await hold(api, "mixed", 0)
    await hold(api, "hgx", 1, 4)
    await hold(api, "pairs", 2)
    await hold(api, "flat", 0, 1, 2, 3)
    await hold(api, "tray-a1", 3)


SHAPES = {
    "one GPU": PlaceRequest("", "H100-80GB", 1),
    "two shards of two": PlaceRequest("", "H100-80GB", 2, shards=2),
    "nvlink pairs": PlaceRequest("", "H100-80GB", 2, nvlink_shards=True),
    "two nvlink pairs": PlaceRequest("", "H100-80GB", 2, shards=2, nvlink_shards=True),
    "rail aligned": PlaceRequest("", "H100-80GB", 1, fabric="ib-a", rail_aligned=True),
    "nvlink and rail": PlaceRequest(
        "", "H100-80GB", 2, fabric="ib-b", rail_aligned=True, nvlink_shards=True
    ),
    "one domain": PlaceRequest("", "GB200", 1, shards=2, same_nvlink_domain=True),
    "domain and nvlink": PlaceRequest(
        "", "GB200", 1, shards=2, same_nvlink_domain=True, nvlink_shards=True
    ),
}


def calls_of(shape: PlaceRequest, count: int) -> Calls:
    actors = ("alice", "bob", None)
    return [(replace(shape, replica_id=f"r{i}"), actors[i % 3]) for i in range(count)]


class _RollBack(Exception):
    pass


async def rolled_back(
    engine: AsyncEngine, node_ids: Sequence[str], work: Callable[[NativeConnection], Awaitable[T]]
) -> tuple[T, list[tuple[Any, ...]]]:
    """work(conn) on the locked nodes, and the events it wrote; then everything rolled back."""
    got: list[tuple[T, list[tuple[Any, ...]]]] = []
    with pytest.raises(_RollBack):
        async with connections.transaction(engine) as conn:
            await lock_nodes(conn, node_ids)
            result = await work(conn)
            events = await conn.execute(
                text(
                    "SELECT kind, node_id, replica_id, shard_id, actor, detail FROM events"
                    " WHERE kind = 'allocated' AND replica_id NOT LIKE 'busy-%' ORDER BY id"
                )
            )
            got.append((result, [tuple(e) for e in events]))
            raise _RollBack
    return got[0]


async def one_by_one(
    conn: Connection, calls: Calls, room: Sequence[tuple[str, int]]
) -> dict[int, Allocated | NotStored]:
    """Each call claimed by itself, on the first node whose count says it has room.

    As the batches claimed before the group statement: a node found fuller
    than its count is passed over from then on.
    """
    slots = [list(slot) for slot in room]
    answers: dict[int, Allocated | NotStored] = {}
    for i, (request, actor) in enumerate(calls):
        for slot in slots:
            if slot[1] <= 0:
                continue
            outcome = (await claim_calls(conn, request, [(request, actor)], [(slot[0], 1)])).get(0)
            if isinstance(outcome, Allocated):
                slot[1] -= 1
                answers[i] = outcome
                break
            slot[1] = 0
    return answers


def held(answers: dict[int, Allocated | NotStored]) -> dict[int, list[tuple[Any, ...]]]:
    return {
        i: [(s.shard_id, s.node_id, s.gpu_indices, s.fabric, s.hcas) for s in a.shards]
        for i, a in answers.items()
        if isinstance(a, Allocated)
    }


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("caps", ["generous", "tight"])
async def test_a_group_claim_holds_what_each_call_would_hold_alone(
    api: Api, engine: AsyncEngine, name: str, caps: str
) -> None:
    await cluster(api)
    shape = SHAPES[name]
    nodes = H100_NODES if shape.gpu_class == "H100-80GB" else GB200_NODES
    # Generous: every node's count says 8 calls, more than most have room
    # for (a snapshot older than claims that committed since); tight: the
    # first node is said to take one call, fewer than it could.
    room = (
        [(n, 8) for n in nodes]
        if caps == "generous"
        else [(nodes[0], 1), *[(n, 8) for n in nodes[1:]]]
    )
    calls = calls_of(shape, 7)

    alone, alone_events = await rolled_back(engine, nodes, lambda c: one_by_one(c, calls, room))
    together, together_events = await rolled_back(
        engine, nodes, lambda c: claim_calls(c, shape, calls, room)
    )

    assert held(together) == held(alone)
    assert together_events == alone_events
    assert held(alone), "the case places nothing: it proves nothing"
    # Calls the nodes had no room for are not answered (the caller makes them alone).
    assert set(together) == set(held(alone))


async def test_every_claim_statement_runs_against_the_schema(api: Api, engine: AsyncEngine) -> None:
    await cluster(api)
    for nvlink in (False, True):
        for rail in (False, True):
            for domain in (False, True):
                shape = PlaceRequest(
                    "",
                    "H100-80GB",
                    1,
                    fabric="ib-a" if rail else None,
                    nvlink_shards=nvlink,
                    rail_aligned=rail,
                    same_nvlink_domain=domain,
                )
                # Two calls on every node (the group form), one on one node (alone).
                for count, room in ((2, [(n, 8) for n in H100_NODES]), (1, [("hgx", 1)])):
                    calls = calls_of(shape, count)
                    answers, _ = await rolled_back(
                        engine,
                        H100_NODES,
                        partial(claim_calls, shape=shape, calls=calls, room=room),
                    )
                    # No H100 node is in an NVLink domain: sameNvlinkDomain places nothing.
                    placed = 0 if domain else count
                    assert len(held(answers)) == placed, (nvlink, rail, domain, count)


async def test_a_group_places_every_call_and_says_why_some_were_claimed_apart(
    api: Api, engine: AsyncEngine
) -> None:
    await cluster(api)
    first = await in_transaction(
        engine,
        lambda c: place_several_without_waiting(c, [(PlaceRequest("r1", "H100-80GB", 1), None)]),
    )
    shape = PlaceRequest("", "H100-80GB", 1)
    calls: Calls = [(replace(shape, replica_id=r), None) for r in ("r0", "r1", "r2", "r0", "r3")]
    answers, why = await in_transaction(engine, lambda c: place_several_without_waiting(c, calls))
    assert all(isinstance(a, Allocated) for a in answers), answers
    # r1 is stored: answered from what is stored; the second r0 is the first one's.
    assert answers[1] == first[0][0]
    assert answers[3] == answers[0]
    assert why == [None, "stored", None, "repeated", None]
    assert await inconsistencies(engine) == []


async def test_the_batches_count_the_calls_claimed_together_and_apart(
    api: Api, engine: AsyncEngine
) -> None:
    await cluster(api)
    queue = PlaceQueue(engine, size=8, transactions=1)
    first = await queue.place(PlaceRequest("r1", "H100-80GB", 1), None)
    together, stored = COUNTS.together, COUNTS.apart.get("stored", 0)
    answers = await asyncio.gather(
        *(queue.place(PlaceRequest(r, "H100-80GB", 1), None) for r in ("r0", "r1", "r2"))
    )
    assert answers[1] == first
    assert (COUNTS.together, COUNTS.apart["stored"]) == (together + 2, stored + 1)
    exposition = await render(None)
    assert f'inventory_place_claimed_apart_total{{reason="stored"}} {stored + 1}' in exposition
    assert f"inventory_place_claimed_together_total {together + 2}" in exposition


async def test_a_gpu_taken_meanwhile_costs_only_its_call_which_is_made_again_alone(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    shape = PlaceRequest("", "H100-80GB", 1)
    calls: Calls = [(replace(shape, replica_id=f"r{i}"), None) for i in range(4)]
    # A writer that skips the node lock holds GPU 3, uncommitted: the
    # group's snapshot sees it free, and its insert of GPU 3 waits.
    async with shard_uncommitted(engine, "rogue-s0", "gpu-07", 3, holding=True) as (pid, tx):
        group = asyncio.ensure_future(
            in_transaction(engine, lambda c: place_several_without_waiting(c, calls))
        )
        await until_blocked(engine, pid, group)
        await tx.commit()
    answers, why = await group

    where = [[(s.shard_id, s.gpu_indices) for s in a.shards] for a in answers]  # type: ignore[union-attr]
    # r3 lost GPU 3 to the rogue: nothing of its first claim is left, and
    # made again alone (its own pick, in the same transaction) it took GPU 4.
    assert where == [[("r0-s0", (0,))], [("r1-s0", (1,))], [("r2-s0", (2,))], [("r3-s0", (4,))]]
    assert why == [None, None, None, "conflict"]
    async with engine.connect() as conn:
        events = await conn.execute(
            text("SELECT shard_id FROM events WHERE kind = 'allocated' ORDER BY id")
        )
        assert list(events.scalars()) == ["r0-s0", "r1-s0", "r2-s0", "r3-s0"]
        pool = await conn.execute(text("SELECT allocated FROM gpu_pools WHERE node_id = 'gpu-07'"))
        # The rogue kept no pools; ours count exactly the four placed.
        assert pool.scalar_one() == 4


async def test_two_engines_placing_in_groups_never_hold_a_gpu_twice(
    api: Api, engine: AsyncEngine, database_url: str, settings: Settings
) -> None:
    """Two processes' batches (two engines, two queues) racing for the same 48 GPUs."""
    for i in range(6):
        await api(REGISTER, {"input": node_input(f"gpu-{i:02d}")})
    other = create_engine(database_url, settings)
    together = COUNTS.together
    try:
        queues = [PlaceQueue(e, size=8, transactions=2) for e in (engine, other)]
        shape = PlaceRequest("", "H100-80GB", 1)
        answers = await asyncio.gather(
            *(queues[i % 2].place(replace(shape, replica_id=f"r{i}"), None) for i in range(80))
        )
    finally:
        await dispose(other)
    granted = [
        (s.node_id, g)
        for a in answers
        if isinstance(a, Allocated)
        for s in a.shards
        for g in s.gpu_indices
    ]
    assert len(granted) == len(set(granted)) == 48
    assert [type(a) for a in answers].count(Unplaceable) == 32
    assert COUNTS.together > together
    assert await inconsistencies(engine) == []
