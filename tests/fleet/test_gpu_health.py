"""XIDs: a critical one keeps the GPU out until it is reset and validated; an application's is only counted."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.fleet.health.policy import XID_CATALOG
from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.gpu_cordons import CLEAR, EVENTS, stored
from tests.support.metrics import scrape
from tests.support.reports import H100, REGISTER, gpus, node_input

GPU = '{ node(id: "gpu-01") { bootId gpus { index healthy healthReasons } freeGpus { index } } }'


def report(boot: str, xids: dict[int, list[int]] | None = None, **more: Any) -> dict[str, Any]:
    listed = gpus(H100, 4)
    for index, numbers in (xids or {}).items():
        listed[index] = {**listed[index], "xids": numbers}
    return {"input": node_input("gpu-01", gpus=listed, bootId=boot, **more)}


async def gpu_2(api: Api) -> tuple[bool, list[str], bool]:
    """(healthy, healthReasons, free) of GPU 2."""
    node = (await api(GPU))["node"]
    gpu = node["gpus"][2]
    return gpu["healthy"], gpu["healthReasons"], {"index": 2} in node["freeGpus"]


def xid_count(samples: dict[str, float], xid: int) -> float:
    return samples.get(f'inventory_gpu_xids_total{{gpu_class="H100-80GB",xid="{xid}"}}', 0)


VALIDATED = """
mutation V($input: ValidationInput!) { recordValidation(input: $input) { id state } }
"""


async def validate(api: Api, index: int) -> dict[str, Any]:
    """The policy's default test passed on the GPU (as the agent reports it)."""
    passed = {"nodeId": "gpu-01", "gpuIndices": [index], "test": "dcgm_diag", "passed": True}
    answer: dict[str, Any] = (await api(VALIDATED, {"input": passed}))["recordValidation"]
    return answer


