"""An operator takes one flaky GPU out of placement, and puts it back: stories through the API."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.gpu_cordons import CLEAR, EVENTS, stored
from tests.support.reports import (
    ALLOCATE,
    EXPLAIN,
    PLACE,
    REGISTER,
    allocation,
    gpus,
    node_input,
    shard,
)
from tests.support.reports import H100 as H100_MODEL

H100 = "H100-80GB"
CORDON = """
mutation($node: ID!, $index: Int!, $reason: String!) {
  cordonGpu(nodeId: $node, index: $index, reason: $reason) { index healthy cordonReason }
}
"""
UNCORDON = """
mutation($node: ID!, $index: Int!) {
  uncordonGpu(nodeId: $node, index: $index) { index healthy cordonReason }
}
"""


async def free_on(api: Api, node_id: str) -> dict[str, list[int]]:
    """Every way a scheduler sees the node's free GPUs, which must agree."""
    scheduler = (await api("{ freeGpus { node { id } gpuIndices } }"))["freeGpus"]
    node = (await api(f'{{ node(id: "{node_id}") {{ freeGpus {{ index }} }} }}'))["node"]
    classes = (await api("{ gpuClasses { gpuClass free } }"))["gpuClasses"]
    explained = await api(
        EXPLAIN, {"input": {"replicaId": "x", "gpuClass": H100, "gpusPerShard": 1}}
    )
    verdict = explained["explainPlacement"]["verdicts"][0]
    return {
        "freeGpus": next(e["gpuIndices"] for e in scheduler if e["node"]["id"] == node_id),
        "Node.freeGpus": [g["index"] for g in node["freeGpus"]],
        "gpuClasses": [c["free"] for c in classes if c["gpuClass"] == H100],
        "explainPlacement": [int(verdict["detail"].split()[0])],
    }


async def test_a_cordoned_gpu_survives_re_registration_and_is_never_handed_out(
    api_as: Any, engine: AsyncEngine
) -> None:
    agent = await api_as("agent", node_id="gpu-01")
    operator = await api_as("operator")
    scheduler = await api_as("scheduler")
    report = node_input("gpu-01", gpus=gpus(H100_MODEL, 4))
    await agent(REGISTER, {"input": report})

    cordoned = await operator(CORDON, {"node": "gpu-01", "index": 2, "reason": "ECC bursts"})
    assert cordoned["cordonGpu"] == {"index": 2, "healthy": True, "cordonReason": "ECC bursts"}
    assert await free_on(operator, "gpu-01") == {
        "freeGpus": [0, 1, 3],
        "Node.freeGpus": [0, 1, 3],
        "gpuClasses": [3],
        "explainPlacement": [3],
    }

    # The agent re-registers, with the same report and with a changed one.
    await agent(REGISTER, {"input": report})
    await agent(REGISTER, {"input": {**report, "memoryTotalMb": 2048 * 1024}})
    node = (await operator('{ node(id: "gpu-01") { gpus { index cordonReason } } }'))["node"]
    assert [g["cordonReason"] for g in node["gpus"]] == [None, None, "ECC bursts", None]

    refused = (await scheduler(ALLOCATE, allocation("r1", shard("r1-s0", "gpu-01", 1, 2))))[
        "allocate"
    ]
    assert refused["__typename"] == "AllocationRejected"
    assert (refused["code"], refused["gpuIndex"]) == ("GPU_CORDONED", 2)
    assert refused["message"] == "GPU 2 on node gpu-01 is cordoned (ECC bursts)"
    # place() takes the other three, and then finds no room.
    placed = (
        await scheduler(PLACE, {"input": {"replicaId": "r2", "gpuClass": H100, "gpusPerShard": 3}})
    )["place"]
    assert placed["allocations"][0]["gpuIndices"] == [0, 1, 3]

    uncordoned = await operator(UNCORDON, {"node": "gpu-01", "index": 2})
    assert uncordoned["uncordonGpu"] == {"index": 2, "healthy": True, "cordonReason": None}
    node = (await operator('{ node(id: "gpu-01") { freeGpus { index } } }'))["node"]
    assert node["freeGpus"] == [{"index": 2}]

    events = (await operator(EVENTS, {"kinds": ["gpu_cordoned", "gpu_uncordoned"]}))["events"]
    assert [
        (e["kind"], e["actor"].split(" (")[0], e["reason"], e["detail"]["index"]) for e in events
    ] == [
        ("gpu_cordoned", "test operator", "ECC bursts", 2),
        ("gpu_uncordoned", "test operator", None, 2),
    ]
    assert await inconsistencies(engine) == []


