"""Preemption, as schedulers meet it: the worked example of docs/scheduler/tenancy.md, continued.

Five nodes of 8 H100. research borrows idle GPUs at priority 0; prod is
guaranteed 16 and reclaims them below its guarantee; a disruption budget
keeps research's sweep from going below its minimum, and the answer names
it; a higher priority takes what the budget leaves; the victim's node is
told to stop it at its next heartbeat, naming the preemptor.
"""

from __future__ import annotations

import httpx
import pytest

from tests.support.api import Api
from tests.support.fencing import BEAT, EVENTS
from tests.support.metrics import scrape
from tests.support.preemption import PLACE_GROUP, explain, pd_group, place, victims
from tests.support.reports import REGISTER, node_input
from tests.support.tenancy import (
    SET_BUDGET,
    register_fleet,
    set_tenant,
    tenant,
    usage_of,
    worked_example_tenants,
)

LOWER = {"preemption": "LOWER_PRIORITY"}


PREEMPTED_RESEARCH = (
    'inventory_tenant_replicas_preempted_total{tenant="research",gpu_class="H100-80GB"}'
)


async def test_the_worked_example_preemption_steps(api: Api, client: httpx.AsyncClient) -> None:
    await register_fleet(api)
    await worked_example_tenants(api)

    # research borrows 32 of the 40 GPUs, at priority 0.
    research = []
    for i in range(4):
        got = await place(api, f"research-{i}", tenant="research", deployment="sweep")
        assert got["__typename"] == "Allocated", got
        research.append(got["allocations"][0])
    chat = await place(api, "chat-0", tenant="prod", priority=100, deployment="chat")
    assert chat["__typename"] == "Allocated" and chat["preempted"] == []

    # Without preemption: no room, and nothing is stopped.
    plain = await place(api, "embed-0", tenant="prod", deployment="embed")
    assert plain["__typename"] == "Unplaceable" and plain["blockingBudgets"] == []

    # Reclaim: prod (8 held of its 16 guaranteed) places at priority 0, the
    # same as research's: not a lower priority, but research holds its GPUs
    # beyond its guarantee (none), and prod stays within its own. One
    # replica makes room; of four alike, the youngest. explainPlacement
    # shows the same set first, and stops nothing.
    said = await explain(api, "embed-0", tenant="prod", deployment="embed", **LOWER)
    assert said["placeable"] is True and victims(said) == ["research-3"], said
    assert "by preempting research-3" in said["message"]
    assert usage_of(await tenant(api, "research"))["used"] == 32
    before = (await scrape(client)).get(PREEMPTED_RESEARCH, 0)
    got = await place(api, "embed-0", tenant="prod", deployment="embed", **LOWER)
    assert got["__typename"] == "Allocated", got
    (victim,) = got["preempted"]
    assert victim["replicaId"] == "research-3" and victim["kind"] == "RECLAIM"
    assert (victim["tenant"], victim["priority"], victim["deployment"], victim["gpus"]) == (
        "research", 0, "sweep", 8
    )  # fmt: skip
    assert victim["nodeIds"] == [research[3]["nodeId"]]
    assert got["allocations"][0]["nodeId"] == research[3]["nodeId"]
    assert got["allocations"][0]["borrowed"] is False  # 16: prod's guarantee
    assert usage_of(await tenant(api, "research"))["used"] == 24
    assert usage_of(await tenant(api, "prod"))["used"] == 16
    # Counted per the victim's tenant and class, once it committed.
    assert (await scrape(client))[PREEMPTED_RESEARCH] == before + 1

    # A budget: research's sweep keeps 3 replicas, it has 3. prod's own
    # embed keeps 1. prod's chat at priority 100 finds every lower replica
    # protected: Unplaceable, naming the budget that kept the set that
    # would have made room (the youngest: prod's own embed-0).
    budget = await api(SET_BUDGET, {"input": {"deployment": "sweep", "tenant": "research",
                                             "minAvailable": 3}})  # fmt: skip
    assert budget["setDisruptionBudget"]["placed"] == 3
    await api(SET_BUDGET, {"input": {"deployment": "embed", "tenant": "prod", "minAvailable": 1}})
    blocked = await place(api, "chat-1", tenant="prod", priority=100, deployment="chat", **LOWER)
    assert blocked["__typename"] == "Unplaceable", blocked
    assert blocked["quota"] is None
    assert blocked["blockingBudgets"] == [
        {"deployment": "embed", "tenant": "prod", "minAvailable": 1, "placed": 1}
    ]
    assert "disruption budget" in blocked["message"] and "prod/embed" in blocked["message"]
    said = await explain(api, "chat-1", tenant="prod", priority=100, **LOWER)
    assert said["placeable"] is False and said["preemptions"] == []

    # research's budget lowered to 2: the youngest of its replicas goes.
    await api(SET_BUDGET, {"input": {"deployment": "sweep", "tenant": "research",
                                     "minAvailable": 2}})  # fmt: skip
    said = await explain(api, "chat-1", tenant="prod", priority=100, **LOWER)
    assert victims(said) == ["research-2"]
    got = await place(api, "chat-1", tenant="prod", priority=100, deployment="chat", **LOWER)
    assert got["__typename"] == "Allocated" and victims(got) == ["research-2"], got
    assert got["preempted"][0]["kind"] == "LOWER_PRIORITY"
    assert "lower" in got["preempted"][0]["reason"]
    # The budget holds: research keeps its 2.
    budgets = await api('{ disruptionBudgets(tenant: "research") { deployment placed } }')
    assert budgets["disruptionBudgets"] == [{"deployment": "sweep", "placed": 2}]

    # The victim's node is told at its next heartbeat: stop it, PREEMPTED,
    # naming the preemptor.
    stopped = research[2]
    beat_naming = BEAT.replace("reason }", "reason preemptedBy }")
    running = [{"shardId": stopped["shardId"], "fence": stopped["fence"]}]
    beat = await api(beat_naming, {"id": stopped["nodeId"], "running": running})
    assert beat["heartbeat"]["shardsToStop"] == [
        {"shardId": stopped["shardId"], "fence": stopped["fence"], "reason": "PREEMPTED",
         "preemptedBy": "chat-1"}
    ]  # fmt: skip
    events = (await api(EVENTS, {"kinds": ["replica_preempted"]}))["events"]
    assert sorted((e["replicaId"], e["detail"]["preemptedBy"]) for e in events) == [
        ("research-2", "chat-1"), ("research-3", "embed-0")
    ]  # fmt: skip


