"""Groups preempting as a scheduler meets them: scaleGroup makes room like placeGroup, and a group of several classes preempts.

docs/scheduler/tenancy.md ("Groups"): the replicas scaleGroup adds to a
group whose preemption is LOWER_PRIORITY stop the least victim set that makes
room for all of them, keeping every disruption budget, or nothing; a group
of several GPU classes is preempted for over the victims of all its classes.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.api import Api
from tests.support.fencing import BEAT, EVENTS
from tests.support.metrics import scrape
from tests.support.preemption import PLACE_GROUP, SCALE_GROUP, pd_group, place, victims
from tests.support.reports import L40S, REGISTER, gpus, node_input
from tests.support.tenancy import SET_BUDGET, set_tenant, tenant, usage_of

LOWER = {"preemption": "LOWER_PRIORITY"}

GROUP = "query G($id: ID!) { group(groupId: $id) { generation members { replicaId } } }"


async def scale(api: Api, group_id: str, role: str, n: int) -> Any:
    return (await api(SCALE_GROUP, {"id": group_id, "role": role, "n": n}))["scaleGroup"]


async def held_replicas(api: Api) -> set[str]:
    return {a["replicaId"] for a in (await api("{ allocations { replicaId } }"))["allocations"]}


async def test_scale_group_preempts_for_all_it_adds_or_for_none(api: Api) -> None:
    for node_id in ("hgx-0", "hgx-1"):
        await api(REGISTER, {"input": node_input(node_id)})
    await set_tenant(api, "research")
    # The group (a prefill of 4, two decodes of 2) at priority 10 takes a
    # node on free GPUs; research's sweep holds the other, two replicas of 4
    # at priority 0.
    placed = await api(PLACE_GROUP, {"input": pd_group("pd-1", priority=10, **LOWER)})
    assert placed["placeGroup"]["__typename"] == "GroupPlaced", placed
    assert placed["placeGroup"]["preempted"] == []
    sweep = []
    for i in range(2):
        got = await place(api, f"sweep-{i}", 4, tenant="research", deployment="sweep")
        assert got["__typename"] == "Allocated", got
        sweep.append(got["allocations"][0])

    # Two more decodes (4 GPUs): no GPU is free; the least set that makes
    # room is one replica of the sweep, of two alike the youngest.
    grown = await scale(api, "pd-1", "decode", 2)
    assert grown["__typename"] == "GroupPlaced", grown
    assert victims(grown) == ["sweep-1"]
    (stopped,) = grown["preempted"]
    assert (stopped["kind"], stopped["tenant"], stopped["gpus"]) == (
        "LOWER_PRIORITY",
        "research",
        4,
    )
    assert "stopped for pd-1" in stopped["reason"]
    decodes = [m for m in grown["members"] if m["role"] == "decode"]
    assert sorted(m["replicaId"] for m in decodes) == [f"pd-1-decode-{n}" for n in range(4)]
    assert {a["priority"] for m in decodes for a in m["allocations"]} == {10}
    assert "sweep-1" not in await held_replicas(api)
    events = (await api(EVENTS, {"kinds": ["replica_preempted"]}))["events"]
    assert [(e["replicaId"], e["detail"]["preemptedBy"]) for e in events] == [("sweep-1", "pd-1")]
    # Its node, still running it, is told to stop it, naming the group.
    shard = sweep[1]
    beat_naming = BEAT.replace("reason }", "reason preemptedBy }")
    running = [{"shardId": shard["shardId"], "fence": shard["fence"]}]
    told = (await api(beat_naming, {"id": shard["nodeId"], "running": running}))["heartbeat"]
    assert [(s["shardId"], s["reason"], s["preemptedBy"]) for s in told["shardsToStop"]] == [
        ("sweep-1-s0", "PREEMPTED", "pd-1")
    ]

    # A budget keeping sweep's last replica: two more decodes stop nothing,
    # and the answer names the budget.
    await api(SET_BUDGET, {"input": {"deployment": "sweep", "tenant": "research",
                                     "minAvailable": 1}})  # fmt: skip
    generation = (await api(GROUP, {"id": "pd-1"}))["group"]["generation"]
    blocked = await scale(api, "pd-1", "decode", 2)
    assert blocked["__typename"] == "Unplaceable", blocked
    assert "research/sweep (minAvailable 1)" in blocked["message"], blocked["message"]
    assert blocked["blockingBudgets"] == [
        {"deployment": "sweep", "tenant": "research", "minAvailable": 1, "placed": 1}
    ]
    assert "sweep-0" in await held_replicas(api)

    # All or nothing: with the budget gone, four more decodes (8 GPUs) would
    # need more than sweep's last replica frees (4): nothing is stopped,
    # nothing added, the generation unchanged.
    await api(SET_BUDGET, {"input": {"deployment": "sweep", "tenant": "research",
                                     "minAvailable": 0}})  # fmt: skip
    refused = await scale(api, "pd-1", "decode", 4)
    assert refused["__typename"] == "Unplaceable", refused
    assert "preemption" in refused["message"], refused["message"]
    assert "sweep-0" in await held_replicas(api)
    after = (await api(GROUP, {"id": "pd-1"}))["group"]
    assert after["generation"] == generation and len(after["members"]) == 5
    assert usage_of(await tenant(api, "research"))["used"] == 4
    events = (await api(EVENTS, {"kinds": ["replica_preempted"]}))["events"]
    assert [e["replicaId"] for e in events] == ["sweep-1"]

    # Two decodes (4 GPUs) it can make room for: sweep-0 stopped.
    last = await scale(api, "pd-1", "decode", 2)
    assert last["__typename"] == "GroupPlaced" and victims(last) == ["sweep-0"], last


def mixed_group(group_id: str, prefill: int, decodes: int, priority: int) -> dict[str, Any]:
    """A prefill of `prefill` H100 and `decodes` decodes of 2 L40S: a group of two GPU classes."""

    def role(name: str, replicas: int, cls: str, per: int) -> dict[str, Any]:
        shape = {"replicaId": "x", "gpuClass": cls, "gpusPerShard": per}
        return {"role": name, "replicas": replicas, "shape": shape}

    roles = [role("prefill", 1, "H100-80GB", prefill), role("decode", decodes, "L40S-48GB", 2)]
    return {"groupId": group_id, "roles": roles, "priority": priority, **LOWER}


async def test_a_group_of_two_gpu_classes_preempts_over_both_or_not_at_all(
    api: Api, client: httpx.AsyncClient
) -> None:
    await api(REGISTER, {"input": node_input("hgx-0")})
    await api(REGISTER, {"input": node_input("l40-0", gpus=gpus(L40S))})
    await set_tenant(api, "research")
    # research holds every GPU at priority 0: two replicas of 4 of each class.
    for name, cls in (("h", "H100-80GB"), ("l", "L40S-48GB")):
        for i in range(2):
            got = await place(api, f"{name}-{i}", 4, gpuClass=cls, tenant="research")
            assert got["__typename"] == "Allocated", got

    # 4 H100 and 4 L40S at priority 10: no one class's victims make room for
    # all of it; the least set over both is one replica of each, the youngest.
    placed = (await api(PLACE_GROUP, {"input": mixed_group("mix-1", 4, 2, 10)}))["placeGroup"]
    assert placed["__typename"] == "GroupPlaced", placed
    assert victims(placed) == ["h-1", "l-1"]
    assert {p["kind"] for p in placed["preempted"]} == {"LOWER_PRIORITY"}
    held = {a["nodeId"] for m in placed["members"] for a in m["allocations"]}
    assert held == {"hgx-0", "l40-0"}
    events = (await api(EVENTS, {"kinds": ["replica_preempted"]}))["events"]
    assert sorted((e["replicaId"], e["detail"]["preemptedBy"]) for e in events) == [
        ("h-1", "mix-1"), ("l-1", "mix-1")
    ]  # fmt: skip
    # Each victim counted under the class it held.
    samples = await scrape(client)
    for cls in ("H100-80GB", "L40S-48GB"):
        key = f'inventory_tenant_replicas_preempted_total{{tenant="research",gpu_class="{cls}"}}'
        assert samples[key] >= 1, key

    # 4 H100 and 8 L40S at priority 5: h-0 and l-0 are below it, mix-1 is
    # not; no set frees 8 L40S, so nothing is stopped, the H100 ones neither.
    refused = (await api(PLACE_GROUP, {"input": mixed_group("mix-2", 4, 4, 5)}))["placeGroup"]
    assert refused["__typename"] == "Unplaceable", refused
    assert "preemption" in refused["message"], refused["message"]
    assert {"h-0", "l-0"} <= await held_replicas(api)
    assert (await api('{ group(groupId: "mix-2") { groupId } }'))["group"] is None
    events = (await api(EVENTS, {"kinds": ["replica_preempted"]}))["events"]
    assert len(events) == 2
