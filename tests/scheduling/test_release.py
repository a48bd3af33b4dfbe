"""Releasing GPUs: a count of what was freed, nothing an error, replicas freed whole."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.reports import ALLOCATE, REGISTER, allocation, node_input, shard

IB_A = {"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}
RELEASE_SHARD = "mutation($id: ID!) { releaseShard(shardId: $id) }"
RELEASE_REPLICA = "mutation($id: ID!) { releaseReplica(replicaId: $id) }"


async def setup_two_replicas(api: Api) -> None:
    for node_id in ("gpu-01", "gpu-02"):
        await api(REGISTER, {"input": node_input(node_id, fabrics=[IB_A])})
    big = allocation(
        "big", shard("big-s0", "gpu-01", 0, 1, 2, 3), shard("big-s1", "gpu-02", 0, 1, 2, 3)
    )
    small = allocation("small", shard("small-s0", "gpu-01", 4, 5))
    for request in (big, small):
        assert (await api(ALLOCATE, request))["allocate"]["__typename"] == "Allocated"


async def free_counts(api: Api) -> dict[str, int]:
    data = await api("{ freeGpus { node { id } gpuIndices } }")
    return {f["node"]["id"]: len(f["gpuIndices"]) for f in data["freeGpus"]}


async def events(engine: AsyncEngine) -> list[tuple[str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT kind, shard_id FROM events WHERE kind = 'released' ORDER BY id")
        )
        return [(r.kind, r.shard_id) for r in rows]


async def test_releasing_a_shard_frees_its_gpus_and_says_how_many(
    api: Api, engine: AsyncEngine
) -> None:
    await setup_two_replicas(api)

    freed = await api(RELEASE_SHARD, {"id": "small-s0"})

    assert freed == {"releaseShard": 2}
    assert await free_counts(api) == {"gpu-01": 4, "gpu-02": 4}
    assert await events(engine) == [("released", "small-s0")]


async def test_releasing_what_is_not_held_frees_nothing_and_is_not_an_error(
    api: Api, engine: AsyncEngine
) -> None:
    await setup_two_replicas(api)
    await api(RELEASE_SHARD, {"id": "small-s0"})

    assert await api(RELEASE_SHARD, {"id": "small-s0"}) == {"releaseShard": 0}
    assert await api(RELEASE_SHARD, {"id": "never-was"}) == {"releaseShard": 0}
    assert await api(RELEASE_REPLICA, {"id": "never-was"}) == {"releaseReplica": 0}
    assert await events(engine) == [("released", "small-s0")]


async def test_a_replica_is_released_whole_across_nodes(api: Api, engine: AsyncEngine) -> None:
    await setup_two_replicas(api)

    freed = await api(RELEASE_REPLICA, {"id": "big"})

    assert freed == {"releaseReplica": 8}
    assert await free_counts(api) == {"gpu-01": 6, "gpu-02": 8}
    left = await api("{ allocations { shardId } }")
    assert left["allocations"] == [{"shardId": "small-s0"}]
    assert sorted(await events(engine)) == [("released", "big-s0"), ("released", "big-s1")]


async def test_released_gpus_can_be_allocated_again(api: Api) -> None:
    await setup_two_replicas(api)
    await api(RELEASE_REPLICA, {"id": "small"})

    again = await api(ALLOCATE, allocation("next", shard("next-s0", "gpu-01", 4, 5, 6, 7)))

    assert again["allocate"]["__typename"] == "Allocated"
    assert await free_counts(api) == {"gpu-02": 4}
