"""Taints and tolerations: a taint keeps work off a GPU unless the request tolerates it.

Stories against the real database, through the API: a NO_SCHEDULE GPU is
placed only by a place that tolerates it, and every answer (freeGpus, fit,
explainPlacement, gpuClasses, allocate) agrees with place; NO_EXECUTE is
tolerated for placement like NO_SCHEDULE; PREFER_NO_SCHEDULE GPUs and nodes
are used last; a cordon shows as a taint; taints survive re-registration,
even of a GPU that left the report and came back.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.reports import (
    ALLOCATE,
    EXPLAIN,
    H100,
    PLACE,
    REGISTER,
    allocation,
    gpus,
    node_input,
    shard,
)

TAINT_GPUS = """
mutation T($node: ID!, $indices: [Int!]!, $taint: TaintInput!) {
  taintGpus(nodeId: $node, indices: $indices, taint: $taint) {
    index taints { key value effect source reason actor }
  }
}
"""
UNTAINT_GPUS = """
mutation U($node: ID!, $indices: [Int!]!, $key: String!) {
  untaintGpus(nodeId: $node, indices: $indices, key: $key) { index taints { key } }
}
"""
TAINT_NODE = """
mutation T($node: ID!, $taint: TaintInput!) {
  taintNode(nodeId: $node, taint: $taint) { id taints { key value effect source reason } }
}
"""
UNTAINT_NODE = (
    "mutation U($node: ID!, $key: String!) { untaintNode(nodeId: $node, key: $key) { id } }"
)
FREE = """
query F($cls: String, $min: Int, $tolerations: [TolerationInput!]) {
  freeGpus(gpuClass: $cls, minFree: $min, tolerations: $tolerations) { node { id } gpuIndices }
}
"""
FIT = """
query Fit($shape: PlaceInput!) { fit(shape: $shape) { replicas limitedBy { code nodes } } }
"""
CLASSES = "{ gpuClasses { gpuClass total free allocated unhealthy unschedulable tainted } }"
NODE = """
query N($id: ID!) {
  node(id: $id) { taints { key effect source reason } gpus { index taints { key effect source } } }
}
"""

XID = {"key": "xid-79", "effect": "NO_SCHEDULE", "reason": "fell off the bus"}
TOLERATE_XID = [{"key": "xid-79", "operator": "EXISTS"}]


def free_of(answer: dict[str, Any]) -> dict[str, list[int]]:
    return {e["node"]["id"]: e["gpuIndices"] for e in answer["freeGpus"]}


def shape(replica: str, per: int, shards: int = 1, **more: Any) -> dict[str, Any]:
    return {"replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": per, "shards": shards,
            **more}  # fmt: skip


async def place(api: Api, replica: str, per: int, **more: Any) -> dict[str, Any]:
    answer: dict[str, Any] = (await api(PLACE, {"input": shape(replica, per, **more)}))["place"]
    return answer


async def test_a_no_schedule_gpu_is_placed_only_by_a_place_that_tolerates_it(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    tainted = await api(TAINT_GPUS, {"node": "gpu-01", "indices": [5], "taint": XID})
    assert tainted["taintGpus"] == [
        {
            "index": 5,
            "taints": [
                {
                    "key": "xid-79",
                    "value": None,
                    "effect": "NO_SCHEDULE",
                    "source": "OPERATOR",
                    "reason": "fell off the bus",
                    "actor": None,
                }
            ],
        }
    ]
    # Seven offered, eight to a request that tolerates the taint.
    assert free_of(await api(FREE, {})) == {"gpu-01": [0, 1, 2, 3, 4, 6, 7]}
    assert free_of(await api(FREE, {"tolerations": TOLERATE_XID})) == {"gpu-01": list(range(8))}
    summary = (await api(CLASSES))["gpuClasses"]
    assert summary == [
        {"gpuClass": "H100-80GB", "total": 8, "free": 7, "allocated": 0, "unhealthy": 0,
         "unschedulable": 0, "tainted": 1}
    ]  # fmt: skip

    # A TP-8 does not fit, and the verdict names the taint.
    refused = await place(api, "tp8", 8)
    assert refused["__typename"] == "Unplaceable"
    [verdict] = refused["verdicts"]
    assert verdict["code"] == "TAINTED"
    assert "xid-79:NO_SCHEDULE on GPU 5 (OPERATOR: fell off the bus)" in verdict["detail"]
    assert (await api(FIT, {"shape": shape("x", 8)}))["fit"] == {
        "replicas": 0,
        "limitedBy": [{"code": "TAINTED", "nodes": 1}],
    }
    # A TP-4 still places on the other seven.
    placed = await place(api, "tp4", 4)
    assert placed["allocations"][0]["gpuIndices"] == [0, 1, 2, 3]
    # The last four need GPU 5: only with the toleration.
    assert (await place(api, "tp4-b", 4))["__typename"] == "Unplaceable"
    tolerated = await place(api, "tp4-b", 4, tolerations=TOLERATE_XID)
    assert tolerated["allocations"][0]["gpuIndices"] == [4, 5, 6, 7]
    assert await inconsistencies(engine) == []


async def test_fit_explain_and_freegpus_agree_with_place_on_tolerations(api: Api) -> None:
    for node_id in ("a", "b", "c"):
        await api(REGISTER, {"input": node_input(node_id)})
    await api(TAINT_GPUS, {"node": "a", "indices": [0, 1, 2, 3], "taint": XID})
    dedicated = {"key": "dedicated", "value": "inference", "effect": "NO_EXECUTE", "reason": "x"}
    await api(TAINT_NODE, {"node": "b", "taint": dedicated})
    tolerations = [
        {"key": "dedicated", "value": "inference", "effect": "NO_EXECUTE", "tolerationSeconds": 60}
    ]
    for given, fits in ((None, 1 + 0 + 2), (tolerations, 1 + 2 + 2), (TOLERATE_XID, 2 + 0 + 2)):
        extra = {} if given is None else {"tolerations": given}
        counted = (await api(FIT, {"shape": shape("x", 4, **extra)}))["fit"]["replicas"]
        assert counted == fits, given
        free = free_of(await api(FREE, {"min": 4, **({"tolerations": given} if given else {})}))
        assert sum(len(i) // 4 for i in free.values()) == fits
        explained = (await api(EXPLAIN, {"input": shape("x", 4, **extra)}))["explainPlacement"]
        assert explained["placeable"]
        placed = 0
        while (await place(api, f"{given is None}-{placed}", 4, **extra))["__typename"] == (
            "Allocated"
        ):
            placed += 1
        assert placed == fits, given
        for i in range(placed):
            await api(
                "mutation R($id: ID!) { releaseReplica(replicaId: $id) }",
                {"id": f"{given is None}-{i}"},
            )


async def test_allocate_refuses_a_tainted_gpu_unless_tolerated(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    await api(TAINT_GPUS, {"node": "gpu-01", "indices": [3], "taint": XID})
    refused = (await api(ALLOCATE, allocation("r1", shard("r1-s0", "gpu-01", 2, 3))))["allocate"]
    assert refused["code"] == "GPU_TAINTED"
    assert refused["gpuIndex"] == 3
    assert "xid-79:NO_SCHEDULE" in refused["message"]
    asked = allocation("r1", shard("r1-s0", "gpu-01", 2, 3))
    asked["input"]["tolerations"] = TOLERATE_XID
    held = (await api(ALLOCATE, asked))["allocate"]
    assert held["__typename"] == "Allocated"
    assert await inconsistencies(engine) == []


async def test_a_node_taint_withholds_every_gpu_it_has(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    await api(REGISTER, {"input": node_input("gpu-02")})
    node = await api(
        TAINT_NODE,
        {"node": "gpu-01", "taint": {"key": "psu", "effect": "NO_SCHEDULE", "reason": "PSU swap"}},
    )
    assert node["taintNode"]["taints"] == [
        {"key": "psu", "value": None, "effect": "NO_SCHEDULE", "source": "OPERATOR",
         "reason": "PSU swap"}
    ]  # fmt: skip
    assert free_of(await api(FREE, {})) == {"gpu-02": list(range(8))}
    placed = await place(api, "r", 8)
    assert placed["allocations"][0]["nodeId"] == "gpu-02"
    refused = await place(api, "r2", 8)
    assert {v["nodeId"]: v["code"] for v in refused["verdicts"]} == {
        "gpu-01": "TAINTED",
        "gpu-02": "NOT_ENOUGH_GPUS",
    }
    assert "psu:NO_SCHEDULE on the node" in refused["verdicts"][0]["detail"]
    # The node's taint is the node's: its GPUs list only their own.
    shown = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert [t["key"] for t in shown["taints"]] == ["psu"]
    assert all(g["taints"] == [] for g in shown["gpus"])
    await api(UNTAINT_NODE, {"node": "gpu-01", "key": "psu"})
    assert (await place(api, "r2", 8))["allocations"][0]["nodeId"] == "gpu-01"
    assert await inconsistencies(engine) == []


async def test_prefer_no_schedule_is_used_last(api: Api, engine: AsyncEngine) -> None:
    # Two nodes; the better fit (fewer free) prefers no new work on GPUs 0-1.
    await api(REGISTER, {"input": node_input("tight", gpus=gpus(H100, 4))})
    await api(REGISTER, {"input": node_input("roomy")})
    soft = {"key": "burn-in", "effect": "PREFER_NO_SCHEDULE", "reason": "new node"}
    await api(TAINT_GPUS, {"node": "tight", "indices": [0, 1], "taint": soft})
    # Offered to everyone: freeGpus lists them.
    assert free_of(await api(FREE, {})) == {"tight": [0, 1, 2, 3], "roomy": list(range(8))}
    # A TP-2 fits tight's untainted GPUs: best fit, and GPUs 2-3 before 0-1.
    first = await place(api, "a", 2)
    assert (first["allocations"][0]["nodeId"], first["allocations"][0]["gpuIndices"]) == (
        "tight",
        [2, 3],
    )
    # The next TP-2 would need tight's last-resort GPUs: roomy first, though it fits worse.
    second = await place(api, "b", 2)
    assert second["allocations"][0]["nodeId"] == "roomy"
    # A request that tolerates the taint packs as if there were none.
    third = await place(
        api, "c", 2, tolerations=[{"key": "burn-in", "effect": "PREFER_NO_SCHEDULE"}]
    )
    assert (third["allocations"][0]["nodeId"], third["allocations"][0]["gpuIndices"]) == (
        "tight",
        [0, 1],
    )
    assert await inconsistencies(engine) == []


async def test_a_cordon_shows_as_an_operator_taint(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    await api('mutation { cordonGpu(nodeId: "gpu-01", index: 1, reason: "fan noise") { index } }')
    await api('mutation { drainNode(id: "gpu-01", reason: "kernel") { id } }')
    shown = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert shown["taints"] == [
        {"key": "drain", "effect": "NO_SCHEDULE", "source": "OPERATOR", "reason": "kernel"}
    ]
    assert shown["gpus"][1]["taints"] == [
        {"key": "cordon", "effect": "NO_SCHEDULE", "source": "OPERATOR"}
    ]
    # A cordon is lifted, never tolerated.
    error = await place(api, "r", 1, tolerations=[{"key": "cordon", "operator": "EXISTS"}])
    assert error["code"] == "INVALID" and "tolerations[0].key" in error["message"]
    lift = await api.fails(UNTAINT_GPUS, {"node": "gpu-01", "indices": [1], "key": "cordon"})
    assert lift["extensions"]["field"] == "key" and "uncordonGpu" in lift["message"]


async def test_taints_survive_re_registration_and_a_gpu_that_came_back(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    await api(TAINT_GPUS, {"node": "gpu-01", "indices": [7], "taint": XID})
    # The GPU falls off the bus: the next report lists seven...
    await api(REGISTER, {"input": node_input("gpu-01", gpus=gpus(H100, 7))})
    # ... and after the reboot it is back, still tainted.
    await api(REGISTER, {"input": node_input("gpu-01", memoryTotalMb=2048)})
    gpus_now = (await api(NODE, {"id": "gpu-01"}))["node"]["gpus"]
    assert gpus_now[7]["taints"] == [
        {"key": "xid-79", "effect": "NO_SCHEDULE", "source": "OPERATOR"}
    ]
    assert free_of(await api(FREE, {})) == {"gpu-01": list(range(7))}
    assert await inconsistencies(engine) == []


BAD_TAINTS = [
    ({"key": "", "effect": "NO_SCHEDULE", "reason": "x"}, "taint.key"),
    ({"key": "a b", "effect": "NO_SCHEDULE", "reason": "x"}, "taint.key"),
    ({"key": "cordon", "effect": "NO_SCHEDULE", "reason": "x"}, "taint.key"),
    ({"key": "k", "effect": "NO_SCHEDULE", "reason": "  "}, "taint.reason"),
]


async def stored(engine: AsyncEngine) -> tuple[Any, ...]:
    async with engine.connect() as conn:
        found = []
        for table in ("taints", "gpus", "gpu_pools", "events"):
            found.append((await conn.execute(text(f"SELECT * FROM {table} ORDER BY 1, 2"))).all())
    return tuple(found)


@pytest.mark.parametrize(("taint", "field"), BAD_TAINTS)
async def test_a_bad_taint_is_refused_naming_the_field_and_changes_nothing(
    api: Api, engine: AsyncEngine, taint: dict[str, Any], field: str
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    before = await stored(engine)
    error = await api.fails(TAINT_GPUS, {"node": "gpu-01", "indices": [0], "taint": taint})
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == field
    assert await stored(engine) == before


async def test_bad_gpus_keys_and_effects_are_refused(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, {"input": node_input("gpu-01", gpus=gpus(H100, 4))})
    before = await stored(engine)
    error = await api.fails(TAINT_GPUS, {"node": "gpu-01", "indices": [1, 9], "taint": XID})
    assert error["extensions"]["field"] == "indices[1]"
    assert "has no GPU 9; its GPUs are 0-3" in error["message"]
    error = await api.fails(UNTAINT_GPUS, {"node": "gpu-01", "indices": [1], "key": "nope"})
    assert error["extensions"]["field"] == "key" and "no taint 'nope'" in error["message"]
    error = await api.fails(UNTAINT_NODE, {"node": "gpu-01", "key": "nope"})
    assert error["extensions"]["field"] == "key"
    # An unknown effect is refused by the schema, naming it.
    error = await api.fails(
        TAINT_GPUS,
        {"node": "gpu-01", "indices": [0], "taint": {**XID, "effect": "NO_WAY"}},
    )
    assert "NO_WAY" in error["message"]
    error = await api.fails(TAINT_GPUS, {"node": "gpu-99", "indices": [0], "taint": XID})
    assert error["extensions"]["code"] == "NODE_NOT_FOUND"
    assert await stored(engine) == before


BAD_TOLERATIONS = [
    ([{"key": "", "operator": "EXISTS"}], "tolerations[0].key"),
    ([{"key": "k", "operator": "EXISTS", "value": "v"}], "tolerations[0].value"),
    ([{"key": "k", "tolerationSeconds": -1}], "tolerations[0].tolerationSeconds"),
    (
        [{"key": "k"}, {"key": "k", "effect": "NO_SCHEDULE", "tolerationSeconds": 5}],
        "tolerations[1].tolerationSeconds",
    ),
]


@pytest.mark.parametrize(("tolerations", "field"), BAD_TOLERATIONS)
async def test_a_bad_toleration_is_refused_naming_the_field(
    api: Api, engine: AsyncEngine, tolerations: list[dict[str, Any]], field: str
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    before = await stored(engine)
    placed = await place(api, "r", 1, tolerations=tolerations)
    assert placed["code"] == "INVALID" and placed["message"].startswith(field + "=")
    explained = await api.fails(EXPLAIN, {"input": shape("r", 1, tolerations=tolerations)})
    assert explained["extensions"]["code"] == "BAD_INPUT" and field in explained["message"]
    free = await api.fails(FREE, {"tolerations": tolerations})
    assert free["extensions"] == {**free["extensions"], "code": "BAD_INPUT", "field": field}
    asked = allocation("r", shard("r-s0", "gpu-01", 0))
    asked["input"]["tolerations"] = tolerations
    refused = (await api(ALLOCATE, asked))["allocate"]
    assert refused["code"] == "INVALID" and refused["message"].startswith(field + "=")
    assert await stored(engine) == before
