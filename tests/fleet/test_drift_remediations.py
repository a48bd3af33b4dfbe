"""Drift acts through the remediation policy: a remediation per new finding, the breaker, escalation.

Stories against the real database through the API (issue 38): a finding is
work for the operator's automation like an XID, capped by the same circuit
breaker, and its clearing ends the remediation.
"""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.drift import EVENTS, HGX, LABELS, SET, hgx, node
from tests.support.metrics import scrape
from tests.support.remediations import FINISH, START, VALIDATE, remediations, validation
from tests.support.remediations import NODE as REMEDIATION_NODE
from tests.support.reports import H100, REGISTER, gpus, node_input

EIGHT = {"name": "hgx-h100", "selector": HGX, "gpuCount": 8}


def shown(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["trigger"], r["action"], r["scope"], r["state"], r["gpuIndices"], r["taintKey"])


async def test_a_missing_gpu_is_a_reboot_that_the_gpu_coming_back_ends(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, hgx())
    await api(SET, {"p": EIGHT})
    await api(REGISTER, hgx(count=7))
    # The policy's action for GPU_MISSING, on the node's seven, holding the node's taint.
    [made] = await remediations(api)
    assert shown(made) == (
        "drift-gpu-missing", "REBOOT_NODE", "NODE", "PENDING", list(range(7)), "drift-gpu-missing"
    )  # fmt: skip
    assert made["cause"] == "GPU_MISSING: expected 8 GPUs, observed 7 GPUs"
    finding = (await api('{ node(id: "hgx-1") { drift { kind remediationId } } }'))["node"]
    assert finding["drift"] == [{"kind": "GPU_MISSING", "remediationId": made["id"]}]
    assert [t["key"] for t in (await node(api))["taints"]] == ["drift-gpu-missing"]
    # The automation takes it and says it is done: it waits for the node's
    # report, not for a test (a diagnostic cannot see the missing GPU).
    await api(START, {"id": made["id"]})
    await api(FINISH, {"id": made["id"], "ok": True})
    assert (await api(REMEDIATION_NODE, {"id": "hgx-1"}))["node"]["validationsToRun"] == []
    passed = await api(VALIDATE, validation_on("hgx-1", list(range(7))))
    assert passed["recordValidation"] is None
    [waiting] = await remediations(api)
    assert waiting["state"] == "AWAITING_VALIDATION"
    assert [t["key"] for t in (await node(api))["taints"]] == ["drift-gpu-missing"]

    # The GPU is back: the finding goes, the remediation is DONE saying why, the taint goes.
    await api(REGISTER, hgx())
    [done] = await remediations(api)
    assert done["state"] == "DONE"
    found = await node(api)
    assert found["drift"] == [] and found["taints"] == []
    steps = (await api(EVENTS, {"k": ["drift_found", "remediation_created", "remediation_started",
                                      "remediation_finished", "drift_cleared",
                                      "remediation_done"]}))["events"]  # fmt: skip
    assert [(e["kind"], e["reason"]) for e in steps] == [
        ("drift_found", "GPU_MISSING: expected 8 GPUs, observed 7 GPUs"),
        ("remediation_created", "GPU_MISSING: expected 8 GPUs, observed 7 GPUs"),
        ("remediation_started", None),
        ("remediation_finished", "carried out"),
        ("drift_cleared", "GPU_MISSING: now as the profile says (8 GPUs)"),
        ("remediation_done", "drift cleared: GPU_MISSING: now as the profile says (8 GPUs)"),
    ]
    assert await inconsistencies(engine) == []


