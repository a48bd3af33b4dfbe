"""Remediations: XIDs become work and taints, a reboot and a validation re-admit the GPU.

Stories against the real database through the API, as the agent, the
operator's automation and a scheduler see them (issue 38's acceptance).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.fleet.health import policy
from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.metrics import scrape
from tests.support.remediations import (
    EVENTS,
    FINISH,
    NODE,
    START,
    VALIDATE,
    remediations,
    stored,
    validation,
)
from tests.support.reports import H100, PLACE, REGISTER, gpus, node_input


def report(boot: str, xids: dict[int, list[int]] | None = None, node: str = "gpu-01",
           resets: dict[int, str] | None = None, **more: Any) -> dict[str, Any]:  # fmt: skip
    listed = gpus(H100)
    for index, numbers in (xids or {}).items():
        listed[index] = {**listed[index], "xids": numbers}
    for index, seen in (resets or {}).items():
        listed[index] = {**listed[index], "resetSeen": seen}
    return {"input": node_input(node, gpus=listed, bootId=boot, **more)}


async def place(api: Api, replica: str, per: int) -> dict[str, Any]:
    shape = {"replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": per}
    answer: dict[str, Any] = (await api(PLACE, {"input": shape}))["place"]
    return answer


@pytest.fixture
def installed() -> Iterator[None]:
    """Whatever a test installs, the built-in policy is back after it."""
    yield
    policy.install(policy.BUILT_IN)


async def test_xid_79_to_re_admission(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, report("boot-a"))
    await api(REGISTER, report("boot-a", {3: [79]}))

    # A NO_SCHEDULE XID taint on that GPU only, and a PENDING REBOOT_NODE remediation.
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert [g["taints"] for g in node["gpus"]] == [[]] * 3 + [
        [{"key": "xid-79", "effect": "NO_SCHEDULE", "source": "XID",
          "reason": "xid 79: the GPU has fallen off the bus: it answers nothing until a reboot"}]
    ] + [[]] * 4  # fmt: skip
    assert node["gpus"][3]["recommendedAction"] == "REBOOT_NODE"
    assert node["validationsToRun"] == []
    [pending] = await remediations(api)
    assert {k: pending[k] for k in ("gpuIndices", "action", "state", "trigger", "scope")} == {
        "gpuIndices": [3],
        "action": "REBOOT_NODE",
        "state": "PENDING",
        "trigger": "xid-79",
        "scope": "GPU",
    }
    # The other seven still place a TP-4.
    placed = await place(api, "tp4", 4)
    assert placed["allocations"][0]["gpuIndices"] == [0, 1, 2, 4]

    # A reboot carries it out: it waits for the validation the policy requires.
    await api(REGISTER, report("boot-b"))
    [waiting] = await remediations(api)
    assert waiting["state"] == "AWAITING_VALIDATION"
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert node["validationsToRun"] == [
        {"test": "dcgm_diag", "gpuIndices": [3], "remediationId": waiting["id"]}
    ]
    assert node["gpus"][3]["healthReasons"] == ["xid_79"]

    # A failed validation keeps the taint; a passed one clears it.
    failed = (await api(VALIDATE, validation([3], False)))["recordValidation"]
    assert failed == {"id": waiting["id"], "state": "AWAITING_VALIDATION", "attempts": 1}
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert [t["key"] for t in node["gpus"][3]["taints"]] == ["xid-79"]
    assert {"index": 3} not in node["freeGpus"]
    passed = (await api(VALIDATE, validation([3], True)))["recordValidation"]
    assert passed == {"id": waiting["id"], "state": "DONE", "attempts": 2}
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert node["gpus"][3] == {
        "index": 3, "healthy": True, "healthReasons": [], "recommendedAction": "NONE", "taints": []
    }  # fmt: skip
    assert node["validationsToRun"] == []
    # The GPU places again.
    assert (await place(api, "tp4-b", 4))["allocations"][0]["gpuIndices"] == [3, 5, 6, 7]

    kinds = [(e["kind"], e["detail"].get("state")) for e in (await api(EVENTS, {"kinds": [
        "remediation_created", "remediation_finished", "remediation_done", "validation_recorded"
    ]}))["events"]]  # fmt: skip
    assert kinds == [
        ("remediation_created", "PENDING"),
        ("remediation_finished", "AWAITING_VALIDATION"),
        ("validation_recorded", None),
        ("validation_recorded", None),
        ("remediation_done", "DONE"),
    ]
    assert await inconsistencies(engine) == []


async def test_xid_95_resets_one_gpu_and_xid_63_does_nothing(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, report("boot-a", {5: [95], 6: [63]}))
    [reset] = await remediations(api)
    assert (reset["action"], reset["scope"], reset["gpuIndices"]) == ("RESET_GPU", "GPU", [5])
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert node["gpus"][6]["taints"] == [] and node["gpus"][6]["healthy"]
    assert {"index": 6} in node["freeGpus"] and {"index": 5} not in node["freeGpus"]
    # An operator's reset (clearGpuHealth) carries out the RESET_GPU.
    await api('mutation { clearGpuHealth(nodeId: "gpu-01", index: 5) { index } }')
    assert (await remediations(api))[0]["state"] == "AWAITING_VALIDATION"
    assert await inconsistencies(engine) == []


async def test_a_second_remediation_within_7_days_is_escalated(api: Api) -> None:
    await api(REGISTER, report("boot-a", {2: [79]}))
    await api(REGISTER, report("boot-b"))
    await api(VALIDATE, validation([2], True))
    # The fault comes back.
    await api(REGISTER, report("boot-b", {2: [79]}))
    first, second = await remediations(api)
    assert first["state"] == "DONE"
    assert (second["state"], second["action"]) == ("ESCALATED", "CONTACT_SUPPORT")
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert [t["key"] for t in node["gpus"][2]["taints"]] == ["xid-79"]
    # It stays tainted through a reboot: no validation for an escalated one.
    await api(REGISTER, report("boot-c"))
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert node["validationsToRun"] == []
    assert [t["key"] for t in node["gpus"][2]["taints"]] == ["xid-79"]


async def test_the_automations_steps_and_wrong_ones(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, report("boot-a", {1: [48]}))
    [r] = await remediations(api)
    before = await stored(engine)
    # A transition that skips a state: CONFLICT naming the id and its state, nothing changed.
    error = await api.fails(FINISH, {"id": r["id"], "ok": True})
    assert error["extensions"] == {
        "code": "CONFLICT", "field": "id", "value": r["id"], "state": "PENDING"
    }  # fmt: skip
    assert "startRemediation first" in error["message"]
    assert await stored(engine) == before

    started = (await api(START, {"id": r["id"]}))["startRemediation"]
    assert started["state"] == "IN_PROGRESS"
    before = await stored(engine)
    again = await api.fails(START, {"id": r["id"]})
    assert again["extensions"]["code"] == "CONFLICT"
    assert again["extensions"]["state"] == "IN_PROGRESS"
    assert await stored(engine) == before

    finished = await api(FINISH, {"id": r["id"], "ok": False, "note": "reset hung"})
    assert finished["finishRemediation"] == {
        "id": r["id"], "state": "ESCALATED", "action": "CONTACT_SUPPORT"
    }  # fmt: skip
    steps = await api(EVENTS, {"kinds": ["remediation_started", "remediation_escalated"]})
    assert [(e["kind"], e["reason"]) for e in steps["events"]] == [
        ("remediation_started", None),
        ("remediation_escalated", "reset hung"),
    ]
    missing = await api.fails(START, {"id": "999"})
    assert missing["extensions"] == {"code": "NOT_FOUND", "field": "id", "value": "999"}
    bad = await api.fails(START, {"id": "seven"})
    assert bad["extensions"]["code"] == "BAD_INPUT" and bad["extensions"]["field"] == "id"


async def test_three_failed_validations_escalate(api: Api) -> None:
    await api(REGISTER, report("boot-a", {4: [79]}))
    await api(REGISTER, report("boot-b"))
    states = [
        (await api(VALIDATE, validation([4], False)))["recordValidation"]["state"] for _ in range(3)
    ]
    assert states == ["AWAITING_VALIDATION", "AWAITING_VALIDATION", "ESCALATED"]
    assert (await remediations(api))[0]["action"] == "CONTACT_SUPPORT"


async def test_a_validation_no_remediation_awaits_taints_on_failure(api: Api) -> None:
    await api(REGISTER, report("boot-a"))
    assert (await api(VALIDATE, validation([0, 1], False, "nccl_loopback")))[
        "recordValidation"
    ] is None
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert node["gpus"][0]["taints"] == [
        {"key": "validation-nccl_loopback", "effect": "NO_SCHEDULE", "source": "VALIDATION",
         "reason": 'nccl_loopback failed: {"result": "fail"}'}
    ]  # fmt: skip
    await api(VALIDATE, validation([0, 1], True, "nccl_loopback"))
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert node["gpus"][0]["taints"] == [] and node["gpus"][1]["taints"] == []


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"gpuIndices": [9]}, "input.gpuIndices[0]"),
        ({"gpuIndices": []}, "input.gpuIndices"),
        ({"gpuIndices": [1, 1]}, "input.gpuIndices[1]"),
        ({"test": ""}, "input.test"),
        ({"details": "x" * 20_000}, "input.details"),
    ],
)
async def test_a_bad_validation_is_refused_naming_the_field(
    api: Api, engine: AsyncEngine, given: dict[str, Any], field: str
) -> None:
    await api(REGISTER, report("boot-a", {2: [79]}))
    await api(REGISTER, report("boot-b"))
    before = await stored(engine)
    error = await api.fails(VALIDATE, {"input": {**validation([2], True)["input"], **given}})
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == field
    assert await stored(engine) == before


async def test_the_circuit_breaker_taints_a_tenth_of_a_class_and_suppresses_the_rest(
    api: Api, client: httpx.AsyncClient
) -> None:
    # 25 nodes of 8: a class of 200 GPUs; a burst of XID 79 on 60 of them (30%).
    for n in range(25):
        await api(REGISTER, report("boot-a", node=f"n{n:02d}"))
    struck = [(n, i) for n in range(25) for i in range(8)][:60]
    for n in range(8):
        xids = {i: [79] for m, i in struck if m == n}
        if xids:
            await api(REGISTER, report("boot-a", xids, node=f"n{n:02d}"))
    found = await remediations(api)
    states = [r["state"] for r in found]
    assert len(found) == 60
    assert states.count("PENDING") == 20 and states.count("SUPPRESSED") == 40
    tainted = sum(r["taintKey"] is not None for r in found)
    assert tainted == 20
    summary = (await api("{ gpuClasses { tainted } }"))["gpuClasses"][0]
    assert summary["tainted"] == 0  # the struck GPUs are unhealthy (xid_79) or suppressed
    suppressed = (await api(EVENTS, {"kinds": ["remediation_created"]}))["events"]
    breaker = [e for e in suppressed if e["detail"]["state"] == "SUPPRESSED"]
    assert len(breaker) == 40
    assert breaker[0]["reason"].startswith(
        "circuit breaker: more than 20 of 200 H100-80GB GPUs tainted by the policy in the last hour"
    )
    samples = await scrape(client)
    assert samples['inventory_remediations{state="SUPPRESSED",action="REBOOT_NODE"}'] == 40
    assert samples['inventory_remediations{state="PENDING",action="REBOOT_NODE"}'] == 20
    # A suppressed GPU stays placeable: only the tainted twenty are out.
    free = (await api("{ freeGpus { gpuIndices } }"))["freeGpus"]
    assert sum(len(e["gpuIndices"]) for e in free) == 200 - 20


async def test_an_operators_policy_file_changes_what_an_xid_does(api: Api, installed: None) -> None:
    policy.install(
        policy.parse(
            '[xid.79]\naction = "RESET_GPU"\nscope = "NODE"\neffect = "PREFER_NO_SCHEDULE"\n'
            "[validation]\ntests = []\n"
        )
    )
    await api(REGISTER, report("boot-a", {3: [79]}))
    [r] = await remediations(api)
    assert (r["action"], r["scope"], r["gpuIndices"]) == ("RESET_GPU", "NODE", list(range(8)))
    taints = (await api('{ node(id: "gpu-01") { taints { key effect } } }'))["node"]["taints"]
    assert taints == [{"key": "xid-79", "effect": "PREFER_NO_SCHEDULE"}]
    # No test required: the reboot finishes it, and its taint goes.
    await api(REGISTER, report("boot-b"))
    assert (await remediations(api))[0]["state"] == "DONE"
    taints = (await api('{ node(id: "gpu-01") { taints { key } } }'))["node"]["taints"]
    assert taints == []


async def test_a_node_wide_remediation_needs_the_test_on_all_its_gpus(
    api: Api, installed: None
) -> None:
    policy.install(policy.parse('[xid.79]\nscope = "NODE"\n'))
    await api(REGISTER, report("boot-a", {3: [79]}))
    await api(REGISTER, report("boot-b"))
    [waiting] = await remediations(api)
    assert (waiting["state"], waiting["gpuIndices"]) == ("AWAITING_VALIDATION", list(range(8)))
    # A failure says why, in the event the operator reads.
    await api(VALIDATE, validation([3], False))
    [told] = (await api(EVENTS, {"kinds": ["validation_recorded"]}))["events"]
    assert told["reason"] == 'dcgm_diag failed on GPU 3: {"result": "fail"}'
    # A pass on one GPU says nothing of the other seven.
    answer = (await api(VALIDATE, validation([3], True)))["recordValidation"]
    assert answer["state"] == "AWAITING_VALIDATION"
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert node["validationsToRun"] == [
        {"test": "dcgm_diag", "gpuIndices": list(range(8)), "remediationId": waiting["id"]}
    ]
    answer = (await api(VALIDATE, validation(list(range(8)), True)))["recordValidation"]
    assert answer["state"] == "DONE"
    assert (await api('{ node(id: "gpu-01") { taints { key } } }'))["node"]["taints"] == []


async def test_a_reset_the_agent_saw_finishes_the_gpus_reset_gpu_remediation(
    api: Api, engine: AsyncEngine
) -> None:
    # XID 95 on GPU 5 (RESET_GPU), XID 79 on GPU 3 (REBOOT_NODE).
    await api(REGISTER, report("boot-a", {5: [95], 3: [79]}))
    reboot, reset = sorted(await remediations(api), key=lambda r: r["gpuIndices"])
    assert (reset["action"], reset["gpuIndices"]) == ("RESET_GPU", [5])
    await api(START, {"id": reset["id"]})

    # The agent saw GPU 5 reset (same boot): that remediation waits for
    # validation, the reboot's does not move, and GPU 5's sticky health held
    # by the waiting remediation stays until the validation passes.
    seen = "the pending row remap was applied"
    await api(REGISTER, report("boot-a", resets={5: seen}))
    states = {r["id"]: r["state"] for r in await remediations(api)}
    assert states == {reset["id"]: "AWAITING_VALIDATION", reboot["id"]: "PENDING"}
    [told] = (await api(EVENTS, {"kinds": ["remediation_finished"]}))["events"]
    assert told["reason"] == f"GPU 5 was reset (the agent saw it: {seen})"
    assert told["detail"]["was"] == "IN_PROGRESS"
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert node["validationsToRun"] == [
        {"test": "dcgm_diag", "gpuIndices": [5], "remediationId": reset["id"]}
    ]
    assert node["gpus"][5]["healthReasons"] == ["xid_95"]
    passed = (await api(VALIDATE, validation([5], True)))["recordValidation"]
    assert passed["state"] == "DONE"
    node = (await api(NODE, {"id": "gpu-01"}))["node"]
    assert node["gpus"][5]["taints"] == [] and node["gpus"][5]["healthy"]
    assert [t["key"] for t in node["gpus"][3]["taints"]] == ["xid-79"]
    # Sent again (an agent that did not hear the answer), it moves nothing more.
    await api(REGISTER, report("boot-a", resets={5: seen}))
    assert {r["id"]: r["state"] for r in await remediations(api)} == {
        reset["id"]: "DONE", reboot["id"]: "PENDING"
    }  # fmt: skip
    assert await inconsistencies(engine) == []


@pytest.mark.parametrize(("seen", "why"), [("", "say how"), ("x" * 1025, "longer than")])
async def test_a_bad_reset_is_refused_naming_the_field(
    api: Api, engine: AsyncEngine, seen: str, why: str
) -> None:
    await api(REGISTER, report("boot-a", {5: [95]}))
    before = await stored(engine)
    error = await api.fails(REGISTER, report("boot-a", resets={5: seen}))
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == "input.gpus[5].resetSeen"
    assert why in error["message"]
    assert await stored(engine) == before