async def test_a_group_preempts_for_all_its_members_or_for_none(api: Api) -> None:
    for node_id in ("hgx-0", "hgx-1"):
        await api(REGISTER, {"input": node_input(node_id)})
    await set_tenant(api, "research")
    # research holds all 16 GPUs at priority 0, in four replicas of 4.
    for i in range(4):
        got = await place(api, f"research-{i}", 4, tenant="research", deployment="sweep")
        assert got["__typename"] == "Allocated", got

    # A group of 8 (a prefill of 4, two decodes of 2) at priority 10: the
    # least set that makes room for all of it is two replicas, the youngest.
    group = pd_group("pd-1", tenant="research", priority=10, **LOWER)
    placed = (await api(PLACE_GROUP, {"input": group}))["placeGroup"]
    assert placed["__typename"] == "GroupPlaced", placed
    assert victims(placed) == ["research-2", "research-3"]
    assert {p["kind"] for p in placed["preempted"]} == {"LOWER_PRIORITY"}
    held = [a for m in placed["members"] for a in m["allocations"]]
    assert sum(len(a["gpuIndices"]) for a in held) == 8
    assert {a["priority"] for a in held} == {10}
    assert usage_of(await tenant(api, "research"))["used"] == 16

    # A group of 12 at priority 5: only research-0 and -1 (8 GPUs) are below
    # it, and the group at 10 is not: no set makes room for all of it, so
    # nothing is stopped.
    big = pd_group("pd-2", prefill=8, decodes=2, tenant="research", priority=5, **LOWER)
    refused = (await api(PLACE_GROUP, {"input": big}))["placeGroup"]
    assert refused["__typename"] == "Unplaceable", refused
    assert "preemption" in refused["message"]
    listed = await api("{ allocations { replicaId } }")
    assert {a["replicaId"] for a in listed["allocations"]} >= {"research-0", "research-1"}
    assert (await api('{ group(groupId: "pd-2") { groupId } }'))["group"] is None
    events = (await api(EVENTS, {"kinds": ["replica_preempted"]}))["events"]
    assert sorted(e["replicaId"] for e in events) == ["research-2", "research-3"]
    assert {e["detail"]["preemptedBy"] for e in events} == {"pd-1"}


