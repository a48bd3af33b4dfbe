"""Every bad input of issue 46, refused naming the field and the value, with nothing stored changed.

Also the scheduler token bound to a tenant, which places only as it, and
disruption budgets.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.api import Api
from tests.support.reports import REGISTER, node_input
from tests.support.tenancy import (
    ALLOCATE,
    BUDGETS,
    CREATE_TOKEN,
    FIT,
    PLACE,
    REMOVE_BUDGET,
    SET_BUDGET,
    SET_TENANT,
    TENANTS,
    place,
    quota,
    set_tenant,
    usage_of,
)

ALLOCATIONS = "{ allocations { shardId replicaId tenant priority deployment } }"
TOKENS = "{ tokens { id role tenant } }"


async def stored(api: Api) -> dict[str, Any]:
    """What a refused request must leave as it was."""
    return {
        "tenants": (await api(TENANTS))["tenants"],
        "budgets": (await api(BUDGETS))["disruptionBudgets"],
        "allocations": (await api(ALLOCATIONS))["allocations"],
    }


@pytest.fixture
async def fleet(api: Api) -> Api:
    for node_id in ("hgx-0", "hgx-1"):
        await api(REGISTER, {"input": node_input(node_id)})
    await set_tenant(api, "prod", quota(guaranteed=8, limit=12))
    await set_tenant(api, "staging", quota(limit=4))
    placed = await place(api, "chat-0", tenant="prod", deployment="chat")
    assert placed["__typename"] == "Allocated"
    return api


async def free_node(api: Api) -> str:
    """The node chat-0 left free."""
    held = {a["nodeId"] for a in (await api("{ allocations { nodeId } }"))["allocations"]}
    (free,) = {"hgx-0", "hgx-1"} - held
    return free


SET_TENANT_REFUSALS = [
    # (the input's changes, the field named, the value named)
    ({"quotas": [quota(guaranteed=-1)]}, "quotas[0].guaranteed", -1),
    ({"quotas": [quota(limit=-4)]}, "quotas[0].limit", -4),
    ({"quotas": [quota(guaranteed=8, limit=4)]}, "quotas[0].limit", 4),
    ({"quotas": [quota("B300-288GB", limit=4)]}, "quotas[0].gpuClass", "B300-288GB"),
    ({"quotas": [quota(limit=4), quota(limit=8)]}, "quotas[1].gpuClass", "H100-80GB"),
    ({"id": ""}, "id", ""),
    ({"id": "t" * 254}, "id", "t" * 254),
    ({"id": "nul\x00"}, "id", "nul\x00"),
    ({"description": "d" * 1025}, "description", "d" * 1025),
]


@pytest.mark.parametrize(("change", "field", "value"), SET_TENANT_REFUSALS)
async def test_set_tenant_refuses_bad_input_naming_it(
    fleet: Api, change: dict[str, Any], field: str, value: Any
) -> None:
    before = await stored(fleet)
    spec = {"id": "prod", "quotas": [quota(limit=40)], **change}
    error = await fleet.fails(SET_TENANT, {"input": spec})
    named = error["extensions"]
    assert named["code"] == "BAD_INPUT", error
    # Text no id or column can hold is refused at the API's boundary, which
    # names the field by its path (input.id) and cuts a long value.
    assert named["field"].removeprefix("input.") == field
    assert named["value"] == value or str(named["value"]).startswith(str(value)[:3])
    assert await stored(fleet) == before


PLACE_REFUSALS = [
    ({"priority": 1_000_001}, "priority=1000001"),
    ({"priority": -1_000_001}, "priority=-1000001"),
    ({"tenant": ""}, "tenant=''"),
    ({"deployment": ""}, "deployment=''"),
    ({"tenant": "nobody"}, "tenant='nobody'"),
]


@pytest.mark.parametrize(("change", "named"), PLACE_REFUSALS)
async def test_place_and_allocate_refuse_a_bad_charge_naming_it(
    fleet: Api, change: dict[str, Any], named: str
) -> None:
    before = await stored(fleet)
    refused = await place(fleet, "chat-1", per=1, **change)
    assert refused["__typename"] == "AllocationRejected" and refused["code"] == "INVALID"
    assert named in refused["message"], refused
    shards = [{"shardId": "chat-2-s0", "nodeId": await free_node(fleet), "gpuIndices": [0]}]
    allocated = await fleet(
        ALLOCATE, {"input": {"replicaId": "chat-2", "shards": shards, **change}}
    )
    assert allocated["allocate"]["code"] == "INVALID" and named in allocated["allocate"]["message"]
    error = await fleet.fails(FIT, {"shape": {"replicaId": "x", "gpuClass": "H100-80GB",
                                               "gpusPerShard": 1, **change}})  # fmt: skip
    assert error["extensions"]["code"] == "BAD_INPUT" and named in error["message"]
    assert await stored(fleet) == before


async def test_a_tenant_id_no_id_can_be_is_refused_at_the_boundary(fleet: Api) -> None:
    before = await stored(fleet)
    for value in ("t" * 254, "nul\x00"):
        shape = {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": 1, "tenant": value}
        error = await fleet.fails(PLACE, {"input": shape})
        named = error["extensions"]
        assert (named["code"], named["field"]) == ("BAD_INPUT", "input.tenant"), error
    assert await stored(fleet) == before


async def test_disruption_budgets_and_their_refusals(fleet: Api) -> None:
    budget = (await fleet(SET_BUDGET, {"input": {"deployment": "chat", "tenant": "prod",
                                                 "minAvailable": 1}}))  # fmt: skip
    assert budget["setDisruptionBudget"] == {
        "deployment": "chat", "tenant": "prod", "minAvailable": 1, "placed": 1,
    }  # fmt: skip
    more = await place(fleet, "chat-1", per=4, tenant="prod", deployment="chat")
    assert more["__typename"] == "Allocated"
    listed = (await fleet(BUDGETS, {"tenant": "prod"}))["disruptionBudgets"]
    assert listed == [{"deployment": "chat", "tenant": "prod", "minAvailable": 1, "placed": 2}]
    before = await stored(fleet)

    # minAvailable below zero, and a deployment whose replicas another tenant holds.
    error = await fleet.fails(SET_BUDGET, {"input": {"deployment": "chat", "tenant": "prod",
                                                     "minAvailable": -1}})  # fmt: skip
    assert (
        error["extensions"] | {"code": "BAD_INPUT", "field": "minAvailable", "value": -1}
        == error["extensions"]
    )
    error = await fleet.fails(SET_BUDGET, {"input": {"deployment": "chat", "tenant": "staging",
                                                     "minAvailable": 1}})  # fmt: skip
    assert error["extensions"]["code"] == "FORBIDDEN"
    assert (error["extensions"]["field"], error["extensions"]["value"]) == ("deployment", "chat")
    assert "prod" in error["message"]
    error = await fleet.fails(SET_BUDGET, {"input": {"deployment": "x", "tenant": "nobody",
                                                     "minAvailable": 1}})  # fmt: skip
    assert (error["extensions"]["code"], error["extensions"]["field"]) == ("BAD_INPUT", "tenant")
    assert await stored(fleet) == before

    # tenant null: default (an unbound caller), which needs no row to hold a budget.
    default = await fleet(SET_BUDGET, {"input": {"deployment": "batch", "minAvailable": 0}})
    assert default["setDisruptionBudget"]["tenant"] == "default"
    assert (await fleet(REMOVE_BUDGET, {"d": "batch"}))["removeDisruptionBudget"] is True
    assert (await fleet(REMOVE_BUDGET, {"d": "batch"}))["removeDisruptionBudget"] is False


async def test_a_bound_scheduler_token_places_only_as_its_tenant(fleet: Api, api_as: Any) -> None:
    # The operator makes a scheduler token bound to staging; the token shows it.
    operator = await api_as("operator")
    created = await operator(CREATE_TOKEN, {"role": "SCHEDULER", "tenant": "staging"})
    token = created["createToken"]
    assert token["token"]["tenant"] == "staging"
    listed = {t["id"]: t["tenant"] for t in (await operator(TOKENS))["tokens"]}
    assert listed[token["token"]["id"]] == "staging"
    staging = Api(operator.client, headers={"Authorization": f"Bearer {token['secret']}"})
    before = await stored(operator)

    # Naming another tenant: FORBIDDEN naming it, nothing placed, on every placing field.
    for change in ({"tenant": "prod"}, {"tenant": "default"}):
        error = await staging.fails(
            """mutation P($input: PlaceInput!) { place(input: $input) { __typename } }""",
            {"input": {"replicaId": "s-0", "gpuClass": "H100-80GB", "gpusPerShard": 1, **change}},
        )
        assert error["extensions"]["code"] == "FORBIDDEN", error
        assert (error["extensions"]["field"], error["extensions"]["value"]) == (
            "tenant",
            change["tenant"],
        )
        assert "staging" in error["message"]
    shards = [{"shardId": "s-0-s0", "nodeId": await free_node(operator), "gpuIndices": [0]}]
    error = await staging.fails(ALLOCATE, {"input": {"replicaId": "s-0", "shards": shards,
                                                     "tenant": "prod"}})  # fmt: skip
    assert error["extensions"]["code"] == "FORBIDDEN"
    error = await staging.fails(SET_BUDGET, {"input": {"deployment": "chat", "tenant": "prod",
                                                       "minAvailable": 0}})  # fmt: skip
    assert error["extensions"]["code"] == "FORBIDDEN"
    assert await stored(operator) == before

    # Naming none, or its own: charged to staging, and held to staging's limit.
    for i, change in enumerate(({}, {"tenant": "staging"})):
        got = await place(staging, f"s-{i}", per=2, **change)
        assert got["__typename"] == "Allocated" and got["allocations"][0]["tenant"] == "staging"
    over = await place(staging, "s-2", per=1)
    assert over["__typename"] == "Unplaceable" and over["quota"]["tenant"] == "staging"
    staged = next(t for t in (await operator(TENANTS))["tenants"] if t["id"] == "staging")
    assert usage_of(staged)["used"] == 4


@pytest.mark.parametrize(
    ("role", "tenant", "field"),
    [
        ("READER", "staging", "tenant"),
        ("SCHEDULER", "nobody", "tenant"),
        ("SCHEDULER", "", "tenant"),
    ],
)
async def test_create_token_refuses_a_tenant_it_cannot_bind(
    fleet: Api, role: str, tenant: str, field: str
) -> None:
    before = (await fleet(TOKENS))["tokens"]
    error = await fleet.fails(CREATE_TOKEN, {"role": role, "tenant": tenant})
    assert (error["extensions"]["code"], error["extensions"]["field"]) == ("BAD_INPUT", field)
    assert error["extensions"]["value"] == tenant
    assert (await fleet(TOKENS))["tokens"] == before