async def test_a_reboot_that_does_not_bring_the_gpu_back_escalates(api: Api) -> None:
    await api(REGISTER, hgx(bootId="boot-a"))
    await api(SET, {"p": EIGHT})
    await api(REGISTER, hgx(count=7, bootId="boot-a"))
    # The same seven GPUs after a reboot: the reboot did not fix it, a person's turn.
    await api(REGISTER, hgx(count=7, bootId="boot-b"))
    [r] = await remediations(api)
    assert (r["state"], r["action"]) == ("ESCALATED", "CONTACT_SUPPORT")
    [told] = (await api(EVENTS, {"k": ["remediation_escalated"]}))["events"]
    assert told["reason"] == (
        "carried out, and the node still drifts: GPU_MISSING: expected 8 GPUs, observed 7 GPUs"
    )
    # Escalated, it keeps the node's taint even when the GPU comes back.
    await api(REGISTER, hgx(bootId="boot-b"))
    found = await node(api)
    assert found["drift"] == []
    assert [t["key"] for t in found["taints"]] == ["drift-gpu-missing"]


async def test_a_reboot_that_brings_the_gpu_back_ends_it(api: Api) -> None:
    await api(REGISTER, hgx(bootId="boot-a"))
    await api(SET, {"p": EIGHT})
    await api(REGISTER, hgx(count=7, bootId="boot-a"))
    await api(REGISTER, hgx(bootId="boot-b"))
    [r] = await remediations(api)
    assert r["state"] == "DONE"
    assert (await node(api))["taints"] == []


async def test_a_gpu_missing_twice_within_7_days_is_escalated(api: Api) -> None:
    await api(REGISTER, hgx())
    await api(SET, {"p": EIGHT})
    await api(REGISTER, hgx(count=7))
    await api(REGISTER, hgx())
    await api(REGISTER, hgx(count=7))
    first, second = await remediations(api)
    assert first["state"] == "DONE"
    assert (second["state"], second["action"], second["taintKey"]) == (
        "ESCALATED", "CONTACT_SUPPORT", "drift-gpu-missing"
    )  # fmt: skip
    await api(REGISTER, hgx())
    assert [t["key"] for t in (await node(api))["taints"]] == ["drift-gpu-missing"]


