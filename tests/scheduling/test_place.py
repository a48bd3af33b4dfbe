"""The service places a replica itself: it packs, keeps a replica on one fabric, and says why not."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.transactions import in_transaction
from service.event_log.events import collecting_recorded
from service.fleet.liveness import sweep
from service.scheduling import placement as placement_module
from service.scheduling.allocations import Allocated
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import statements as placement_statements
from tests.support.api import Api
from tests.support.placing import hold, place, register, statements_sent
from tests.support.reports import (
    ALLOCATE,
    EXPLAIN,
    GB,
    H100,
    PLACE,
    TB,
    allocation,
    gpus,
    placement,
    shard,
)
from tests.support.statements import StatementCounter

IB_A = {"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}
IB_B = {"fabric": "ib-b", "hcas": ["mlx5_2"], "rateGbps": 400}
LLAMA = "/models/llama-70b"


async def explain(api: Api, replica_id: str, **fields: Any) -> dict[str, Any]:
    found: dict[str, Any] = (await api(EXPLAIN, placement(replica_id, **fields)))[
        "explainPlacement"
    ]
    return found


def where(result: dict[str, Any]) -> list[tuple[str, str, list[int]]]:
    assert result["__typename"] == "Allocated", result
    return [(a["shardId"], a["nodeId"], a["gpuIndices"]) for a in result["allocations"]]


async def test_place_fills_the_smallest_hole_that_fits(api: Api) -> None:
    for node_id in ("roomy", "half", "nearly-full"):
        await register(api, node_id)
    await hold(api, "half", 4)
    await hold(api, "nearly-full", 6)

    assert where(await place(api, "r1", gpusPerShard=2)) == [("r1-s0", "nearly-full", [6, 7])]
    assert where(await place(api, "r2", gpusPerShard=4)) == [("r2-s0", "half", [4, 5, 6, 7])]
    # The large hole stayed open for the large replica.
    assert where(await place(api, "r3", gpusPerShard=8)) == [
        ("r3-s0", "roomy", [0, 1, 2, 3, 4, 5, 6, 7])
    ]


async def test_equally_good_nodes_are_picked_at_random_so_schedulers_do_not_queue(
    api: Api,
) -> None:
    for i in range(4):
        await register(api, f"gpu-{i:02d}")

    chosen = set()
    for _ in range(30):
        placed = where(await place(api, "r1", gpusPerShard=1))
        chosen.add(placed[0][1])
        await api('mutation { releaseReplica(replicaId: "r1") }')
    assert len(chosen) > 1
    # explainPlacement's plan is deterministic (service/scheduling/ranking.py):
    # the same cluster, the same answer.
    plans = {str((await explain(api, "r1", gpusPerShard=1))["plan"]) for _ in range(5)}
    assert len(plans) == 1


async def test_a_replica_that_fits_on_one_node_stays_on_it(api: Api) -> None:
    await register(api, "whole", fabrics=[IB_A])
    await register(api, "part-1", fabrics=[IB_A])
    await register(api, "part-2", fabrics=[IB_A])
    await hold(api, "part-1", 4)
    await hold(api, "part-2", 4)

    got = await place(api, "r1", shards=2, gpusPerShard=4)

    assert where(got) == [("r1-s0", "whole", [0, 1, 2, 3]), ("r1-s1", "whole", [4, 5, 6, 7])]
    assert {a["fabric"] for a in got["allocations"]} == {None}


async def test_a_multi_node_replica_goes_on_one_fabric_with_its_adapters(api: Api) -> None:
    await register(api, "a-1", fabrics=[IB_A])
    await register(api, "a-2", fabrics=[IB_A])
    await register(api, "b-1", fabrics=[IB_B])

    got = await place(api, "r1", shards=2, gpusPerShard=8)

    assert sorted(node for _, node, _ in where(got)) == ["a-1", "a-2"]
    assert {(a["fabric"], tuple(a["hcas"])) for a in got["allocations"]} == {
        ("ib-a", ("mlx5_0", "mlx5_1"))
    }


async def test_a_shard_is_never_split_across_nodes(api: Api, engine: AsyncEngine) -> None:
    await register(api, "a-1", fabrics=[IB_A])
    await register(api, "a-2", fabrics=[IB_A])
    await hold(api, "a-1", 4)
    await hold(api, "a-2", 4)

    got = await place(api, "r1", gpusPerShard=8)

    assert got["__typename"] == "Unplaceable"
    assert got["message"] == (
        "no node has room for a shard of 8 H100-80GB that meets every constraint "
        "(2 nodes with H100-80GB considered)"
    )
    assert got["verdicts"] == [
        {"nodeId": "a-1", "code": "NOT_ENOUGH_GPUS", "detail": "4 free H100-80GB, needs 8"},
        {"nodeId": "a-2", "code": "NOT_ENOUGH_GPUS", "detail": "4 free H100-80GB, needs 8"},
    ]
    async with engine.connect() as conn:
        held = await conn.execute(text("SELECT count(*) FROM shards WHERE replica_id = 'r1'"))
        assert held.scalar_one() == 0


async def test_shards_that_fit_on_no_fabric_together_are_explained(api: Api) -> None:
    await register(api, "a-1", fabrics=[IB_A])
    await register(api, "b-1", fabrics=[IB_B])

    got = await place(api, "r1", shards=2, gpusPerShard=8)

    assert got["__typename"] == "Unplaceable"
    assert got["message"] == (
        "2 shards of 8 H100-80GB fit on no single node, and no fabric has room for all of "
        "them: at most 1 fit on fabric ib-a"
    )
    assert {v["code"] for v in got["verdicts"]} == {"FITS"}


async def test_nodes_holding_the_weights_come_first(api: Api) -> None:
    weights = [{"path": LLAMA, "sizeBytes": 140 * GB}]
    await register(api, "holder", weights=weights)
    await register(api, "tight-fit")  # never looked for weights: not excluded
    await register(api, "looked", weights=[{"path": "/models/other"}])
    await hold(api, "tight-fit", 6)

    first = await place(api, "r1", gpusPerShard=2, weights=LLAMA)
    assert where(first)[0][1] == "holder"

    # With the holder full, a node that never looked is still a candidate;
    # one that looked and has other weights is not.
    await api(ALLOCATE, allocation("fill", shard("fill-s0", "holder", 2, 3, 4, 5, 6, 7)))
    second = await place(api, "r2", gpusPerShard=2, weights=LLAMA)
    assert where(second)[0][1] == "tight-fit"
    verdicts = (await explain(api, "r4", gpusPerShard=2, weights=LLAMA))["verdicts"]
    assert {v["nodeId"]: v["detail"] for v in verdicts}["looked"] == f"does not hold {LLAMA}"


async def test_each_node_says_the_first_check_it_fails(api: Api, engine: AsyncEngine) -> None:
    zone = [{"key": "zone", "value": "z1"}]
    disk = {
        "id": "dev:259:1",
        "mountPoint": "/data",
        "shared": False,
        "freeBytes": 20_100_000_000,
        "totalBytes": 18 * TB // 10,
    }
    weights = [{"path": "/models/other"}]
    common: dict[str, Any] = {"fabrics": [IB_A], "labels": zone}
    await register(api, "n1-cordoned", **common)
    await register(api, "n2-busy", **common)
    await register(api, "n3-elsewhere", fabrics=[IB_B], labels=zone)
    await register(api, "n4-zone", fabrics=[IB_A], labels=[{"key": "zone", "value": "z2"}])
    await register(api, "n5-full-disk", storage=[disk], **common)
    await register(api, "n6-no-weights", weights=weights, **common)
    await register(api, "n7-silent", **common)
    await register(api, "n8-unknown-disk", **common)
    await api('mutation { cordonNode(id: "n1-cordoned", reason: "kernel upgrade") { id } }')
    await hold(api, "n2-busy", 6)
    await hold(api, "n8-unknown-disk", 6)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE nodes SET last_seen = now() - interval '60 seconds' WHERE id = :id"),
            {"id": "n7-silent"},
        )
        await sweep(conn, unreachable_after=30, lost_after=300)

    ask = {
        "gpusPerShard": 4,
        "fabric": "ib-a",
        "weights": LLAMA,
        "minLocalDiskFree": 40 * GB,
        "label": {"key": "zone", "value": "z1"},
    }
    got = await place(api, "r1", **ask)

    assert got["__typename"] == "Unplaceable"
    assert got["verdictsOmitted"] == 0
    assert [(v["nodeId"], v["code"], v["detail"]) for v in got["verdicts"]] == [
        ("n1-cordoned", "NOT_SCHEDULABLE", "cordoned: kernel upgrade"),
        ("n2-busy", "NOT_ENOUGH_GPUS", "2 free H100-80GB, needs 4"),
        ("n3-elsewhere", "NOT_ON_FABRIC", "not on fabric ib-a"),
        ("n4-zone", "LABEL_MISMATCH", "label zone=z1 wanted, it is z2"),
        ("n5-full-disk", "LOCAL_DISK_TOO_SMALL", "local disk 20.1 GB free of 1.8 TB, needs 40 GB"),
        ("n6-no-weights", "NO_WEIGHTS", f"does not hold {LLAMA}"),
        ("n7-silent", "NOT_SCHEDULABLE", "unreachable: no heartbeat for more than 30 s"),
        ("n8-unknown-disk", "NOT_ENOUGH_GPUS", "2 free H100-80GB, needs 4"),
    ]
    assert await explain(api, "r1", **ask) == {
        "placeable": False,
        "message": got["message"],
        "fabric": None,
        "plan": [],
        "verdicts": got["verdicts"],
        "verdictsOmitted": 0,
    }


async def test_unknown_disk_and_unasked_weights_do_not_exclude_a_node(api: Api) -> None:
    await register(api, "old-agent")

    got = await place(api, "r1", gpusPerShard=8, weights=LLAMA, minLocalDiskFree=1 * TB)

    assert where(got)[0][1] == "old-agent"


async def test_explain_says_where_without_holding_anything(api: Api) -> None:
    await register(api, "a-1", fabrics=[IB_A])
    await register(api, "a-2", fabrics=[IB_A])

    told = await explain(api, "r1", shards=2, gpusPerShard=8)

    assert told["placeable"] is True
    assert told["fabric"] == "ib-a"
    assert sorted(p["nodeId"] for p in told["plan"]) == ["a-1", "a-2"]
    assert [p["shardId"] for p in told["plan"]] == ["r1-s0", "r1-s1"]
    assert told["message"].startswith("would place 2 shards of 8 H100-80GB on a-")
    assert {v["code"] for v in told["verdicts"]} == {"FITS"}
    assert (await api("{ allocations { shardId } }"))["allocations"] == []


async def test_verdicts_stay_bounded_on_a_large_cluster(api: Api) -> None:
    await asyncio.gather(*(register(api, f"gpu-{i:03d}", gpus=gpus(H100, 1)) for i in range(103)))

    got = await place(api, "r1", gpusPerShard=2)

    assert got["__typename"] == "Unplaceable"
    assert len(got["verdicts"]) == 100
    assert got["verdicts"][0]["nodeId"] == "gpu-000"
    assert got["verdictsOmitted"] == 3
    assert got["message"].endswith("(verdicts for the first 100 nodes by id; 3 more)")


async def test_a_class_no_node_has_is_named(api: Api) -> None:
    await register(api, "gpu-07")

    got = await place(api, "r1", gpuClass="B200-192GB", gpusPerShard=1)

    assert got["message"] == "no node has B200-192GB GPUs; classes here: H100-80GB"
    assert got["verdicts"] == []


async def test_a_retried_place_answers_what_it_placed(api: Api, engine: AsyncEngine) -> None:
    await register(api, "gpu-07")
    first = await place(api, "r1", shards=2, gpusPerShard=2)

    again = await place(api, "r1", shards=2, gpusPerShard=2)
    other = await place(api, "r1", shards=1, gpusPerShard=8)

    assert again == first
    assert other["code"] == "DUPLICATE_SHARD"
    assert other["message"] == (
        "replica r1 already holds 2 shard(s) of another shape; release it first or use a new "
        "replica id"
    )
    async with engine.connect() as conn:
        kinds = await conn.execute(
            text("SELECT kind, shard_id FROM events WHERE kind = 'allocated'")
        )
        assert sorted(r.shard_id for r in kinds) == ["r1-s0", "r1-s1"]


async def test_bad_place_requests_are_refused_and_write_nothing(api: Api) -> None:
    await register(api, "gpu-07")

    for fields, message in [
        ({"gpusPerShard": 0}, "gpusPerShard=0: a shard has 1 to 64 GPUs"),
        ({"gpusPerShard": 1, "shards": 1000}, "shards=1000: a replica has 1 to 64 shards"),
        ({"gpusPerShard": 1, "gpuClass": ""}, "gpuClass '' is not a GPU class"),
    ]:
        got = await place(api, "r1", **fields)
        assert (got["code"], got["message"]) == ("INVALID", message)
        failed = await api.fails(EXPLAIN, placement("r1", **fields))
        assert failed["extensions"]["code"] == "BAD_INPUT"
        assert failed["message"] == message
    # Text that cannot be stored is refused where every String is, before place's own
    # checks: BAD_INPUT naming the field (service/graphql/input_values.py).
    for query in (PLACE, EXPLAIN):
        failed = await api.fails(query, placement("r1", gpusPerShard=1, weights="/m\x00"))
        assert failed["extensions"]["code"] == "BAD_INPUT"
        assert failed["extensions"]["field"] == "input.weights"
    assert (await api("{ allocations { shardId } }"))["allocations"] == []


async def test_placing_costs_the_same_statements_on_a_larger_cluster(
    api: Api, count_statements: StatementCounter
) -> None:
    async def statements_to_place_and_explain(replica_id: str) -> int:
        count_statements.statements.clear()
        assert (await place(api, replica_id, gpusPerShard=4))["__typename"] == "Allocated"
        assert (await explain(api, replica_id + "-x", gpusPerShard=16))["placeable"] is False
        # Left out: the token check, which runs at most once a second, and
        # event announcements, sent after commit whenever their flush runs.
        return len(
            [
                s
                for s in count_statements.statements
                if "api_tokens" not in s and "pg_notify" not in s
            ]
        )

    await asyncio.gather(*(register(api, f"a-{i}") for i in range(2)))
    small = await statements_to_place_and_explain("r1")
    await asyncio.gather(*(register(api, f"b-{i:02d}") for i in range(30)))
    large = await statements_to_place_and_explain("r2")

    assert large == small


async def test_a_multi_node_plan_looks_past_its_window_before_saying_no_room(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The two best-packing nodes sit on different fabrics; only the roomier
    # pair on ib-c can hold 3 shards of 4.
    monkeypatch.setattr(placement_statements, "SPREAD_WINDOW", 2)
    ib_c = {"fabric": "ib-c", "hcas": ["mlx5_9"], "rateGbps": 400}
    await register(api, "n1", fabrics=[IB_A])
    await register(api, "n2", fabrics=[IB_B])
    await register(api, "n3", fabrics=[ib_c])
    await register(api, "n4", fabrics=[ib_c])
    await hold(api, "n1", 4)
    await hold(api, "n2", 4)

    got = await place(api, "r1", shards=3, gpusPerShard=4)

    assert sorted({node for _, node, _ in where(got)}) == ["n3", "n4"]
    assert {a["fabric"] for a in got["allocations"]} == {"ib-c"}


async def test_a_one_node_place_is_two_statements(
    api: Api, engine: AsyncEngine, count_statements: StatementCounter
) -> None:
    await asyncio.gather(*(register(api, f"gpu-{i:02d}") for i in range(4)))

    for replica_id, shards in (("r1", 1), ("r2", 2)):
        count_statements.statements.clear()
        got = await place(api, replica_id, shards=shards, gpusPerShard=2)

        assert got["__typename"] == "Allocated"
        # Pick and lock; then store the shards, their GPUs, the pools and the
        # events. In a transaction shared with other calls
        # (service/scheduling/place_batches.py), which never waits, so no savepoint.
        sent = statements_sent(count_statements)
        assert len(sent) == 2, sent
        assert "FOR NO KEY UPDATE" in sent[0] and "INSERT INTO shards" in sent[1]

    count_statements.statements.clear()
    again = await place(api, "r1", gpusPerShard=2)
    assert again["__typename"] == "Allocated"
    assert len(statements_sent(count_statements)) == 1

    # place() in a transaction of its own (a call that must wait runs so):
    # the savepoint around the two statements lets go of a node found full.
    count_statements.statements.clear()
    request = PlaceRequest("r3", "H100-80GB", gpus_per_shard=2)
    alone = await in_transaction(engine, lambda conn: placement_module.place(conn, request))
    assert isinstance(alone, Allocated)
    sent = statements_sent(count_statements)
    assert len(sent) == 4, sent
    assert sent[0].startswith("SAVEPOINT") and sent[3].startswith("RELEASE SAVEPOINT")
    assert "FOR NO KEY UPDATE" in sent[1] and "INSERT INTO shards" in sent[2]


async def test_one_event_per_shard_is_recorded_and_announced_after_commit(
    engine: AsyncEngine, api: Api
) -> None:
    await register(api, "gpu-07")

    with collecting_recorded() as announced:
        async with engine.begin() as conn:
            got = await placement_module.place(
                conn, PlaceRequest("r1", "H100-80GB", gpus_per_shard=3, shards=2), actor="sched"
            )

    assert isinstance(got, Allocated)
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT id, kind, node_id, replica_id, shard_id, actor, detail FROM events"
                 " WHERE kind = 'allocated' ORDER BY id")
        )  # fmt: skip
        events = [tuple(r) for r in rows]
    assert [e[1:] for e in events] == [
        ("allocated", "gpu-07", "r1", "r1-s0", "sched",
         {"gpuIndices": [0, 1, 2], "fabric": None, "hcas": []}),
        ("allocated", "gpu-07", "r1", "r1-s1", "sched",
         {"gpuIndices": [3, 4, 5], "fabric": None, "hcas": []}),
    ]  # fmt: skip
    assert announced == [e[0] for e in events]


async def test_a_node_holding_fewer_free_gpus_than_its_pool_says_is_passed_over(
    api: Api, engine: AsyncEngine
) -> None:
    await register(api, "tight")
    await register(api, "roomy")
    await hold(api, "tight", 6)
    # A writer that skipped the node lock and the pool refresh took the last
    # two: the pool still says 2 free, so `tight` is the best fit on paper.
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO shards (shard_id, replica_id, node_id, gpu_indices)"
                " VALUES ('rogue-s0', 'rogue', 'tight', '{6,7}')"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO allocated_gpus (node_id, gpu_index, shard_id, gpu_class)"
                " SELECT node_id, idx, 'rogue-s0', gpu_class FROM gpus"
                " WHERE node_id = 'tight' AND idx IN (6, 7)"
            )
        )

    got = await place(api, "r1", gpusPerShard=1)

    # The count after the lock is what decides; the stale row misled only the ranking.
    assert where(got) == [("r1-s0", "roomy", [0])]
    async with engine.connect() as conn:
        held = await conn.execute(
            text(
                "SELECT node_id, gpu_index, shard_id FROM allocated_gpus"
                " WHERE shard_id NOT LIKE 'busy-%' ORDER BY 1, 2"
            )
        )
        assert [tuple(r) for r in held] == [
            ("roomy", 0, "r1-s0"),
            ("tight", 6, "rogue-s0"),
            ("tight", 7, "rogue-s0"),
        ]
        pools = await conn.execute(
            text("SELECT node_id, free, allocated FROM gpu_pools ORDER BY 1")
        )
        assert [tuple(r) for r in pools] == [("roomy", 7, 1), ("tight", 2, 6)]
