"""Allocations racing each other and the node's lifecycle end in a state that makes sense.

Each lifecycle race is played in both orders: one side's transaction is
held open while the other starts (a concurrent task), and the test waits
until PostgreSQL reports that task blocked on the lock before letting the
first side commit. No sleeps decide the outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.database.connections import Connection
from service.database.db import create_engine, dispose
from service.fleet import node_writes
from service.fleet.reports import GpuReport, NodeReport
from service.scheduling import allocations
from service.scheduling.allocations import AllocationRequest, ShardRequest
from service.web.app import create_app
from tests.support.api import Api
from tests.support.races import holding, until_blocked
from tests.support.reports import (
    ALLOCATE,
    PLACE,
    REGISTER,
    allocation,
    node_input,
    placement,
    shard,
)

H100_NAME = "NVIDIA H100 80GB HBM3"
CORDON = 'mutation { cordonNode(id: "gpu-07", reason: "kernel upgrade") { state } }'
REMOVE = 'mutation { removeNode(id: "gpu-07") }'
IB_A = {"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}
ON_GPU_3 = AllocationRequest("r1", (ShardRequest("r1-s0", "gpu-07", (2, 3, 4, 5)),))


async def while_open(
    engine: AsyncEngine,
    first: Any,
    second: Awaitable[Any],
) -> tuple[Any, Any]:
    """Run `first(conn)` in a transaction kept open until `second` is blocked behind it."""
    async with engine.connect() as conn:
        tx = await conn.begin()
        holder = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        first_result = await first(conn)
        task = asyncio.ensure_future(second)
        await until_blocked(engine, holder, task)
        await tx.commit()
    return first_result, await task


async def pools_agree_with_the_gpus(engine: AsyncEngine) -> None:
    """gpu_pools, which schedulers read, must match a recount of the GPUs themselves."""
    async with engine.connect() as conn:
        recount = await conn.execute(
            text(
                """
                SELECT g.node_id, g.gpu_class, count(*) AS total,
                       count(a.gpu_index) AS allocated,
                       count(*) FILTER (WHERE g.healthy AND a.gpu_index IS NULL) AS free,
                       bool_and(n.state = 'ready') AS schedulable
                FROM gpus g JOIN nodes n ON n.id = g.node_id
                LEFT JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx
                GROUP BY g.node_id, g.gpu_class ORDER BY 1, 2
                """
            )
        )
        pools = await conn.execute(
            text(
                "SELECT node_id, gpu_class, total, allocated, free, schedulable"
                " FROM gpu_pools ORDER BY 1, 2"
            )
        )
        assert [tuple(r) for r in pools] == [tuple(r) for r in recount]


async def held(engine: AsyncEngine) -> list[tuple[str, int, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT node_id, gpu_index, shard_id FROM allocated_gpus ORDER BY 1, 2")
        )
        return [(r.node_id, r.gpu_index, r.shard_id) for r in rows]


async def allocate_over_api(api: Api, request: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = (await api(ALLOCATE, request))["allocate"]
    return result


GPU_3_REQUEST = allocation("r1", shard("r1-s0", "gpu-07", 2, 3, 4, 5))


async def test_an_allocation_after_a_cordon_is_refused(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})

    async def cordon(conn: Connection) -> None:
        await node_writes.cordon_node(conn, "gpu-07", "kernel upgrade", "ops")

    _, got = await while_open(engine, cordon, allocate_over_api(api, GPU_3_REQUEST))

    assert got["code"] == "NODE_NOT_SCHEDULABLE"
    assert await held(engine) == []
    await pools_agree_with_the_gpus(engine)


async def test_an_allocation_granted_before_a_cordon_stays(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})

    async def grant(conn: Connection) -> Any:
        return await allocations.allocate(conn, ON_GPU_3)

    granted, cordoned = await while_open(engine, grant, api(CORDON))

    assert isinstance(granted, allocations.Allocated)
    assert cordoned["cordonNode"]["state"] == "CORDONED"
    assert [g for _, g, _ in await held(engine)] == [2, 3, 4, 5]
    await pools_agree_with_the_gpus(engine)


async def test_an_allocation_after_a_removal_finds_no_node(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})

    async def remove(conn: Connection) -> None:
        await node_writes.remove_node(conn, "gpu-07", "ops")

    _, got = await while_open(engine, remove, allocate_over_api(api, GPU_3_REQUEST))

    assert got["code"] == "NO_SUCH_NODE"
    assert await held(engine) == []


async def test_an_allocation_on_a_node_removed_after_it_does_not_survive(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})

    async def grant(conn: Connection) -> Any:
        return await allocations.allocate(conn, ON_GPU_3)

    granted, removed = await while_open(engine, grant, api(REMOVE))

    assert isinstance(granted, allocations.Allocated)
    assert removed == {"removeNode": True}
    assert await held(engine) == []
    assert (await api("{ allocations { shardId } }"))["allocations"] == []


def report_with_gpu_3_unhealthy() -> NodeReport:
    return NodeReport(
        id="gpu-07",
        hostname="gpu-07.cluster.local",
        mgmt_addr="10.0.0.7",
        gpus=tuple(
            GpuReport(
                index=i,
                name=H100_NAME,
                memory_mb=81559,
                uuid=f"GPU-{i:04d}",
                healthy=i != 3,
                health_reasons=() if i != 3 else ("ecc_uncorrected",),
            )
            for i in range(8)
        ),
    )


async def test_an_allocation_after_a_gpu_went_unhealthy_is_refused(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})

    async def reregister(conn: Connection) -> None:
        await node_writes.register_node(conn, report_with_gpu_3_unhealthy())

    _, got = await while_open(engine, reregister, allocate_over_api(api, GPU_3_REQUEST))

    assert got["code"] == "GPU_UNHEALTHY"
    assert got["message"] == "GPU 3 on node gpu-07 is unhealthy (ecc_uncorrected)"
    assert await held(engine) == []
    await pools_agree_with_the_gpus(engine)


async def test_a_gpu_that_fails_after_its_allocation_stays_held_and_shows_unhealthy(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    sick = node_input("gpu-07")
    sick["gpus"][3] = {**sick["gpus"][3], "healthy": False, "healthReasons": ["ecc_uncorrected"]}

    async def grant(conn: Connection) -> Any:
        return await allocations.allocate(conn, ON_GPU_3)

    granted, _ = await while_open(engine, grant, api(REGISTER, {"input": sick}))

    assert isinstance(granted, allocations.Allocated)
    gpu = await api('{ node(id: "gpu-07") { gpus { index healthy allocation { shardId } } } }')
    assert gpu["node"]["gpus"][3] == {
        "index": 3,
        "healthy": False,
        "allocation": {"shardId": "r1-s0"},
    }
    # Held, not free and not spare: the holder must be told, not double-booked.
    await pools_agree_with_the_gpus(engine)


async def test_concurrent_allocations_of_overlapping_gpus_book_each_gpu_once(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    # 24 schedulers each want two neighbouring GPUs: (0,1), (1,2), ... overlapping.
    requests = [
        allocation(f"r{i}", shard(f"r{i}-s0", "gpu-07", i % 7, i % 7 + 1)) for i in range(24)
    ]

    results = await asyncio.gather(*(allocate_over_api(api, r) for r in requests))

    kinds = Counter(r["__typename"] for r in results)
    winners = [r for r in results if r["__typename"] == "Allocated"]
    granted = [g for w in winners for g in w["allocations"][0]["gpuIndices"]]
    assert len(granted) == len(set(granted))
    assert {r["code"] for r in results if r["__typename"] == "AllocationRejected"} <= {"GPU_TAKEN"}
    assert kinds["Allocated"] + kinds["AllocationRejected"] == 24
    assert [g for _, g, _ in await held(engine)] == sorted(granted)
    await pools_agree_with_the_gpus(engine)


async def test_concurrent_places_fill_the_room_exactly(api: Api, engine: AsyncEngine) -> None:
    for i in range(3):
        await api(REGISTER, {"input": node_input(f"gpu-{i}")})
    # Room for 6 replicas of 4 GPUs; 20 schedulers ask at once.

    results = await asyncio.gather(
        *(api(PLACE, placement(f"r{i}", gpusPerShard=4)) for i in range(20))
    )

    kinds = Counter(r["place"]["__typename"] for r in results)
    assert kinds == {"Allocated": 6, "Unplaceable": 14}
    assert len(await held(engine)) == 24
    await pools_agree_with_the_gpus(engine)


async def test_a_shard_id_raced_onto_two_nodes_is_granted_once(
    api: Api, engine: AsyncEngine
) -> None:
    for node_id in ("gpu-07", "gpu-08"):
        await api(REGISTER, {"input": node_input(node_id)})
    # Different nodes, so no node lock orders them: the shard id's primary key does.
    on_other_node = allocation("r1", shard("r1-s0", "gpu-08", 0))

    async def grant(conn: Connection) -> Any:
        return await allocations.allocate(conn, ON_GPU_3)

    granted, got = await while_open(engine, grant, allocate_over_api(api, on_other_node))

    assert isinstance(granted, allocations.Allocated)
    assert got["code"] == "DUPLICATE_SHARD" and got["heldBy"] == "r1-s0"
    assert {n for n, _, _ in await held(engine)} == {"gpu-07"}
    await pools_agree_with_the_gpus(engine)


async def test_the_gpu_primary_key_stops_a_writer_that_skipped_the_node_lock(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})

    async def rogue(conn: Connection) -> None:
        # A writer that does not take the node lock, as a buggy script would.
        await conn.execute(
            text(
                "INSERT INTO shards (shard_id, replica_id, node_id, gpu_indices)"
                " VALUES ('rogue-s0', 'rogue', 'gpu-07', '{3}')"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO allocated_gpus (node_id, gpu_index, shard_id, gpu_class)"
                " VALUES ('gpu-07', 3, 'rogue-s0', 'H100-80GB')"
            )
        )

    _, got = await while_open(engine, rogue, allocate_over_api(api, GPU_3_REQUEST))

    assert got["code"] == "GPU_TAKEN"
    assert got["message"] == "GPU 3 on node gpu-07 is held by shard rogue-s0"
    assert await held(engine) == [("gpu-07", 3, "rogue-s0")]


async def test_releases_racing_allocations_on_one_node_keep_the_counts_exact(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    for i in range(4):
        await allocate_over_api(api, allocation(f"old{i}", shard(f"old{i}-s0", "gpu-07", i)))

    release = "mutation($id: ID!) { releaseReplica(replicaId: $id) }"
    freed_and_granted = await asyncio.gather(
        *(api(release, {"id": f"old{i}"}) for i in range(4)),
        *(
            allocate_over_api(api, allocation(f"new{i}", shard(f"new{i}-s0", "gpu-07", 4 + i)))
            for i in range(4)
        ),
    )

    assert [r["releaseReplica"] for r in freed_and_granted[:4]] == [1, 1, 1, 1]
    assert {r["__typename"] for r in freed_and_granted[4:]} == {"Allocated"}
    assert [g for _, g, _ in await held(engine)] == [4, 5, 6, 7]
    await pools_agree_with_the_gpus(engine)


async def place_over_api(api: Api, replica_id: str, gpus: int) -> dict[str, Any]:
    result: dict[str, Any] = (await api(PLACE, placement(replica_id, gpusPerShard=gpus)))["place"]
    return result


async def test_a_place_that_finds_the_only_node_busy_waits_before_saying_no_room(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})

    _, got = await while_open(engine, holding(8), place_over_api(api, "r1", 8))

    # On committed data there was room when it looked; it waited for the
    # holder instead of answering from a guess.
    assert got["__typename"] == "Unplaceable"
    assert got["verdicts"][0]["detail"] == "0 free H100-80GB, needs 8"


async def test_a_place_that_waited_takes_what_the_holder_left(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})

    _, got = await while_open(engine, holding(4), place_over_api(api, "r1", 4))

    assert got["__typename"] == "Allocated"
    assert got["allocations"][0]["gpuIndices"] == [4, 5, 6, 7]
    await pools_agree_with_the_gpus(engine)


async def test_the_same_place_sent_twice_at_once_holds_one_set_of_gpus(
    api: Api, engine: AsyncEngine
) -> None:
    for node_id in ("gpu-07", "gpu-08"):
        await api(REGISTER, {"input": node_input(node_id, fabrics=[IB_A])})

    # A scheduler that timed out and retried while the first call still ran.
    for shards in (1, 2):
        replica = f"r{shards}"
        answers = await asyncio.gather(
            *(
                api(PLACE, placement(replica, shards=shards, gpusPerShard=8 // shards))
                for _ in range(4)
            )
        )
        placed = [a["place"] for a in answers]
        assert {p["__typename"] for p in placed} == {"Allocated"}
        assert all(p == placed[0] for p in placed)
    async with engine.connect() as conn:
        count = await conn.execute(text("SELECT replica_id, count(*) FROM shards GROUP BY 1"))
        assert sorted(tuple(r) for r in count) == [("r1", 1), ("r2", 2)]
    await pools_agree_with_the_gpus(engine)


async def test_a_place_that_loses_its_shard_ids_answers_what_the_winner_stored(
    api: Api, engine: AsyncEngine
) -> None:
    for node_id in ("gpu-07", "gpu-08"):
        await api(REGISTER, {"input": node_input(node_id)})

    async def first_call(conn: Connection) -> Any:
        # The scheduler's first call of this place, still running: it holds
        # gpu-08, so the retry locks gpu-07 and then waits on the shard id.
        request = AllocationRequest("r1", (ShardRequest("r1-s0", "gpu-08", (0, 1)),))
        return await allocations.allocate(conn, request)

    first, got = await while_open(engine, first_call, place_over_api(api, "r1", 2))

    assert isinstance(first, allocations.Allocated)
    assert (got["__typename"], got["allocations"][0]["nodeId"]) == ("Allocated", "gpu-08")
    assert got["allocations"][0]["gpuIndices"] == [0, 1]
    # Nothing of the losing claim is left: no GPU on gpu-07, no event.
    assert await held(engine) == [("gpu-08", 0, "r1-s0"), ("gpu-08", 1, "r1-s0")]
    async with engine.connect() as conn:
        logged = await conn.execute(text("SELECT count(*) FROM events WHERE kind = 'allocated'"))
        assert logged.scalar_one() == 1
    await pools_agree_with_the_gpus(engine)


async def test_places_racing_for_the_last_gpus_fill_them_without_a_deadlock(
    api: Api, engine: AsyncEngine, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="service.database.transactions")
    for i in range(3):
        await api(REGISTER, {"input": node_input(f"gpu-{i}")})
    # 48 schedulers asking for 1 or 2 GPUs where 24 are free, through an app
    # with a connection for each: most find their candidates busy or full,
    # and wait for the others.
    settings = Settings(max_page_size=2000, db_pool_size=48)
    crowd = create_engine(database_url, settings)
    transport = httpx.ASGITransport(app=create_app(settings, engine=crowd))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
            schedulers = Api(client)
            results = await asyncio.gather(
                *(schedulers(PLACE, placement(f"r{i}", gpusPerShard=1 + i % 2)) for i in range(48))
            )
    finally:
        await dispose(crowd)

    placed = [i for i, r in enumerate(results) if r["place"]["__typename"] == "Allocated"]
    assert sum(1 + i % 2 for i in placed) == len(await held(engine))
    # At most the last GPU of a node is left, where a 2-GPU replica cannot go:
    # an Unplaceable is said only when no node has room on committed data.
    assert len(await held(engine)) >= 21
    # A try that locked a node it could not use let go of it before waiting
    # for anyone: no transaction was picked as a deadlock victim and rerun.
    assert [m for m in caplog.messages if "lost a conflict" in m] == []
    await pools_agree_with_the_gpus(engine)
