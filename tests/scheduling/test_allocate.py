"""A scheduler records where a replica's shards run: all of them or none, and a refusal says why."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.metrics import scrape
from tests.support.placing import register
from tests.support.reports import ALLOCATE, H100, allocation, gpus, shard
from tests.support.statements import StatementCounter

IB_A = {"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}
IB_B = {"fabric": "ib-b", "hcas": ["mlx5_2"], "rateGbps": 200}

HOLDERS = """
query Node($id: ID!) {
  node(id: $id) {
    gpus { index allocation { shardId replicaId } }
    freeGpus { index }
    allocations { shardId gpuIndices }
  }
}
"""


async def allocate(api: Api, replica_id: str, *shards: dict[str, Any]) -> dict[str, Any]:
    data = await api(ALLOCATE, allocation(replica_id, *shards))
    result: dict[str, Any] = data["allocate"]
    return result


async def stored(engine: AsyncEngine) -> dict[str, int]:
    """What the database holds: nothing may be half-written after a refusal."""
    async with engine.connect() as conn:
        counts = {}
        for table in ("shards", "allocated_gpus"):
            counts[table] = (await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one()
        counts["allocation events"] = (
            await conn.execute(text("SELECT count(*) FROM events WHERE kind = 'allocated'"))
        ).scalar_one()
        return counts


NOTHING = {"shards": 0, "allocated_gpus": 0, "allocation events": 0}


async def test_a_replica_on_one_node_holds_its_gpus(api: Api, engine: AsyncEngine) -> None:
    await register(api, "gpu-07")

    got = await allocate(api, "llama-70b-r1", shard("llama-70b-r1-s0", "gpu-07", 3, 0, 1, 2))

    assert got["__typename"] == "Allocated"
    [held] = got["allocations"]
    assert held["shardId"] == "llama-70b-r1-s0" and held["nodeId"] == "gpu-07"
    assert held["gpuIndices"] == [0, 1, 2, 3]
    # One node needs no fabric: nothing to agree on with a peer.
    assert held["fabric"] is None and held["hcas"] == []
    node = (await api(HOLDERS, {"id": "gpu-07"}))["node"]
    assert [g["allocation"]["shardId"] if g["allocation"] else None for g in node["gpus"]] == [
        "llama-70b-r1-s0"
    ] * 4 + [None] * 4
    assert [g["index"] for g in node["freeGpus"]] == [4, 5, 6, 7]
    classes = await api("{ gpuClasses { gpuClass free allocated } }")
    assert classes["gpuClasses"] == [{"gpuClass": "H100-80GB", "free": 4, "allocated": 4}]
    assert await stored(engine) == {"shards": 1, "allocated_gpus": 4, "allocation events": 1}


async def test_a_multi_node_replica_is_handed_only_its_shared_fabrics_adapters(api: Api) -> None:
    await register(api, "gpu-01", fabrics=[IB_A, IB_B])
    await register(api, "gpu-02", fabrics=[{"fabric": "ib-a", "hcas": ["mlx5_4"], "rateGbps": 400}])

    got = await allocate(
        api,
        "r1",
        shard("r1-s0", "gpu-01", 0, 1, 2, 3, 4, 5, 6, 7),
        shard("r1-s1", "gpu-02", 0, 1, 2, 3, 4, 5, 6, 7),
    )

    assert got["__typename"] == "Allocated"
    assert [(a["nodeId"], a["fabric"], a["hcas"]) for a in got["allocations"]] == [
        ("gpu-01", "ib-a", ["mlx5_0", "mlx5_1"]),
        ("gpu-02", "ib-a", ["mlx5_4"]),
    ]
    listed = await api('{ allocations(replicaId: "r1") { shardId fabric hcas } }')
    assert [a["fabric"] for a in listed["allocations"]] == ["ib-a", "ib-a"]


async def test_nodes_sharing_several_fabrics_get_the_one_whose_slowest_link_is_fastest(
    api: Api,
) -> None:
    slow_a = {"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 100}
    fast_b = {"fabric": "ib-b", "hcas": ["mlx5_1"], "rateGbps": 400}
    fast_c = {"fabric": "ib-c", "hcas": ["mlx5_2"], "rateGbps": 400}
    await register(api, "gpu-01", fabrics=[{**slow_a, "rateGbps": 400}, fast_b, fast_c])
    await register(api, "gpu-02", fabrics=[slow_a, fast_b, fast_c])

    got = await allocate(api, "r1", shard("r1-s0", "gpu-01", 0), shard("r1-s1", "gpu-02", 0))

    # ib-a runs at 100 on gpu-02; ib-b and ib-c tie at 400, and the name decides.
    assert {a["fabric"] for a in got["allocations"]} == {"ib-b"}
    assert [a["hcas"] for a in got["allocations"]] == [["mlx5_1"], ["mlx5_1"]]


async def test_nodes_on_different_fabrics_cannot_host_one_replica(
    api: Api, engine: AsyncEngine
) -> None:
    await register(api, "gpu-01", fabrics=[IB_A])
    await register(api, "gpu-02", fabrics=[IB_B])
    await register(api, "gpu-03")

    got = await allocate(api, "r1", shard("r1-s0", "gpu-01", 0), shard("r1-s1", "gpu-02", 0))
    assert got["code"] == "FABRIC_MISMATCH"
    assert "gpu-01: ib-a; gpu-02: ib-b" in got["message"]

    # A node without IB is an island of its own.
    got = await allocate(api, "r1", shard("r1-s0", "gpu-01", 0), shard("r1-s1", "gpu-03", 0))
    assert got["code"] == "FABRIC_MISMATCH"
    assert "gpu-03: none" in got["message"]
    assert await stored(engine) == NOTHING


async def test_a_taken_gpu_names_its_holder(api: Api, engine: AsyncEngine) -> None:
    await register(api, "gpu-07")
    await allocate(api, "llama-70b-r2", shard("llama-70b-r2-s1", "gpu-07", 2, 3))

    got = await allocate(api, "mistral-r1", shard("mistral-r1-s0", "gpu-07", 3, 4))

    assert got == {
        "__typename": "AllocationRejected",
        "code": "GPU_TAKEN",
        "message": "GPU 3 on node gpu-07 is held by shard llama-70b-r2-s1",
        "nodeId": "gpu-07",
        "gpuIndex": 3,
        "heldBy": "llama-70b-r2-s1",
    }
    assert (await stored(engine))["shards"] == 1


async def test_an_unhealthy_gpu_is_refused_with_its_reason(api: Api) -> None:
    sick = gpus(H100, 8)
    sick[5] = {**sick[5], "healthy": False, "healthReasons": ["ecc_uncorrected"]}
    await register(api, "gpu-07", gpus=sick)

    got = await allocate(api, "r1", shard("r1-s0", "gpu-07", 4, 5))

    assert got["code"] == "GPU_UNHEALTHY"
    assert got["message"] == "GPU 5 on node gpu-07 is unhealthy (ecc_uncorrected)"
    assert (got["nodeId"], got["gpuIndex"]) == ("gpu-07", 5)


async def test_a_gpu_the_node_does_not_have_is_refused(api: Api) -> None:
    await register(api, "gpu-07")

    got = await allocate(api, "r1", shard("r1-s0", "gpu-07", 7, 8))

    assert got["code"] == "NO_SUCH_GPU"
    assert got["message"] == "node gpu-07 has no GPU 8; its GPUs are 0-7"
    assert got["gpuIndex"] == 8


async def test_an_unknown_node_is_refused(api: Api, engine: AsyncEngine) -> None:
    await register(api, "gpu-07")

    got = await allocate(api, "r1", shard("r1-s0", "gpu-07", 0), shard("r1-s1", "gpu-99", 0))

    assert got["code"] == "NO_SUCH_NODE"
    assert got["message"] == "node gpu-99 is not registered"
    assert got["nodeId"] == "gpu-99"
    # All or none: the shard on the node that exists was not kept either.
    assert await stored(engine) == NOTHING


async def test_a_cordoned_node_takes_no_new_allocations(api: Api) -> None:
    await register(api, "gpu-07")
    await api('mutation { cordonNode(id: "gpu-07", reason: "kernel upgrade") { id } }')

    got = await allocate(api, "r1", shard("r1-s0", "gpu-07", 0))

    assert got["code"] == "NODE_NOT_SCHEDULABLE"
    assert got["message"] == (
        "node gpu-07 is cordoned: kernel upgrade; it takes no new allocations"
    )


async def test_the_same_allocation_sent_again_answers_what_is_stored(
    api: Api, engine: AsyncEngine
) -> None:
    await register(api, "gpu-07")
    first = await allocate(api, "r1", shard("r1-s0", "gpu-07", 0, 1))

    # The scheduler timed out and retries, GPUs listed in another order.
    again = await allocate(api, "r1", shard("r1-s0", "gpu-07", 1, 0))

    assert again == first
    assert await stored(engine) == {"shards": 1, "allocated_gpus": 2, "allocation events": 1}


async def test_a_shard_id_reused_for_other_gpus_is_a_duplicate(api: Api) -> None:
    await register(api, "gpu-07")
    await allocate(api, "r1", shard("r1-s0", "gpu-07", 0, 1))

    got = await allocate(api, "r1", shard("r1-s0", "gpu-07", 2, 3))

    assert got["code"] == "DUPLICATE_SHARD"
    assert got["heldBy"] == "r1-s0"
    assert got["message"] == (
        "shard r1-s0 is already allocated to replica r1 on node gpu-07, GPUs 0-1; "
        "release it first or use a new shard id"
    )


async def test_all_or_none_when_a_later_shard_fails(api: Api, engine: AsyncEngine) -> None:
    await register(api, "gpu-01", fabrics=[IB_A])
    await register(api, "gpu-02", fabrics=[IB_A])
    await allocate(api, "other", shard("other-s0", "gpu-02", 6))

    got = await allocate(
        api, "r1", shard("r1-s0", "gpu-01", 0, 1, 2, 3), shard("r1-s1", "gpu-02", 4, 5, 6, 7)
    )

    assert got["code"] == "GPU_TAKEN" and got["heldBy"] == "other-s0"
    free = await api('{ node(id: "gpu-01") { freeGpus { index } } }')
    assert len(free["node"]["freeGpus"]) == 8
    assert await stored(engine) == {"shards": 1, "allocated_gpus": 1, "allocation events": 1}


async def test_a_replica_that_grows_onto_a_second_node_gets_one_fabric_for_all(api: Api) -> None:
    await register(api, "gpu-01", fabrics=[IB_A])
    await register(api, "gpu-02", fabrics=[IB_A])
    await allocate(api, "r1", shard("r1-s0", "gpu-01", 0))

    await allocate(api, "r1", shard("r1-s1", "gpu-02", 0))

    listed = await api('{ allocations(replicaId: "r1") { shardId fabric hcas } }')
    assert listed["allocations"] == [
        {"shardId": "r1-s0", "fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"]},
        {"shardId": "r1-s1", "fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"]},
    ]


LONG = "x" * 254


@pytest.mark.parametrize(
    ("shards", "field", "said"),
    [
        (
            [shard(f"r1-s{i}", "gpu-07", 0) for i in range(1000)],
            "input.shards",
            "'1,000 entries': at most 64 are accepted",
        ),
        (
            [shard("r1-s0", "gpu-07", *range(65))],
            "input.shards[0].gpuIndices",
            "'65 entries': at most 64 are accepted",
        ),
    ],
    ids=["a thousand shards", "too many gpus"],
)
async def test_a_list_past_its_bound_is_bad_input_naming_it_and_writes_nothing(
    api: Api, engine: AsyncEngine, shards: list[dict[str, Any]], field: str, said: str
) -> None:
    """Refused before the list is coerced (service/graphql/list_bounds.py), so a client
    learns the bound from the GraphQL error, not an AllocationRejected."""
    await register(api, "gpu-07")
    response = await api.client.post(
        "/graphql", json={"query": ALLOCATE, "variables": allocation("r1", *shards)}
    )
    [error] = response.json()["errors"]
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == field
    assert said in error["message"]
    assert await stored(engine) == NOTHING


@pytest.mark.parametrize(
    ("shards", "message"),
    [
        ([], "shards is empty: a replica needs at least one shard"),
        ([shard("r1-s0", "gpu-07")], "shard r1-s0 lists no GPUs (gpuIndices is empty)"),
        ([shard("r1-s0", "gpu-07", -1)], "shard r1-s0 asks for GPU -1; GPU indices start at 0"),
        ([shard("r1-s0", "gpu-07", 1, 1)], "shard r1-s0 lists GPU 1 twice"),
        (
            [shard("r1-s0", "gpu-07", 0, 1), shard("r1-s1", "gpu-07", 1, 2)],
            "GPU 1 on node gpu-07 is asked for by both shard r1-s0 and shard r1-s1",
        ),
        (
            [shard("r1-s0", "gpu-07", 0), shard("r1-s0", "gpu-07", 1)],
            "shard r1-s0 appears twice in this request",
        ),
        ([shard("r1-s0", "", 0)], "nodeId of shard r1-s0 is empty"),
    ],
    ids=[
        "no shards",
        "no gpus",
        "negative index",
        "repeated index",
        "one gpu in two shards",
        "repeated shard id",
        "empty node id",
    ],
)
async def test_bad_requests_are_refused_as_invalid_and_write_nothing(
    api: Api, engine: AsyncEngine, shards: list[dict[str, Any]], message: str
) -> None:
    await register(api, "gpu-07")

    got = await allocate(api, "r1", *shards)

    assert got["__typename"] == "AllocationRejected"
    assert (got["code"], got["message"]) == ("INVALID", message)
    assert await stored(engine) == NOTHING


@pytest.mark.parametrize(
    ("shard_id", "problem"),
    [
        (LONG, "254 characters: an id is at most 253 characters (MAX_ID_LENGTH)"),
        ("r1\x00s0", "contains a NUL character (U+0000) at character 2"),
        ("r1\ud800s0", "contains a lone surrogate (U+D800) at character 2"),
    ],
    ids=["over-long shard id", "NUL in an id", "lone surrogate in an id"],
)
async def test_an_id_that_cannot_be_stored_is_bad_input_naming_it_and_writes_nothing(
    api: Api, engine: AsyncEngine, shard_id: str, problem: str
) -> None:
    """Refused where every String and ID is (service/graphql/input_values.py), before the
    allocation's own checks: a GraphQL error naming the field, not an AllocationRejected."""
    await register(api, "gpu-07")
    # Sent as JSON escapes ("\\ud800"), as a client's JSON library writes them.
    body = json.dumps(
        {"query": ALLOCATE, "variables": allocation("r1", shard(shard_id, "gpu-07", 0))}
    )
    response = await api.client.post(
        "/graphql", content=body, headers={"content-type": "application/json"}
    )
    [error] = response.json()["errors"]
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == "input.shards[0].shardId"
    assert problem in error["message"]
    assert await stored(engine) == NOTHING


