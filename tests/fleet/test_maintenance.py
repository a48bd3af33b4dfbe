"""The rack upgrade of docs/operations/maintenance.md, step by step, as a scheduler and an operator see it.

A rack of three nodes (rack-0..2) and two spares (spare-0, spare-1), 8 H100
each. Tenant prod runs deployment chat, 3 replicas of 4 GPUs, one per rack
node, with a disruption budget of minAvailable 2; deployment solo (1 replica,
minAvailable 1) and a replica in no deployment also run on the rack. The
window is seconds long; the transitions loop's rounds are run by the test
(tests/fleet/test_maintenance_processes.py runs them in two service
processes on their own), so every step is looked at before the next.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.fencing import BEAT
from tests.support.groups import PLACE_GROUP
from tests.support.maintenance import (
    EVENTS,
    MOVES,
    WINDOW,
    allocate,
    at,
    maintenance_taints,
    one_round,
    schedule,
    window,
)
from tests.support.reports import REGISTER, node_input
from tests.support.tenancy import EXPLAIN, FIT, PLACE, RELEASE, SET_BUDGET, set_tenant

RACK = ["rack-0", "rack-1", "rack-2"]
SPARES = ["spare-0", "spare-1"]


async def until_state(engine: AsyncEngine, api: Api, window_id: str, state: str) -> None:
    """Run the loop's rounds (as a service process would, every 0.2 s) until the window is in `state`."""
    for _ in range(100):
        await one_round(engine)
        if (await window(api, window_id))["state"] == state:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{window_id} never reached {state}")


async def moves(api: Api) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await api(MOVES))["shardsToMove"]
    return found


async def events(api: Api, *kinds: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await api(EVENTS, {"kinds": list(kinds)}))["events"]
    return found


async def place(api: Api, replica_id: str, **fields: Any) -> dict[str, Any]:
    shape = {"replicaId": replica_id, "gpuClass": "H100-80GB", "gpusPerShard": 4, **fields}
    answer: dict[str, Any] = (await api(PLACE, {"input": shape}))["place"]
    return answer


