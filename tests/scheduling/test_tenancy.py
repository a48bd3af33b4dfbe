"""Tenants and quotas, as schedulers and operators meet them: the worked example of docs/scheduler/tenancy.md.

Five nodes of 8 H100: 40 GPUs. prod is guaranteed 16 and limited to 24,
staging is guaranteed none and limited to 8, research has no quota and
borrows idle GPUs at priority 0. Every step is asked through the API, and
what a scheduler sees is what the page says it sees.
"""

from __future__ import annotations

from typing import Any

from tests.support.api import Api
from tests.support.reports import REGISTER, node_input
from tests.support.tenancy import (
    ALLOCATE,
    EXPLAIN,
    FIT,
    RELEASE,
    REMOVE_TENANT,
    TENANTS,
    place,
    quota,
    register_fleet,
    set_tenant,
    tenant,
    usage_of,
    worked_example_tenants,
)


def shortfall(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["__typename"] == "Unplaceable", answer
    assert answer["quota"] is not None, answer
    return dict(answer["quota"])


async def test_the_worked_example_quota_steps(api: Api) -> None:
    await register_fleet(api)
    await worked_example_tenants(api)
    listed = {t["id"]: t for t in (await api(TENANTS))["tenants"]}
    # default is a tenant without a row: listed, limitless, holding nothing.
    assert sorted(listed) == ["default", "prod", "research", "staging"]
    assert listed["prod"]["quotas"] == [{"gpuClass": "H100-80GB", "guaranteed": 16, "limit": 24}]
    assert usage_of(listed["prod"]) == {
        "gpuClass": "H100-80GB", "used": 0, "borrowed": 0, "guaranteed": 16, "limit": 24,
        "available": 24,
    }  # fmt: skip

    # 1. research borrows idle GPUs: 16 at priority 0, all beyond its guarantee (none).
    for i in range(2):
        got = await place(api, f"research-{i}", tenant="research", deployment="sweep")
        assert got["__typename"] == "Allocated", got
        shard = got["allocations"][0]
        assert (shard["tenant"], shard["priority"], shard["deployment"], shard["borrowed"]) == (
            "research", 0, "sweep", True
        )  # fmt: skip
    research = usage_of(await tenant(api, "research"))
    assert (research["used"], research["borrowed"], research["limit"]) == (16, 16, None)
    assert research["available"] == 24  # what is free: research has no limit

    # 2. prod places within its guarantee (not borrowed), then beyond it (borrowed).
    for i, borrowed in enumerate([False, False, True]):
        got = await place(api, f"chat-{i}", tenant="prod", priority=100, deployment="chat")
        assert got["__typename"] == "Allocated", got
        assert got["allocations"][0]["borrowed"] is borrowed
        assert got["allocations"][0]["priority"] == 100
    prod = usage_of(await tenant(api, "prod"))
    assert (prod["used"], prod["borrowed"], prod["available"]) == (24, 8, 0)

    # 3. prod at its limit: the fleet is full too, and the limit is what a
    # scheduler is told (were there room, it would still be refused).
    refused = await place(api, "chat-3", tenant="prod", priority=100, deployment="chat")
    assert shortfall(refused) == {
        "tenant": "prod", "gpuClass": "H100-80GB", "used": 24, "limit": 24, "asked": 8,
    }  # fmt: skip
    assert "prod" in refused["message"] and "24" in refused["message"]

    # 4. staging is under its limit but the fleet is full: plain no room.
    full = await place(api, "stage-0", per=2, tenant="staging")
    assert full["__typename"] == "Unplaceable" and full["quota"] is None, full

    # 5. research gives one replica back; staging fills to its limit, then is refused.
    assert (await api(RELEASE, {"id": "research-1"}))["releaseReplica"] == 8
    for i in range(4):
        got = await place(api, f"stage-{i}", per=2, tenant="staging")
        assert got["__typename"] == "Allocated", got
    refused = await place(api, "stage-4", per=2, tenant="staging")
    assert shortfall(refused) == {
        "tenant": "staging", "gpuClass": "H100-80GB", "used": 8, "limit": 8, "asked": 2,
    }  # fmt: skip
    # Nodes with room would fit but for the limit: their verdict says so.
    assert all(v["code"] != "FITS" for v in refused["verdicts"])

    # allocate is held to the same limit: naming free GPUs (a node that
    # joins the fleet) changes nothing.
    await api(REGISTER, {"input": node_input("hgx-late")})
    node = "hgx-late"
    rejected = (
        await api(
            ALLOCATE,
            {
                "input": {
                    "replicaId": "stage-x",
                    "tenant": "staging",
                    "shards": [{"shardId": "stage-x-s0", "nodeId": node, "gpuIndices": [7]}],
                }
            },
        )
    )["allocate"]
    assert rejected["__typename"] == "AllocationRejected" and rejected["code"] == "QUOTA_EXCEEDED"
    assert rejected["quota"] == {
        "tenant": "staging", "gpuClass": "H100-80GB", "used": 8, "limit": 8, "asked": 1,
    }  # fmt: skip

    # 6. An operator lowers prod's limit below what it holds: allowed, evicts
    # nothing, says so, and prod's next place is refused.
    lowered = await set_tenant(api, "prod", quota(guaranteed=16, limit=16))
    assert usage_of(lowered)["used"] == 24
    assert lowered["notices"] and "above its limit 16" in lowered["notices"][0]
    refused = await place(api, "chat-4", per=1, tenant="prod")
    assert shortfall(refused)["used"] == 24 and shortfall(refused)["limit"] == 16
    held = {t["id"]: usage_of(t)["used"] for t in (await api(TENANTS))["tenants"] if t["usage"]}
    assert held == {"prod": 24, "research": 8, "staging": 8}
    assert usage_of(await tenant(api, "staging"))["available"] == 0
    assert usage_of(await tenant(api, "research"))["available"] == 8  # the late node


async def test_fit_and_explain_count_within_the_tenants_limit(api: Api) -> None:
    await register_fleet(api)
    await set_tenant(api, "staging", quota(limit=8))
    shape = {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": 2, "tenant": "staging"}
    # 40 free GPUs hold 20 replicas of 2; staging's limit holds 4.
    counted = (await api(FIT, {"shape": shape}))["fit"]
    assert counted["replicas"] == 4
    # Best fit packs them on one node, as place would (fit names the first by id).
    assert counted["nodes"] == [{"nodeId": "hgx-0", "shards": 4}]
    # The four other nodes would take a fifth but for the limit.
    assert counted["limitedBy"] == [
        {"code": "QUOTA_EXCEEDED", "nodes": 4},
        {"code": "NOT_ENOUGH_GPUS", "nodes": 1},
    ]
    unlimited = (await api(FIT, {"shape": {**shape, "tenant": None}}))["fit"]
    assert unlimited["replicas"] == 20
    assert unlimited["limitedBy"] == [{"code": "NOT_ENOUGH_GPUS", "nodes": 5}]
    # fit is exact against place: four places, then the fifth is refused.
    for i in range(4):
        assert (await place(api, f"s-{i}", per=2, tenant="staging"))["__typename"] == "Allocated"
    assert (await place(api, "s-4", per=2, tenant="staging"))["quota"] is not None
    explained = (await api(EXPLAIN, {"input": {**shape, "replicaId": "s-4"}}))["explainPlacement"]
    assert explained["placeable"] is False and "limit 8" in explained["message"]
    assert explained["preemptions"] == []
    codes = sorted(v["code"] for v in explained["verdicts"])
    assert codes == ["NOT_ENOUGH_GPUS"] + ["QUOTA_EXCEEDED"] * 4
    assert (await api(FIT, {"shape": shape}))["fit"]["replicas"] == 0


async def test_remove_tenant_is_refused_while_it_holds_gpus(api: Api) -> None:
    await register_fleet(api)
    await set_tenant(api, "staging", quota(limit=8))
    assert (await place(api, "s-0", per=2, tenant="staging"))["__typename"] == "Allocated"
    before = await tenant(api, "staging")

    error = await api.fails(REMOVE_TENANT, {"id": "staging"})
    assert error["extensions"]["code"] == "CONFLICT"
    assert "2 H100-80GB" in error["message"]
    assert await tenant(api, "staging") == before

    assert (await api(RELEASE, {"id": "s-0"}))["releaseReplica"] == 2
    assert (await api(REMOVE_TENANT, {"id": "staging"}))["removeTenant"] is True
    assert await tenant(api, "staging") is None
    assert (await api(REMOVE_TENANT, {"id": "staging"}))["removeTenant"] is False
    # Gone: a place charged to it is refused, nothing held.
    gone = await place(api, "s-1", per=2, tenant="staging")
    assert gone["__typename"] == "AllocationRejected" and gone["code"] == "INVALID"
    assert "tenant='staging'" in gone["message"]
    # The default tenant is where unnamed places go: never removed.
    error = await api.fails(REMOVE_TENANT, {"id": "default"})
    assert error["extensions"]["code"] == "BAD_INPUT"


async def test_a_quota_set_on_a_tenant_that_holds_gpus_counts_them(api: Api) -> None:
    await register_fleet(api)
    for i in range(3):
        assert (await place(api, f"d-{i}", per=4))["__typename"] == "Allocated"
    # default holds 12 with no limit; an operator limits it to 12: full at once.
    limited = await set_tenant(api, "default", quota(limit=12))
    assert usage_of(limited)["used"] == 12 and usage_of(limited)["available"] == 0
    assert shortfall(await place(api, "d-3", per=4))["used"] == 12
    assert (await api(RELEASE, {"id": "d-0"}))["releaseReplica"] == 4
    assert (await place(api, "d-3", per=4))["__typename"] == "Allocated"
    # Dropping the quota lifts the limit.
    lifted = await set_tenant(api, "default")
    assert lifted["quotas"] == [] and usage_of(lifted) == {
        "gpuClass": "H100-80GB", "used": 12, "borrowed": 12, "guaranteed": 0, "limit": None,
        "available": 28,
    }  # fmt: skip


PLACE_GROUP = """
mutation P($input: PlaceGroupInput!) {
  placeGroup(input: $input) {
    __typename
    ... on GroupPlaced { members { allocations { tenant priority deployment } } preempted { replicaId } }
    ... on Unplaceable { message quota { tenant gpuClass used limit asked } }
    ... on AllocationRejected { code message }
  }
}
"""
SCALE_GROUP = """
mutation S($id: ID!, $role: String!, $n: Int!) {
  scaleGroup(groupId: $id, role: $role, replicas: $n) {
    __typename
    ... on GroupPlaced { members { role } }
    ... on Unplaceable { quota { used limit asked } }
  }
}
"""
FIT_GROUP = "query F($g: PlaceGroupInput!) { fitGroup(group: $g) { groups limitedBy } }"


def pd_group(group_id: str, **charge: Any) -> dict[str, Any]:
    """1 prefill of 4 GPUs and 2 decodes of 2: 8 H100 in all."""

    def role(name: str, replicas: int, per: int) -> dict[str, Any]:
        shape = {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": per}
        return {"role": name, "replicas": replicas, "shape": shape}

    return {"groupId": group_id, "roles": [role("prefill", 1, 4), role("decode", 2, 2)], **charge}


async def test_a_group_is_charged_as_one(api: Api) -> None:
    await register_fleet(api)
    await set_tenant(api, "staging", quota(limit=12))
    # 12 under the limit hold one group of 8, not two: fitGroup says so first.
    fitted = (await api(FIT_GROUP, {"g": pd_group("g", tenant="staging")}))["fitGroup"]
    assert fitted["groups"] == 1 and "QUOTA_EXCEEDED" in fitted["limitedBy"][0]

    placed = (await api(PLACE_GROUP, {"input": pd_group("g1", tenant="staging", priority=5,
                                                         deployment="pd")}))["placeGroup"]  # fmt: skip
    assert placed["__typename"] == "GroupPlaced" and placed["preempted"] == []
    charges = {(a["tenant"], a["priority"], a["deployment"])
               for m in placed["members"] for a in m["allocations"]}  # fmt: skip
    assert charges == {("staging", 5, "pd")}

    # The second group: 8 + 8 > 12. Nothing of it is held, and the numbers are the group's.
    refused = (await api(PLACE_GROUP, {"input": pd_group("g2", tenant="staging")}))["placeGroup"]
    assert refused["__typename"] == "Unplaceable", refused
    assert refused["quota"] == {
        "tenant": "staging", "gpuClass": "H100-80GB", "used": 8, "limit": 12, "asked": 8,
    }  # fmt: skip
    assert usage_of(await tenant(api, "staging"))["used"] == 8
    assert (await api('{ group(groupId: "g2") { groupId } }'))["group"] is None

    # Scaling is charged as the group was: two more decodes fit (12), a third does not.
    scaled = (await api(SCALE_GROUP, {"id": "g1", "role": "decode", "n": 2}))["scaleGroup"]
    assert scaled["__typename"] == "GroupPlaced", scaled
    over = (await api(SCALE_GROUP, {"id": "g1", "role": "decode", "n": 1}))["scaleGroup"]
    assert over["quota"] == {"used": 12, "limit": 12, "asked": 2}

    # A role's shape names no charge of its own: the group is charged as one.
    named = pd_group("g3")
    named["roles"][0]["shape"]["tenant"] = "staging"
    shaped = (await api(PLACE_GROUP, {"input": named}))["placeGroup"]
    assert shaped["__typename"] == "AllocationRejected" and shaped["code"] == "INVALID"
    assert "roles[0].shape" in shaped["message"]
