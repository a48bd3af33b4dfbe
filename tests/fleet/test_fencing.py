"""A node that comes back never revives a stale replica: incarnations, fences, shardsToStop, hold.

Liveness is driven as in test_liveness.py: a node's silence is its last
heartbeat moved into the past on the database's clock, and the sweep is run
directly. Shards are placed through the API (allocate), as a scheduler does.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.fencing import ALLOCATIONS, BEAT, EVENTS, lose, run_sweep
from tests.support.liveness import IB_A, UNREACHABLE_AFTER, silence
from tests.support.reports import ALLOCATE, REGISTER, allocation, node_input, shard

REPORT = """
mutation Report($input: NodeInput!, $incarnation: Int, $running: [RunningShardInput!]) {
  registerNode(input: $input, incarnation: $incarnation, runningShards: $running) {
    id state incarnation shardsToStop { shardId fence reason }
  }
}
"""

NODE = """
query Node($id: ID!) {
  node(id: $id) { id state incarnation freeGpus { index } allocations { shardId fence } }
}
"""


async def allocate(api: Api, replica_id: str, *shards: dict[str, Any]) -> list[dict[str, Any]]:
    result = (await api(ALLOCATE, allocation(replica_id, *shards)))["allocate"]
    assert result["__typename"] == "Allocated", result
    listed: list[dict[str, Any]] = (await api(ALLOCATIONS))["allocations"]
    return [a for a in listed if a["replicaId"] == replica_id]


async def beat(api: Api, node_id: str, **variables: Any) -> dict[str, Any]:
    answer: dict[str, Any] = (await api(BEAT, {"id": node_id, **variables}))["heartbeat"]
    return answer


async def holders(engine: AsyncEngine) -> list[tuple[str, int, str]]:
    """Every held GPU in the database: (node, index, shard)."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT node_id, gpu_index, shard_id FROM allocated_gpus ORDER BY 1, 2")
        )
        return [tuple(r) for r in rows]  # type: ignore[misc]