async def test_preemption_makes_room_never_quota(api: Api) -> None:
    await register_fleet(api)
    await worked_example_tenants(api)
    for i in range(2):
        got = await place(api, f"research-{i}", tenant="research", deployment="sweep")
        assert got["__typename"] == "Allocated", got
    for i in range(3):
        got = await place(api, f"chat-{i}", tenant="prod", priority=100, deployment="chat")
        assert got["__typename"] == "Allocated", got
    # prod at its limit (24): research's replicas are of lower priority, but
    # stopping them would not make room under prod's limit. The limit is the
    # answer, and nothing is stopped.
    refused = await place(api, "chat-3", tenant="prod", priority=100, **LOWER)
    assert refused["__typename"] == "Unplaceable" and refused["quota"]["limit"] == 24, refused
    said = await explain(api, "chat-3", tenant="prod", priority=100, **LOWER)
    assert said["placeable"] is False and said["preemptions"] == []
    assert usage_of(await tenant(api, "research"))["used"] == 16
    assert (await api(EVENTS, {"kinds": ["replica_preempted"]}))["events"] == []


ALLOCATE = """
mutation A($input: AllocateInput!) {
  allocate(input: $input) { __typename ... on AllocationRejected { code message } }
}
"""


@pytest.mark.parametrize("calls", [1, 2], ids=["one-allocate", "a-shard-added-later"])
async def test_a_replica_of_two_shards_on_one_node_is_the_youngest_victim(
    api: Api, calls: int
) -> None:
    # n0 is held by one replica of 8 GPUs, n1 by a younger one of two shards
    # of 4 (stored together, or the second added by a later allocate). Each
    # is a set of one with the same priority and GPUs; the younger goes
    # first, though no shard of it alone would make room for 8.
    for n in ("n0", "n1"):
        await api(REGISTER, {"input": node_input(n)})

    async def allocate(replica_id: str, shards: list[tuple[str, str, list[int]]]) -> None:
        got = await api(
            ALLOCATE,
            {
                "input": {
                    "replicaId": replica_id,
                    "priority": 0,
                    "shards": [
                        {"shardId": s, "nodeId": n, "gpuIndices": idx} for s, n, idx in shards
                    ],
                }
            },
        )
        assert got["allocate"]["__typename"] == "Allocated", got

    await allocate("older", [("older-s0", "n0", list(range(8)))])
    halves = [("younger-s0", "n1", [0, 1, 2, 3]), ("younger-s1", "n1", [4, 5, 6, 7])]
    if calls == 1:
        await allocate("younger", halves)
    else:
        await allocate("younger", halves[:1])
        await allocate("younger", halves[1:])
    said = await explain(api, "p", priority=10, **LOWER)
    assert said["placeable"] is True and victims(said) == ["younger"], said
    got = await place(api, "p", priority=10, **LOWER)
    assert got["__typename"] == "Allocated" and victims(got) == ["younger"], got
    assert got["allocations"][0]["nodeId"] == "n1", got