async def test_what_runs_on_a_gpu_keeps_running_and_its_holder_is_told(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01", gpus=gpus(H100_MODEL, 4))})
    held = await api(ALLOCATE, allocation("r1", shard("r1-s0", "gpu-01", 0, 1)))
    assert held["allocate"]["__typename"] == "Allocated"

    await api(CORDON, {"node": "gpu-01", "index": 1, "reason": "fan noise"})

    shards = (await api('{ allocations(replicaId: "r1") { shardId gpuIndices } }'))["allocations"]
    assert shards == [{"shardId": "r1-s0", "gpuIndices": [0, 1]}]
    told = (await api(EVENTS, {"kinds": ["gpu_failed_under_allocation"]}))["events"]
    assert [(e["replicaId"], e["shardId"], e["reason"], e["detail"]["index"]) for e in told] == [
        ("r1", "r1-s0", "cordoned: fan noise", 1)
    ]
    # Released, the cordoned GPU does not come back as free.
    await api('mutation { releaseReplica(replicaId: "r1") }')
    node = (await api('{ node(id: "gpu-01") { freeGpus { index } } }'))["node"]
    assert node["freeGpus"] == [{"index": 0}, {"index": 2}, {"index": 3}]
    assert await inconsistencies(engine) == []


@pytest.mark.parametrize(
    ("query", "variables", "code", "field", "words"),
    [
        (CORDON, {"node": "gpu-99", "index": 0, "reason": "x"}, "NODE_NOT_FOUND", None, "gpu-99"),
        (UNCORDON, {"node": "gpu-99", "index": 0}, "NODE_NOT_FOUND", None, "gpu-99"),
        (CLEAR, {"node": "gpu-99", "index": 0}, "NODE_NOT_FOUND", None, "gpu-99"),
        (
            CORDON,
            {"node": "gpu-01", "index": 9, "reason": "x"},
            "BAD_INPUT",
            "index",
            "node gpu-01 has no GPU 9; its GPUs are 0-3",
        ),
        (UNCORDON, {"node": "gpu-01", "index": 9}, "BAD_INPUT", "index", "has no GPU 9"),
        (CLEAR, {"node": "gpu-01", "index": -1}, "BAD_INPUT", "index", "has no GPU -1"),
        (CORDON, {"node": "gpu-01", "index": 0, "reason": "  "}, "BAD_INPUT", "reason", "why"),
    ],
)
async def test_bad_requests_change_nothing(
    api: Api,
    engine: AsyncEngine,
    query: str,
    variables: dict[str, Any],
    code: str,
    field: str | None,
    words: str,
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01", gpus=gpus(H100_MODEL, 4))})
    await api(CORDON, {"node": "gpu-01", "index": 3, "reason": "kept"})
    before = await stored(engine)

    error = await api.fails(query, variables)

    assert error["extensions"]["code"] == code
    assert error["extensions"].get("field") == field
    assert words in error["message"]
    assert await stored(engine) == before


@pytest.mark.parametrize("role", ["agent", "reader", "scheduler"])
async def test_only_operators_touch_a_gpu(api_as: Any, engine: AsyncEngine, role: str) -> None:
    operator = await api_as("operator")
    await operator(REGISTER, {"input": node_input("gpu-01", gpus=gpus(H100_MODEL, 4))})
    caller = await api_as(role, node_id="gpu-01" if role == "agent" else None)
    before = await stored(engine)
    for query, variables in (
        (CORDON, {"node": "gpu-01", "index": 0, "reason": "mine"}),
        (UNCORDON, {"node": "gpu-01", "index": 0}),
        (CLEAR, {"node": "gpu-01", "index": 0}),
    ):
        error = await caller.fails(query, variables)
        assert error["extensions"]["code"] == "FORBIDDEN", error
    assert await stored(engine) == before