async def test_a_rack_upgrade_moves_a_deployment_one_replica_at_a_time(
    api: Api, engine: AsyncEngine
) -> None:
    for node_id in RACK:
        await api(REGISTER, {"input": node_input(node_id)})
    await set_tenant(api, "prod")
    await api(SET_BUDGET, {"input": {"deployment": "chat", "tenant": "prod", "minAvailable": 2}})
    for i, node_id in enumerate(RACK):
        await allocate(api, f"chat-{i}", node_id, [0, 1, 2, 3], tenant="prod", deployment="chat")
    await allocate(api, "solo-0", "rack-0", [4, 5], tenant="prod", deployment="solo")
    await api(SET_BUDGET, {"input": {"deployment": "solo", "tenant": "prod", "minAvailable": 1}})
    await allocate(api, "batch-0", "rack-1", [4, 5])
    for node_id in SPARES:
        await api(REGISTER, {"input": node_input(node_id)})

    # 1. The operator books the window: 8 s of drain, then 3 s of upgrade.
    booked = await schedule(
        api, window_id="rack-upgrade", node_ids=RACK, start=at(10), end=at(13), drain_lead=8
    )
    assert (booked["state"], booked["replicasLeft"], booked["nodeIds"]) == ("SCHEDULED", 5, RACK)
    await one_round(engine)
    # Booked, not yet draining: nothing asked, no taint, the rack still offered.
    assert await moves(api) == []
    assert await maintenance_taints(api, "rack-0") == []

    # 2. DRAINING: the rack carries the window's PREFER_NO_SCHEDULE taint...
    await until_state(engine, api, "rack-upgrade", "DRAINING")
    for node_id in RACK:
        assert await maintenance_taints(api, node_id) == [
            {"key": "maintenance", "value": "rack-upgrade", "effect": "PREFER_NO_SCHEDULE",
             "source": "MAINTENANCE"}
        ]  # fmt: skip
    # ...new places avoid it (MAINTENANCE), unless released before the start...
    explained = (await api(EXPLAIN, {"input": _shape("probe")}))["explainPlacement"]
    codes = {v["nodeId"]: v["code"] for v in explained["verdicts"]}
    assert {codes[n] for n in RACK} == {"MAINTENANCE"}
    assert {codes[n] for n in SPARES} == {"FITS"}
    # Released at the very start ([start, end) is half-open): the rack is open to it.
    early = {**_shape("probe"), "until": booked["start"]}
    explained = (await api(EXPLAIN, {"input": early}))["explainPlacement"]
    codes = {v["nodeId"]: v["code"] for v in explained["verdicts"]}
    assert "MAINTENANCE" not in codes.values()
    assert codes["rack-2"] == "FITS"  # 4 free; rack-0 and rack-1 have 2
    late = {**_shape("probe"), "until": at(60)}
    explained = (await api(EXPLAIN, {"input": late}))["explainPlacement"]
    assert {v["code"] for v in explained["verdicts"] if v["nodeId"] in RACK} == {"MAINTENANCE"}
    # fit counts as place would: the spares' room only, the rack MAINTENANCE.
    fitted = (await api(FIT, {"shape": _shape("probe")}))["fit"]
    assert fitted["replicas"] == 4
    assert {n["nodeId"] for n in fitted["nodes"]} == set(SPARES)
    assert {"code": "MAINTENANCE", "nodes": 3} in fitted["limitedBy"]
    # ...and the first wave asks one chat replica (3 placed, minAvailable 2) and
    # the replica in no deployment; solo (1 placed, minAvailable 1) is never asked.
    first = await moves(api)
    assert {m["allocation"]["replicaId"] for m in first} == {"chat-0", "batch-0"}
    for m in first:
        assert m["maintenanceWindow"] == "rack-upgrade"
        assert m["taint"] == {"key": "maintenance", "value": "rack-upgrade",
                              "effect": "PREFER_NO_SCHEDULE", "source": "MAINTENANCE"}  # fmt: skip
    asked = await events(api, "replica_must_move")
    assert sorted(e["replicaId"] for e in asked) == ["batch-0", "chat-0"]
    assert all(e["detail"]["maintenanceWindow"] == "rack-upgrade" for e in asked)

    # 3. Waves: the scheduler places each replacement (off the rack), releases
    # the old one, and only then is the next one asked.
    for i in range(3):
        replaced = f"chat-{i}"
        await one_round(engine)
        outstanding = [m["allocation"]["replicaId"] for m in await moves(api)]
        assert [r for r in outstanding if r.startswith("chat")] == [replaced]
        got = await place(api, f"chat-new-{i}", tenant="prod", deployment="chat")
        assert got["__typename"] == "Allocated", got
        assert got["allocations"][0]["nodeId"] in SPARES
        # Replacement placed, old one still placed: no second ask at once.
        await one_round(engine)
        outstanding = [m["allocation"]["replicaId"] for m in await moves(api)]
        assert [r for r in outstanding if r.startswith("chat")] == [replaced]
        await api(RELEASE, {"id": replaced})
    await api(RELEASE, {"id": "batch-0"})
    await one_round(engine)
    assert await moves(api) == []
    left = await window(api, "rack-upgrade")
    assert (left["state"], left["replicasLeft"]) == ("DRAINING", 1)  # solo-0
    # Each chat replica was asked once, in its own wave.
    chat_asks = [e["replicaId"] for e in await events(api, "replica_must_move")]
    assert sorted(r for r in chat_asks if r.startswith("chat")) == ["chat-0", "chat-1", "chat-2"]

    # An operator's own taint on a rack node outlives the window.
    await api(
        """mutation { taintNode(nodeId: "rack-2", taint: {key: "fw", effect: PREFER_NO_SCHEDULE,
           reason: "firmware 1.2 pending"}) { id } }"""
    )

    # 4. IN_PROGRESS: NO_SCHEDULE, and solo-0, still there, is released and
    # told to stop; its budget is named.
    fence = await _fence_of(api, "solo-0")
    await until_state(engine, api, "rack-upgrade", "IN_PROGRESS")
    assert (await maintenance_taints(api, "rack-0"))[0]["effect"] == "NO_SCHEDULE"
    broken = await events(api, "maintenance_budget_broken")
    assert [(e["detail"]["deployment"], e["detail"]["minAvailable"]) for e in broken] == [
        ("solo", 1)
    ]
    beat = await api(BEAT, {"id": "rack-0", "running": [{"shardId": "solo-0-s0", "fence": fence}]})
    assert beat["heartbeat"]["shardsToStop"] == [
        {"shardId": "solo-0-s0", "fence": fence, "reason": "MAINTENANCE"}
    ]
    assert (await window(api, "rack-upgrade"))["replicasLeft"] == 0

    # 5. DONE: the window's taint lifted, the operator's stays.
    await until_state(engine, api, "rack-upgrade", "DONE")
    assert await maintenance_taints(api, "rack-0") == []
    keys = {t["key"] for t in (await api(_TAINTS_OF, {"id": "rack-2"}))["node"]["taints"]}
    assert keys == {"fw"}
    # The rack takes work again.
    explained = (await api(EXPLAIN, {"input": _shape("probe")}))["explainPlacement"]
    assert "MAINTENANCE" not in {v["code"] for v in explained["verdicts"]}

    # Each transition happened once, each with its event.
    kinds = [
        e["kind"]
        for e in await events(
            api, "maintenance_draining", "maintenance_started", "maintenance_done"
        )
    ]
    assert kinds == ["maintenance_draining", "maintenance_started", "maintenance_done"]


