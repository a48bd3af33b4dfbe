"""Drift: a node compared with its hardware profile; the policy taints the smallest scope that explains it.

Stories against the real database through the API (issue 38's acceptance).
"""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.drift import EVENTS, HGX, LABELS, RAILS, SET, hgx, node
from tests.support.metrics import scrape
from tests.support.remediations import stored
from tests.support.reports import L40S, PLACE, REGISTER, gpus, node_input


async def test_a_node_short_of_a_gpu_drifts_and_is_tainted_until_it_has_eight_again(
    api: Api, client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    await api(REGISTER, hgx())
    profile = {"name": "hgx-h100", "selector": HGX, "gpuCount": 8, "hcaRateGbps": 400}
    assert (await api(SET, {"p": profile}))["setHardwareProfile"] == {
        "name": "hgx-h100", "selector": HGX, "gpuCount": 8, "hcaRateGbps": 400
    }  # fmt: skip
    assert (await node(api))["drift"] == []

    await api(REGISTER, hgx(count=7))
    found = await node(api)
    [finding] = found["drift"]
    assert {k: finding[k] for k in ("kind", "expected", "observed", "gpuIndices")} == {
        "kind": "GPU_MISSING", "expected": "8 GPUs", "observed": "7 GPUs", "gpuIndices": None
    }  # fmt: skip
    # The policy's taint: on the node (a shape that needs its full NVLink group).
    assert found["taints"] == [
        {"key": "drift-gpu-missing", "effect": "NO_SCHEDULE", "source": "DRIFT",
         "reason": "GPU_MISSING: expected 8 GPUs, observed 7 GPUs"}
    ]  # fmt: skip
    assert (await scrape(client))['inventory_drift_findings{kind="GPU_MISSING"}'] == 1
    answer = await api(PLACE, {"input": {"replicaId": "r", "gpuClass": "H100-80GB",
                                         "gpusPerShard": 1}})  # fmt: skip
    assert answer["place"]["__typename"] == "Unplaceable"
    # Tolerated, the node's seven still serve.
    tolerant = {"replicaId": "r", "gpuClass": "H100-80GB", "gpusPerShard": 4,
                "tolerations": [{"key": "drift-gpu-missing", "operator": "EXISTS"}]}  # fmt: skip
    assert (await api(PLACE, {"input": tolerant}))["place"]["__typename"] == "Allocated"

    await api(REGISTER, hgx(count=8))
    found = await node(api)
    assert found["drift"] == [] and found["taints"] == []
    events = (await api(EVENTS, {"k": ["drift_found", "drift_cleared"]}))["events"]
    assert [(e["kind"], e["reason"]) for e in events] == [
        ("drift_found", "GPU_MISSING: expected 8 GPUs, observed 7 GPUs"),
        ("drift_cleared", "GPU_MISSING: now as the profile says (8 GPUs)"),
    ]
    assert await inconsistencies(engine) == []


async def test_a_slow_rail_taints_the_gpus_of_that_rail_only(api: Api) -> None:
    await api(SET, {"p": {"name": "hgx-h100", "selector": HGX, "hcaRateGbps": 400, "hcaCount": 2}})
    await api(REGISTER, hgx(rate_b=200))
    found = await node(api)
    [finding] = found["drift"]
    assert (finding["kind"], finding["expected"], finding["observed"], finding["gpuIndices"]) == (
        "HCA_RATE_LOW", "400 Gb/s", "mlx5_1 (ib-b) at 200 Gb/s", [4, 5, 6, 7]
    )  # fmt: skip
    assert found["taints"] == []
    assert [[t["key"] for t in g["taints"]] for g in found["gpus"]] == [[]] * 4 + [
        ["drift-hca-rate-low"]
    ] * 4
    # The rail comes back to its rate: the finding and its taints go.
    await api(REGISTER, hgx())
    found = await node(api)
    assert found["drift"] == [] and all(g["taints"] == [] for g in found["gpus"])


async def test_unknown_is_not_drift(api: Api) -> None:
    profile = {"name": "hgx-h100", "selector": HGX, "hcaCount": 2, "nvlinkGroupSize": 8,
               "memoryTotalMb": 2_000_000}  # fmt: skip
    await api(SET, {"p": profile})
    # No HCAs, no NVLink peers, no memory size reported: nothing to compare.
    await api(REGISTER, {"input": node_input("hgx-1", labels=LABELS)})
    assert (await node(api))["drift"] == []
    # Reported, and short: drift (memory low is PREFER_NO_SCHEDULE on the node).
    await api(REGISTER, {"input": node_input("hgx-1", labels=LABELS, memoryTotalMb=1_000_000,
                                             fabrics=[RAILS[0]])})  # fmt: skip
    found = await node(api)
    assert [(d["kind"], d["observed"]) for d in found["drift"]] == [
        ("HCA_MISSING", "1 HCA"), ("MEMORY_LOW", "1000000 MB")
    ]  # fmt: skip
    assert [(t["key"], t["effect"]) for t in found["taints"]] == [
        ("drift-hca-missing", "NO_SCHEDULE"), ("drift-memory-low", "PREFER_NO_SCHEDULE")
    ]  # fmt: skip


async def test_a_profile_set_or_removed_compares_its_nodes_again(api: Api) -> None:
    await api(REGISTER, {"input": node_input("hgx-1", labels=LABELS, gpus=gpus(L40S))})
    await api(REGISTER, {"input": node_input("other", gpus=gpus(L40S))})
    await api(SET, {"p": {"name": "hgx-h100", "selector": HGX, "gpuClass": "H100-80GB"}})
    [finding] = (await node(api))["drift"]
    assert (finding["kind"], finding["observed"]) == ("GPU_CLASS_CHANGED", "L40S-48GB on GPU 0-7")
    other = (await api('{ node(id: "other") { drift { kind } } }'))["node"]
    assert other["drift"] == []
    listed = (await api("{ hardwareProfiles { name gpuClass } }"))["hardwareProfiles"]
    assert listed == [{"name": "hgx-h100", "gpuClass": "H100-80GB"}]
    assert (await api('mutation { removeHardwareProfile(name: "hgx-h100") }')) == {
        "removeHardwareProfile": True
    }
    found = await node(api)
    assert found["drift"] == [] and found["taints"] == []
    assert (await api('mutation { removeHardwareProfile(name: "hgx-h100") }')) == {
        "removeHardwareProfile": False
    }


async def test_a_bad_profile_is_refused_naming_the_field(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, hgx())
    before = await stored(engine)
    for given, field in (
        ({"name": ""}, "input.name"),
        ({"gpuCount": 0}, "input.gpuCount"),
        ({"hcaRateGbps": -400}, "input.hcaRateGbps"),
        ({"selector": {"key": " ", "value": "x"}}, "input.selector.key"),
        ({"gpuCount": 4, "nvlinkGroupSize": 8}, "input.nvlinkGroupSize"),
    ):
        profile = {"name": "hgx-h100", "selector": HGX, **given}
        error = await api.fails(SET, {"p": profile})
        assert (error["extensions"]["code"], error["extensions"]["field"]) == ("BAD_INPUT", field)
    assert await stored(engine) == before
    assert (await api("{ hardwareProfiles { name } }"))["hardwareProfiles"] == []


async def test_hcas_are_missing_only_when_the_agent_looked(api: Api, engine: AsyncEngine) -> None:
    await api(SET, {"p": {"name": "hgx-h100", "selector": HGX, "hcaCount": 2}})

    async def report(discovery: str | None, fabrics: list[dict[str, Any]]) -> list[Any]:
        sent = node_input("hgx-1", labels=LABELS, fabrics=fabrics, hcaDiscovery=discovery)
        await api(REGISTER, {"input": sent})
        found = await api('{ node(id: "hgx-1") { hcaDiscovery drift { kind observed } } }')
        assert found["node"]["hcaDiscovery"] == discovery
        return [(d["kind"], d["observed"]) for d in found["node"]["drift"]]

    # Not asked to look (no fabrics configured): the HCAs are unknown, not missing.
    assert await report("NOT_ASKED", []) == []
    # Asked, and the kernel shows no InfiniBand at all: both are missing.
    assert await report("NO_INFINIBAND", []) == [
        ("HCA_MISSING", "0 HCAs (no /sys/class/infiniband: no InfiniBand driver or adapter)")
    ]
    # Looked and found one of two.
    assert await report("LOOKED", [RAILS[0]]) == [("HCA_MISSING", "1 HCA")]
    assert await report("LOOKED", RAILS) == []
    # An agent that does not say (older than hcaDiscovery): as before, no
    # adapter reported reads as not looked for, one reported as looked.
    assert await report(None, []) == []
    assert await report(None, [RAILS[0]]) == [("HCA_MISSING", "1 HCA")]

    before = await stored(engine)
    error = await api.fails(
        REGISTER, {"input": node_input("hgx-1", labels=LABELS, hcaDiscovery="MAYBE")}
    )
    assert "MAYBE" in error["message"] and "HcaDiscovery" in error["message"]
    assert await stored(engine) == before