async def test_an_empty_replica_id_is_invalid(api: Api) -> None:
    got = await allocate(api, "", shard("s0", "gpu-07", 0))
    assert (got["code"], got["message"]) == ("INVALID", "replicaId is empty")


async def test_refusals_are_counted_by_code_for_the_dashboards(
    api: Api, client: httpx.AsyncClient
) -> None:
    await register(api, "gpu-07")
    await allocate(api, "r1", shard("r1-s0", "gpu-07", 0))
    before = await scrape(client)

    await allocate(api, "r2", shard("r2-s0", "gpu-07", 0))
    await allocate(api, "r3", shard("r3-s0", "gpu-99", 0))

    after = await scrape(client)
    for code in ("GPU_TAKEN", "NO_SUCH_NODE"):
        key = f'inventory_allocation_rejections_total{{code="{code}"}}'
        assert after[key] - before.get(key, 0) == 1


async def test_a_plain_allocation_is_two_statements(
    api: Api, engine: AsyncEngine, count_statements: StatementCounter
) -> None:
    await register(api, "gpu-07")

    count_statements.statements.clear()
    got = await allocate(api, "r1", shard("r1-s0", "gpu-07", 0, 1), shard("r1-s1", "gpu-07", 2))

    assert got["__typename"] == "Allocated"
    # Left out: the token check and the event announcements sent after commit.
    sent = [
        s for s in count_statements.statements if "api_tokens" not in s and "pg_notify" not in s
    ]
    # Lock the node; then check and store the shards, their GPUs, the pools and the events.
    assert len(sent) == 2, sent
    assert "FOR NO KEY UPDATE" in sent[0] and "INSERT INTO shards" in sent[1]
    assert await stored(engine) == {"shards": 2, "allocated_gpus": 3, "allocation events": 2}
    classes = await api("{ gpuClasses { gpuClass free allocated } }")
    assert classes["gpuClasses"] == [{"gpuClass": "H100-80GB", "free": 5, "allocated": 3}]