_TAINTS_OF = "query T($id: ID!) { node(id: $id) { taints { key } } }"
_FENCE = "query F($r: ID!) { allocations(replicaId: $r) { fence } }"


async def _fence_of(api: Api, replica_id: str) -> int:
    fence: int = (await api(_FENCE, {"r": replica_id}))["allocations"][0]["fence"]
    return fence


def _shape(replica_id: str) -> dict[str, Any]:
    return {"replicaId": replica_id, "gpuClass": "H100-80GB", "gpusPerShard": 4}


async def test_cancelling_a_draining_window_lifts_its_taint_and_forgets_its_asks(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("rack-0")})
    await allocate(api, "r-0", "rack-0", [0])
    await schedule(api, window_id="w", node_ids=["rack-0"], start=at(30), end=at(60), drain_lead=60)
    await until_state(engine, api, "w", "DRAINING")
    assert len(await moves(api)) == 1
    cancelled = (await api(_CANCEL, {"id": "w"}))["cancelMaintenance"]
    assert cancelled["state"] == "CANCELLED"
    assert await maintenance_taints(api, "rack-0") == []
    assert await moves(api) == []
    # Nothing more happens to it, and a second cancel answers it as it is.
    await one_round(engine)
    assert (await api(_CANCEL, {"id": "w"}))["cancelMaintenance"]["state"] == "CANCELLED"
    assert [e["kind"] for e in await events(api, "maintenance_cancelled")] == [
        "maintenance_cancelled"
    ]
    assert (await api(WINDOW, {"id": "w"}))["maintenanceWindow"]["replicasLeft"] == 0
    # The replica was never told to stop.
    assert (await api(_FENCE, {"r": "r-0"}))["allocations"]


_CANCEL = "mutation C($id: ID!) { cancelMaintenance(id: $id) { state } }"


def test_times_are_utc() -> None:
    assert datetime.fromisoformat(at(0)).tzinfo is not None