async def test_xid_79_stays_until_the_node_reboots_and_validates(
    api: Api, client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    await api(REGISTER, report("boot-a"))
    before = await scrape(client)

    await api(REGISTER, report("boot-a", {2: [79]}))
    assert await gpu_2(api) == (False, ["xid_79"], False)
    assert xid_count(await scrape(client), 79) - xid_count(before, 79) == 1
    xid = (await api(EVENTS, {"kinds": ["gpu_xid"]}))["events"]
    assert [(e["nodeId"], e["detail"]) for e in xid] == [
        ("gpu-01", {"index": 2, "uuid": "GPU-0002", "xid": 79, "critical": True})
    ]
    assert xid[0]["reason"] == XID_CATALOG[79].why

    # NVML forgot: the next report says healthy, on the same boot.
    await api(REGISTER, report("boot-a"))
    await api(REGISTER, report("boot-a", memoryTotalMb=1024))
    assert await gpu_2(api) == (False, ["xid_79"], False)
    free = (await api("{ freeGpus { gpuIndices } }"))["freeGpus"]
    assert free == [{"gpuIndices": [0, 1, 3]}]

    # A reboot carries out the remediation, which waits for validation: the
    # GPU stays out (its sticky reason and its taint) until it passes.
    await api(REGISTER, report("boot-b"))
    assert await gpu_2(api) == (False, ["xid_79"], False)
    assert (await api(GPU))["node"]["bootId"] == "boot-b"
    assert (await validate(api, 2))["state"] == "DONE"
    assert await gpu_2(api) == (True, [], True)
    cleared = (await api(EVENTS, {"kinds": ["gpu_health_cleared"]}))["events"]
    assert [(e["reason"], e["detail"]["index"], e["detail"]["cleared"]) for e in cleared] == [
        ("remediation 1 validated", 2, ["xid_79"])
    ]
    assert await inconsistencies(engine) == []


async def test_xid_48_until_an_operator_clears_it_and_it_validates(
    api_as: Any, engine: AsyncEngine
) -> None:
    agent = await api_as("agent", node_id="gpu-01")
    operator = await api_as("operator")
    await agent(REGISTER, report("boot-a", {2: [48]}))
    assert await gpu_2(operator) == (False, ["xid_48"], False)
    # An agent that stops sending its boot id does not look like a reboot.
    await agent(REGISTER, {"input": {**report("boot-a")["input"], "bootId": None}})
    assert await gpu_2(operator) == (False, ["xid_48"], False)

    cleared = await operator(CLEAR, {"node": "gpu-01", "index": 2})

    # Healthy again, but its remediation (RESET_GPU, carried out by the
    # operator's reset) keeps the taint until the validation passes.
    assert cleared["clearGpuHealth"] == {"index": 2, "healthy": True, "healthReasons": []}
    assert await gpu_2(operator) == (True, [], False)
    events = (await operator(EVENTS, {"kinds": ["gpu_health_cleared"]}))["events"]
    assert [(e["actor"].split(" (")[0], e["detail"]["cleared"]) for e in events] == [
        ("test operator", ["xid_48"])
    ]
    assert (await validate(agent, 2))["state"] == "DONE"
    assert await gpu_2(operator) == (True, [], True)
    assert await inconsistencies(engine) == []


async def test_xid_31_is_the_applications_and_leaves_the_gpu_healthy(
    api: Api, client: httpx.AsyncClient
) -> None:
    await api(REGISTER, report("boot-a"))
    before = await scrape(client)

    await api(REGISTER, report("boot-a", {2: [31, 31]}))

    assert await gpu_2(api) == (True, [], True)
    events = (await api(EVENTS, {"kinds": ["gpu_xid"]}))["events"]
    assert [(e["detail"]["xid"], e["detail"]["critical"], e["reason"]) for e in events] == [
        (31, False, None),
        (31, False, None),
    ]
    assert xid_count(await scrape(client), 31) - xid_count(before, 31) == 2


async def test_an_xid_under_an_allocation_tells_its_holder(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, report("boot-a"))
    await api(
        'mutation { allocate(input: {replicaId: "r1", shards: [{shardId: "r1-s0", '
        'nodeId: "gpu-01", gpuIndices: [2, 3]}]}) { __typename } }'
    )

    await api(REGISTER, report("boot-a", {2: [79], 3: [13]}))

    held = (await api('{ allocations(replicaId: "r1") { shardId gpuIndices } }'))["allocations"]
    assert held == [{"shardId": "r1-s0", "gpuIndices": [2, 3]}]
    told = (await api(EVENTS, {"kinds": ["gpu_failed_under_allocation"]}))["events"]
    assert [(e["replicaId"], e["shardId"], e["detail"]["index"]) for e in told] == [
        ("r1", "r1-s0", 2)
    ]
    assert told[0]["reason"] == f"xid_79: {XID_CATALOG[79].why}"
    assert await inconsistencies(engine) == []


@pytest.mark.parametrize(
    ("xids", "field"),
    [([0], "input.gpus[2].xids[0]"), ([79, -3], "input.gpus[2].xids[1]")],
)
async def test_an_xid_that_is_not_a_positive_integer_changes_nothing(
    api: Api, engine: AsyncEngine, xids: list[int], field: str
) -> None:
    await api(REGISTER, report("boot-a"))
    before = await stored(engine)

    error = await api.fails(REGISTER, report("boot-b", {2: xids}))

    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == field
    assert await stored(engine) == before
    assert (await api(GPU))["node"]["bootId"] == "boot-a"


async def test_xids_that_are_not_integers_are_refused_by_type(api: Api) -> None:
    error = await api.fails(REGISTER, report("boot-a", {2: ["79"]}))
    assert "xids" in error["message"]


async def test_a_gpu_reported_unhealthy_under_an_allocation_tells_its_holder(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, report("boot-a"))
    await api(
        'mutation { allocate(input: {replicaId: "r1", shards: [{shardId: "r1-s0", '
        'nodeId: "gpu-01", gpuIndices: [1]}]}) { __typename } }'
    )
    sick = report("boot-a")
    sick["input"]["gpus"][1] = {
        **sick["input"]["gpus"][1],
        "healthy": False,
        "healthReasons": ["ecc_uncorrected"],
    }

    await api(REGISTER, sick)
    await api(REGISTER, sick)  # unchanged: told once

    told = (await api(EVENTS, {"kinds": ["gpu_failed_under_allocation"]}))["events"]
    assert [(e["replicaId"], e["shardId"], e["reason"], e["detail"]) for e in told] == [
        ("r1", "r1-s0", "unhealthy: ecc_uncorrected", {"index": 1, "uuid": "GPU-0001"})
    ]
    held = (await api('{ allocations(replicaId: "r1") { gpuIndices } }'))["allocations"]
    assert held == [{"gpuIndices": [1]}]
    assert await inconsistencies(engine) == []