async def test_fences_come_from_one_sequence_and_grow_with_each_placement(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    first = await allocate(api, "r1", shard("r1/a", "gpu-01", 0, 1))
    await api('mutation { releaseReplica(replicaId: "r1") }')
    second = await allocate(api, "r2", shard("r2/a", "gpu-01", 0, 1))
    # The same GPUs, a later placement: a larger fence.
    assert second[0]["fence"] > first[0]["fence"] >= 1
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert node["allocations"] == [{"shardId": "r2/a", "fence": second[0]["fence"]}]
    assert node["incarnation"] == 1


async def test_a_node_back_from_lost_is_told_to_stop_the_shard_freed_meanwhile(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    old = (await allocate(api, "old", shard("old/a", "gpu-01", 0, 1, 2, 3)))[0]
    running = [{"shardId": "old/a", "fence": old["fence"]}]
    # While it runs, nothing is to stop.
    assert (await beat(api, "gpu-01", incarnation=1, running=running))["shardsToStop"] == []

    result = await lose(engine, "gpu-01")
    assert result.lost == ("gpu-01",) and [r.replica_id for r in result.released] == ["old"]

    # The scheduler rebuilds the replica elsewhere meanwhile.
    await api(REGISTER, {"input": node_input("gpu-02")})
    newer = (await allocate(api, "new", shard("new/a", "gpu-02", 0, 1, 2, 3)))[0]

    back = await beat(api, "gpu-01", incarnation=1, running=running)
    assert back["state"] == "READY"
    assert back["incarnation"] == 2
    assert back["shardsToStop"] == [
        {"shardId": "old/a", "fence": old["fence"], "reason": "FREED_WHILE_LOST"}
    ]
    # The new replica is untouched.
    assert [a["shardId"] for a in (await api(ALLOCATIONS))["allocations"]] == ["new/a"]
    assert newer["fence"] > old["fence"]


async def test_a_new_replica_on_the_freed_gpus_of_the_returned_node_is_untouched(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    old = (await allocate(api, "old", shard("old/a", "gpu-01", 0, 1, 2, 3)))[0]
    await lose(engine, "gpu-01")

    # The node answers a plain heartbeat (its agent restarted without its
    # engines' list), a scheduler places a new replica on the same GPUs.
    await api('mutation { heartbeat(nodeId: "gpu-01") { id } }')
    # Back from LOST through the batched heartbeat: a new life all the same.
    assert (await api(NODE, {"id": "gpu-01"}))["node"]["incarnation"] == 2
    new = (await allocate(api, "new", shard("new/a", "gpu-01", 0, 1, 2, 3)))[0]
    assert new["fence"] > old["fence"]

    # Then the old engine's list arrives: it is told to stop, the new one is kept.
    running = [
        {"shardId": "old/a", "fence": old["fence"]},
        {"shardId": "new/a", "fence": new["fence"]},
    ]
    back = await beat(api, "gpu-01", incarnation=1, running=running)
    assert back["shardsToStop"] == [
        {"shardId": "old/a", "fence": old["fence"], "reason": "FREED_WHILE_LOST"}
    ]
    assert [(a["shardId"], a["fence"]) for a in (await api(ALLOCATIONS))["allocations"]] == [
        ("new/a", new["fence"])
    ]
    # No GPU held twice: the primary key says so, and each is held by the new shard.
    assert await holders(engine) == [("gpu-01", i, "new/a") for i in range(4)]


async def test_released_and_superseded_shards_are_named_with_their_reason(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    a = (await allocate(api, "ra", shard("ra/0", "gpu-01", 0)))[0]
    await api('mutation { releaseReplica(replicaId: "ra") }')
    b = (await allocate(api, "rb", shard("rb/0", "gpu-01", 1)))[0]
    await api('mutation { releaseReplica(replicaId: "rb") }')
    # The same shard id placed again: the engine with the old fence is superseded.
    b2 = (await allocate(api, "rb", shard("rb/0", "gpu-01", 1)))[0]
    running = [
        {"shardId": "ra/0", "fence": a["fence"]},
        {"shardId": "rb/0", "fence": b["fence"]},
    ]
    stops = (await beat(api, "gpu-01", running=running))["shardsToStop"]
    assert stops == [
        {"shardId": "ra/0", "fence": a["fence"], "reason": "RELEASED"},
        {"shardId": "rb/0", "fence": b["fence"], "reason": "FENCE_SUPERSEDED"},
    ]
    # The report says the same.
    report = (
        await api(
            REPORT,
            {
                "input": node_input("gpu-01"),
                "running": [*running, {"shardId": "rb/0x", "fence": 1}],
            },
        )
    )["registerNode"]
    assert [s["shardId"] for s in report["shardsToStop"]] == ["ra/0", "rb/0", "rb/0x"]
    assert (await api(ALLOCATIONS))["allocations"][0]["fence"] == b2["fence"]


async def test_hold_keeps_a_lost_nodes_gpus_and_reconcile_keeps_what_still_runs(
    api: Api, engine: AsyncEngine
) -> None:
    for node_id in ("gpu-01", "gpu-02"):
        await api(REGISTER, {"input": node_input(node_id, fabrics=IB_A)})
    kept = (await allocate(api, "kept", shard("kept/a", "gpu-01", 0, 1)))[0]
    gone = await allocate(
        api, "gone", shard("gone/a", "gpu-01", 2, 3), shard("gone/b", "gpu-02", 0, 1)
    )
    result = await lose(engine, "gpu-01", policy="hold")
    assert result.lost == ("gpu-01",) and result.released == ()

    # Held: listed as such, GPUs still allocated, nothing free or placeable there.
    held = (await api(ALLOCATIONS, {"held": True}))["allocations"]
    assert sorted(a["shardId"] for a in held) == ["gone/a", "kept/a"]
    assert all(a["heldSince"] for a in held)
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert node["state"] == "LOST" and [g["index"] for g in node["freeGpus"]] == [4, 5, 6, 7]
    refused = (await api(ALLOCATE, allocation("other", shard("other/a", "gpu-01", 0))))["allocate"]
    assert refused["__typename"] == "AllocationRejected"

    # It comes back still running only "kept": kept stays, "gone" is freed whole.
    running = [{"shardId": "kept/a", "fence": kept["fence"]}]
    back = await beat(api, "gpu-01", incarnation=1, running=running)
    assert back["incarnation"] == 2 and back["shardsToStop"] == []
    listed = (await api(ALLOCATIONS))["allocations"]
    assert [(a["shardId"], a["heldSince"]) for a in listed] == [("kept/a", None)]
    assert await holders(engine) == [("gpu-01", 0, "kept/a"), ("gpu-01", 1, "kept/a")]

    kinds = [e["kind"] for e in (await api(EVENTS, {"nodeId": "gpu-01"}))["events"]]
    assert kinds.count("replica_held_while_lost") == 2
    assert "replica_reconciled" in kinds and "replica_freed_after_loss" in kinds
    # The freed replica's engine, should it report later, is told why.
    late = [{"shardId": "gone/a", "fence": gone[0]["fence"]}]
    stops = (await beat(api, "gpu-01", running=late))["shardsToStop"]
    assert stops == [{"shardId": "gone/a", "fence": gone[0]["fence"], "reason": "FREED_WHILE_LOST"}]


async def test_an_operator_frees_held_shards(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    await allocate(api, "r", shard("r/a", "gpu-01", 0, 1))
    await lose(engine, "gpu-01", policy="hold")
    freed = await api(
        'mutation { freeHeldShards(nodeId: "gpu-01", reason: "host is being reimaged") }'
    )
    assert freed == {"freeHeldShards": 2}
    assert (await api(ALLOCATIONS))["allocations"] == []
    bad = await api.fails('mutation { freeHeldShards(nodeId: "gpu-01", reason: " ") }')
    assert bad["extensions"]["code"] == "BAD_INPUT"


async def test_a_future_incarnation_is_refused_recorded_and_changes_nothing(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    await silence(engine, "gpu-01", UNREACHABLE_AFTER + 5)
    await run_sweep(engine)
    error = await api.fails(BEAT, {"id": "gpu-01", "incarnation": 7})
    assert error["extensions"] == {"code": "BAD_INPUT", "field": "incarnation", "value": 7}
    assert "at incarnation 1" in error["message"]
    # Nothing stored changed: still unreachable (the beat was not recorded).
    assert (await api(NODE, {"id": "gpu-01"}))["node"]["state"] == "UNREACHABLE"
    events = (await api(EVENTS, {"nodeId": "gpu-01", "kinds": ["future_incarnation"]}))["events"]
    assert len(events) == 1 and events[0]["detail"] == {"claimed": 7, "current": 1}

    report_error = await api.fails(REPORT, {"input": node_input("gpu-01"), "incarnation": 2})
    assert report_error["extensions"]["field"] == "incarnation"

    # Back from UNREACHABLE is not a new life: nothing was freed meanwhile.
    back = await beat(api, "gpu-01", incarnation=1, running=[])
    assert (back["state"], back["incarnation"]) == ("READY", 1)


async def test_bad_fences_are_refused_naming_the_field(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    a = (await allocate(api, "r", shard("r/a", "gpu-01", 0)))[0]
    for fence, problem in ((-1, "negative"), (0, "never issued"), (a["fence"] + 1000, "never")):
        running = [{"shardId": "r/a", "fence": a["fence"]}, {"shardId": "x", "fence": fence}]
        error = await api.fails(BEAT, {"id": "gpu-01", "running": running})
        assert error["extensions"]["code"] == "BAD_INPUT"
        assert error["extensions"]["field"] == "runningShards[1].fence"
        assert error["extensions"]["value"] == fence
        assert problem in error["message"]
    twice = [{"shardId": "r/a", "fence": a["fence"]}] * 2
    error = await api.fails(BEAT, {"id": "gpu-01", "running": twice})
    assert error["extensions"]["field"] == "runningShards[1].shardId"
    bad_reason = await api.raw(
        'mutation { heartbeat(nodeId: "gpu-01", runningShards: [{shardId: "r/a", fence: 1,'
        " reason: NOPE}]) { id } }"
    )
    assert bad_reason["errors"]


async def test_a_new_boot_id_starts_a_new_incarnation(api: Api) -> None:
    await api(REPORT, {"input": node_input("gpu-01", bootId="boot-a")})
    again = (await api(REPORT, {"input": node_input("gpu-01", bootId="boot-a")}))["registerNode"]
    assert again["incarnation"] == 1
    rebooted = await api(REPORT, {"input": node_input("gpu-01", bootId="boot-b")})
    assert rebooted["registerNode"]["incarnation"] == 2


RELEASE = """
mutation Release($id: ID!, $generation: Int) { releaseReplica(replicaId: $id, generation: $generation) }
"""


async def test_release_naming_an_old_generation_is_a_conflict_with_the_current_one(
    api: Api,
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    first = await allocate(api, "r", shard("r/a", "gpu-01", 0), shard("r/b", "gpu-01", 1))
    seen = first[0]["generation"]
    assert {a["generation"] for a in first} == {seen}
    await api('mutation { releaseShard(shardId: "r/b") }')
    now = (await api(ALLOCATIONS))["allocations"][0]["generation"]
    assert now > seen

    error = await api.fails(RELEASE, {"id": "r", "generation": seen})
    assert error["extensions"]["code"] == "CONFLICT"
    assert error["extensions"]["currentGeneration"] == now
    assert len((await api(ALLOCATIONS))["allocations"]) == 1  # nothing freed

    assert (await api(RELEASE, {"id": "r", "generation": now})) == {"releaseReplica": 1}
    # Retried after it succeeded: nothing to free, not a conflict.
    assert (await api(RELEASE, {"id": "r", "generation": now})) == {"releaseReplica": 0}
    # Placed again under the same id: above every generation it had before.
    again = await allocate(api, "r", shard("r/a", "gpu-01", 0))
    assert again[0]["generation"] > now


async def test_removing_a_node_under_a_replica_moves_its_generation(api: Api) -> None:
    for node_id in ("gpu-01", "gpu-02"):
        await api(REGISTER, {"input": node_input(node_id, fabrics=IB_A)})
    placed = await allocate(api, "r", shard("r/a", "gpu-01", 0), shard("r/b", "gpu-02", 0))
    seen = placed[0]["generation"]
    await api('mutation { removeNode(id: "gpu-01") }')
    (left,) = (await api(ALLOCATIONS))["allocations"]
    assert left["shardId"] == "r/b" and left["generation"] > seen
    error = await api.fails(RELEASE, {"id": "r", "generation": seen})
    assert error["extensions"]["currentGeneration"] == left["generation"]


async def test_adding_shards_naming_an_old_generation_is_refused(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    (first,) = await allocate(api, "r", shard("r/a", "gpu-01", 0))
    grow = allocation("r", shard("r/b", "gpu-01", 1))
    grow["input"]["generation"] = first["generation"]
    grown = (await api(ALLOCATE, grow))["allocate"]
    assert grown["__typename"] == "Allocated"
    # A retry of the same request is answered what is stored, not refused.
    assert (await api(ALLOCATE, grow))["allocate"]["__typename"] == "Allocated"

    stale = allocation("r", shard("r/c", "gpu-01", 2))
    stale["input"]["generation"] = first["generation"]
    refused = (await api(ALLOCATE, stale))["allocate"]
    assert refused["code"] == "GENERATION_CONFLICT"
    assert "is at generation" in refused["message"]
    assert sorted(a["shardId"] for a in (await api(ALLOCATIONS))["allocations"]) == ["r/a", "r/b"]

    await lose(engine, "gpu-01")
    gone = allocation("r", shard("r/d", "gpu-01", 3))
    gone["input"]["generation"] = first["generation"]
    refused = (await api(ALLOCATE, gone))["allocate"]
    assert refused["code"] == "GENERATION_CONFLICT" and "holds no shards" in refused["message"]