async def test_a_wrong_profile_takes_out_no_more_than_the_breaker_allows(
    api: Api, client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    # 25 nodes of 8 H100s (a class of 200); a profile that says each should
    # have 2 TB of memory where they have 1 TB: every node drifts at once.
    for n in range(25):
        labelled = node_input(f"n{n:02d}", labels=LABELS, memoryTotalMb=1_000_000)
        await api(REGISTER, {"input": labelled})
    await api(SET, {"p": {"name": "hgx-h100", "selector": HGX, "memoryTotalMb": 2_000_000}})
    found = await remediations(api)
    assert len(found) == 25
    states = [r["state"] for r in found]
    # 10% of 200 is 20 GPUs: two nodes' worth; the third would be 24.
    assert states.count("PENDING") == 2 and states.count("SUPPRESSED") == 23
    assert all(r["taintKey"] is None for r in found if r["state"] == "SUPPRESSED")
    tainted = (await api("{ nodes { id taints { key } } }"))["nodes"]
    assert sum(bool(n["taints"]) for n in tainted) == 2
    created = (await api(EVENTS, {"k": ["remediation_created"]}))["events"]
    breaker = [e for e in created if e["detail"]["state"] == "SUPPRESSED"]
    assert len(breaker) == 23
    assert breaker[0]["reason"].startswith(
        "circuit breaker: more than 20 of 200 H100-80GB GPUs tainted by the policy in the last hour"
    )
    samples = await scrape(client)
    assert samples['inventory_remediations{state="SUPPRESSED",action="CONTACT_SUPPORT"}'] == 23
    # Every node still shows its finding: the breaker caps the taints, not what is known.
    assert samples['inventory_drift_findings{kind="MEMORY_LOW"}'] == 25
    assert await inconsistencies(engine) == []


async def test_a_gpu_counts_once_against_the_breaker(api: Api) -> None:
    # Two findings on one node of 8 (floor 8): both hold their taints.
    profile = {"name": "hgx-h100", "selector": HGX, "gpuCount": 8, "memoryTotalMb": 2_000_000}
    await api(SET, {"p": profile})
    await api(REGISTER, hgx(count=8, memoryTotalMb=1_000_000))
    await api(REGISTER, hgx(count=7, memoryTotalMb=1_000_000))
    found = await remediations(api)
    assert [(r["trigger"], r["state"]) for r in found] == [
        ("drift-memory-low", "PENDING"), ("drift-gpu-missing", "PENDING")
    ]  # fmt: skip
    assert sorted(t["key"] for t in (await node(api))["taints"]) == [
        "drift-gpu-missing", "drift-memory-low"
    ]  # fmt: skip


async def test_a_slow_rail_that_moves_takes_its_remediation_and_taint_along(api: Api) -> None:
    await api(SET, {"p": {"name": "hgx-h100", "selector": HGX, "hcaRateGbps": 400}})
    await api(REGISTER, hgx(rate_b=200))
    [r] = await remediations(api)
    assert shown(r) == (
        "drift-hca-rate-low", "CONTACT_SUPPORT", "GPU", "PENDING", [4, 5, 6, 7],
        "drift-hca-rate-low",
    )  # fmt: skip
    # Rail a slows down and rail b recovers: the finding, its remediation and taint move.
    slow_a = hgx()
    slow_a["input"]["fabrics"] = [{**slow_a["input"]["fabrics"][0], "rateGbps": 100},
                                  slow_a["input"]["fabrics"][1]]  # fmt: skip
    await api(REGISTER, slow_a)
    [moved] = await remediations(api)
    assert (moved["id"], moved["gpuIndices"]) == (r["id"], [0, 1, 2, 3])
    found = await node(api)
    assert [[t["key"] for t in g["taints"]] for g in found["gpus"]] == [
        ["drift-hca-rate-low"]
    ] * 4 + [[]] * 4
    await api(REGISTER, hgx())
    assert (await remediations(api))[0]["state"] == "DONE"
    assert all(g["taints"] == [] for g in (await node(api))["gpus"])


async def test_an_xid_on_a_drifting_node_is_its_own_remediation(api: Api) -> None:
    await api(SET, {"p": EIGHT})
    await api(REGISTER, hgx(count=7, bootId="boot-a"))
    struck = hgx(count=7, bootId="boot-a")
    struck["input"]["gpus"][2] = {**struck["input"]["gpus"][2], "xids": [95]}
    await api(REGISTER, struck)
    drifted, xid = await remediations(api)
    assert (drifted["trigger"], xid["trigger"]) == ("drift-gpu-missing", "xid-95")
    assert (xid["state"], xid["gpuIndices"]) == ("PENDING", [2])
    # A reboot carries both out; only the XID's waits for a DCGM diagnostic,
    # the drift's is judged by the report (still seven: escalated).
    await api(REGISTER, hgx(count=7, bootId="boot-b"))
    drifted, xid = await remediations(api)
    assert (drifted["state"], xid["state"]) == ("ESCALATED", "AWAITING_VALIDATION")
    to_run = (await api(REMEDIATION_NODE, {"id": "hgx-1"}))["node"]["validationsToRun"]
    assert to_run == [{"test": "dcgm_diag", "gpuIndices": [2], "remediationId": xid["id"]}]
    # A passing test does not count towards the drift's.
    answer = (await api(VALIDATE, validation_on("hgx-1", [2])))["recordValidation"]
    assert answer["id"] == xid["id"] and answer["state"] == "DONE"


def validation_on(node_id: str, indices: list[int]) -> dict[str, Any]:
    given = validation(indices, True)
    return {"input": {**given["input"], "nodeId": node_id}}


async def test_a_node_that_reports_no_gpus_is_tainted_without_a_remediation(api: Api) -> None:
    await api(SET, {"p": EIGHT})
    await api(REGISTER, {"input": node_input("hgx-1", labels=LABELS, gpus=[])})
    found = await node(api)
    assert [d["observed"] for d in found["drift"]] == ["0 GPUs"]
    assert [t["key"] for t in found["taints"]] == ["drift-gpu-missing"]
    assert await remediations(api) == []
    await api(REGISTER, {"input": node_input("hgx-1", labels=LABELS, gpus=gpus(H100))})
    found = await node(api)
    assert found["drift"] == [] and found["taints"] == []