async def test_placement_groups_avoid_a_draining_node_too(api: Api) -> None:
    for node_id in ("rack-0", "spare-0"):
        await api(REGISTER, {"input": node_input(node_id)})
    # Draining from now: start in an hour, an hour and a half of drain.
    await schedule(
        api, window_id="w", node_ids=["rack-0"], start=at(3600), end=at(7200), drain_lead=5400
    )
    role = {"role": "r", "replicas": 1,
            "shape": {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": 8}}  # fmt: skip
    one = await api(PLACE_GROUP, {"input": {"groupId": "g1", "roles": [role]}})
    assert one["placeGroup"]["__typename"] == "GroupPlaced", one
    (member,) = one["placeGroup"]["members"]
    assert [a["nodeId"] for a in member["allocations"]] == ["spare-0"]
    # The only node left with room is the draining one: no room.
    two = await api(PLACE_GROUP, {"input": {"groupId": "g2", "roles": [role]}})
    assert two["placeGroup"]["__typename"] == "Unplaceable", two


_ALLOCATE = """
mutation A($input: AllocateInput!) {
  allocate(input: $input) {
    __typename
    ... on Allocated { allocations { shardId nodeId gpuIndices } }
    ... on AllocationRejected { code message nodeId }
  }
}
"""


async def _allocate(
    api: Api, replica_id: str, node_id: str, indices: tuple[int, ...] = (0, 1)
) -> dict[str, Any]:
    shards = [{"shardId": f"{replica_id}-s0", "nodeId": node_id, "gpuIndices": list(indices)}]
    request = {"replicaId": replica_id, "shards": shards}
    answer: dict[str, Any] = (await api(_ALLOCATE, {"input": request}))["allocate"]
    return answer


async def test_allocate_refuses_a_draining_node_as_place_does(api: Api) -> None:
    """allocate names its GPUs, yet a window in force keeps it off as it keeps place off (MAINTENANCE)."""
    for node_id in ("rack-0", "spare-0"):
        await api(REGISTER, {"input": node_input(node_id)})
    start = at(3600)
    # Draining from now (start in an hour, an hour and a half of drain).
    await schedule(
        api, window_id="rack-fw", node_ids=["rack-0"], start=start, end=at(7200), drain_lead=5400
    )
    refused = await _allocate(api, "r-0", "rack-0")
    assert refused["__typename"] == "AllocationRejected", refused
    assert refused["code"] == "MAINTENANCE" and refused["nodeId"] == "rack-0", refused
    assert "node rack-0 is in maintenance window rack-fw" in refused["message"], refused
    # What place says of the same node, for the same replica.
    shape = {"replicaId": "r-0", "gpuClass": "H100-80GB", "gpusPerShard": 2}
    verdicts = (await api(EXPLAIN, {"input": shape}))["explainPlacement"]["verdicts"]
    assert {v["nodeId"]: v["code"] for v in verdicts}["rack-0"] == "MAINTENANCE", verdicts
    # Another node is not refused.
    assert (await _allocate(api, "r-1", "spare-0", tuple(range(8))))["__typename"] == "Allocated"
    # The rule reads the replica's `until`: a place promising to be gone by
    # the start gets the node, one without a promise does not.
    assert (await place(api, "p-0"))["__typename"] == "Unplaceable"
    in_time = await place(api, "p-1", until=start)
    assert in_time["__typename"] == "Allocated", in_time
    assert [a["nodeId"] for a in in_time["allocations"]] == ["rack-0"]


async def test_allocate_takes_a_node_whose_window_drains_later_or_was_cancelled(api: Api) -> None:
    for node_id in ("rack-0", "rack-1"):
        await api(REGISTER, {"input": node_input(node_id)})
    # rack-0 drains in half an hour: nothing is refused yet.
    await schedule(api, window_id="w0", node_ids=["rack-0"], start=at(3600), end=at(7200),
                   drain_lead=1800)  # fmt: skip
    assert (await _allocate(api, "r-0", "rack-0"))["__typename"] == "Allocated"
    # rack-1 drains now; once cancelled, it takes replicas again.
    await schedule(api, window_id="w1", node_ids=["rack-1"], start=at(3600), end=at(7200))
    assert (await _allocate(api, "r-1", "rack-1"))["code"] == "MAINTENANCE"
    await api(_CANCEL, {"id": "w1"})
    assert (await _allocate(api, "r-1", "rack-1"))["__typename"] == "Allocated"
