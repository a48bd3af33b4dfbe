"""A fault that joins an open remediation: its own taint, the action, and which remediation (issue 44).

remediation.md: "a fault it acts on taints the GPUs it concerns", and a fault
on GPUs with an open remediation joins it (its action rises). Stories against
the real database through the API, each first as the outside check reported it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.fleet.health import policy
from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.remediations import EVENTS, FINISH, START, VALIDATE, remediations
from tests.support.reports import A100, H100, PLACE, REGISTER, gpus, node_input

NODE = """
query N($id: ID!) {
  node(id: $id) {
    validationsToRun { test gpuIndices remediationId }
    gpus { index healthy healthReasons recommendedAction taints { key effect source } }
    freeGpus { index }
  }
}
"""
# Two NVLink groups of four (an A100 HGX board seen as two groups), one of
# eight (an H100 NVSwitch board), or unknown (None).
TWO_GROUPS = (range(0, 4), range(4, 8))
ONE_GROUP = (range(0, 8),)


def board(
    node: str,
    model: dict[str, Any],
    groups: Sequence[range] | None,
    boot: str = "boot-a",
    xids: dict[int, list[int]] | None = None,
    resets: dict[int, str] | None = None,
) -> dict[str, Any]:
    """A node's report: its GPUs, their NVLink peers, the XIDs and resets seen since the last one."""
    listed = gpus(model)
    for group in groups or ():
        for i in group:
            listed[i]["nvlinkPeers"] = [p for p in group if p != i]
    for i, numbers in (xids or {}).items():
        listed[i]["xids"] = numbers
    for i, seen in (resets or {}).items():
        listed[i]["resetSeen"] = seen
    return {"input": node_input(node, gpus=listed, bootId=boot)}


def checked(node: str, indices: list[int], passed: bool = True) -> dict[str, Any]:
    return {"input": {"nodeId": node, "gpuIndices": indices, "test": "dcgm_diag",
                      "passed": passed}}  # fmt: skip


async def node_of(api: Api, node: str) -> dict[str, Any]:
    found: dict[str, Any] = (await api(NODE, {"id": node}))["node"]
    return found


def taints(node: dict[str, Any]) -> dict[int, list[str]]:
    """Each GPU's taints as key:EFFECT, GPUs without any left out."""
    return {
        g["index"]: [f"{t['key']}:{t['effect']}" for t in g["taints"]]
        for g in node["gpus"]
        if g["taints"]
    }


def free(node: dict[str, Any]) -> list[int]:
    return [g["index"] for g in node["freeGpus"]]


def shown(found: list[dict[str, Any]]) -> list[tuple[list[int], str, str, str | None]]:
    return [(r["gpuIndices"], r["action"], r["state"], r["taintKey"]) for r in found]


@pytest.fixture
def installed() -> Iterator[None]:
    yield
    policy.install(policy.BUILT_IN)


async def test_xid_48_after_94_taints_the_gpu_and_its_validation_lifts_it(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, board("n1", H100, None))
    await api(REGISTER, board("n1", H100, None, xids={1: [94]}))
    # XID 94: RESTART_APP, no taint; GPU 1 is still offered.
    assert 1 in free(await node_of(api, "n1"))
    await api(REGISTER, board("n1", H100, None, xids={1: [48]}))

    # The table: 48 -> RESET_GPU, NO_SCHEDULE on the GPU.
    node = await node_of(api, "n1")
    assert taints(node) == {1: ["xid-48:NO_SCHEDULE"]}
    assert 1 not in free(node)
    [r] = await remediations(api)
    assert (r["gpuIndices"], r["action"], r["state"], r["trigger"], r["taintKey"]) == (
        [1], "RESET_GPU", "PENDING", "xid-94", "xid-48"
    )  # fmt: skip
    [joined] = (await api(EVENTS, {"kinds": ["remediation_joined"]}))["events"]
    assert joined["detail"]["trigger"] == "xid-48" and joined["detail"]["on"] == [1]

    # A reboot carries it out; the taint (not only the sticky health a reboot
    # keeps while the remediation is open) holds GPU 1 until it is validated.
    await api(REGISTER, board("n1", H100, None, boot="boot-b"))
    node = await node_of(api, "n1")
    assert node["gpus"][1]["healthReasons"] == ["xid_48"]
    assert 1 not in free(node)
    assert (await api(VALIDATE, checked("n1", [1])))["recordValidation"]["state"] == "DONE"
    node = await node_of(api, "n1")
    assert taints(node) == {} and node["gpus"][1]["healthy"]
    assert node["gpus"][1]["recommendedAction"] == "NONE"
    assert 1 in free(node)
    assert await inconsistencies(engine) == []


async def test_xid_74_after_79_taints_the_whole_nvlink_group(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, board("a1", A100, TWO_GROUPS))
    await api(REGISTER, board("a1", A100, TWO_GROUPS, xids={7: [79]}))
    await api(REGISTER, board("a1", A100, TWO_GROUPS, xids={5: [74]}))

    # 74 -> NO_SCHEDULE on every GPU of the group: none of 4-7 is offered.
    node = await node_of(api, "a1")
    assert taints(node) == {
        4: ["xid-74:NO_SCHEDULE"],
        5: ["xid-74:NO_SCHEDULE"],
        6: ["xid-74:NO_SCHEDULE"],
        7: ["xid-74:NO_SCHEDULE", "xid-79:NO_SCHEDULE"],
    }
    assert free(node) == [0, 1, 2, 3]
    # GPU 7's remediation took the fault for GPU 7 (its action stays the
    # reboot); GPUs 4-6, which had none, are a new one of XID 74.
    assert shown(await remediations(api)) == [
        ([7], "REBOOT_NODE", "PENDING", "xid-79"),
        ([4, 5, 6], "RESET_GPU", "PENDING", "xid-74"),
    ]
    # place never lands on the broken group: one TP-4 fits, on 0-3, a second does not.
    shape = {"gpuClass": "A100-40GB", "gpusPerShard": 4, "nvlinkShards": True}
    first = (await api(PLACE, {"input": {"replicaId": "tp4-a", **shape}}))["place"]
    assert first["allocations"][0]["gpuIndices"] == [0, 1, 2, 3]
    second = (await api(PLACE, {"input": {"replicaId": "tp4-b", **shape}}))["place"]
    assert second["__typename"] == "Unplaceable"

    # A reboot carries both out; each is validated on its own GPUs and lifts
    # what its faults put there.
    await api(REGISTER, board("a1", A100, TWO_GROUPS, boot="boot-b"))
    reboot, group = await remediations(api)
    assert (reboot["state"], group["state"]) == ("AWAITING_VALIDATION", "AWAITING_VALIDATION")
    await api(VALIDATE, checked("a1", [4, 5, 6]))
    node = await node_of(api, "a1")
    assert taints(node) == {7: ["xid-74:NO_SCHEDULE", "xid-79:NO_SCHEDULE"]}
    await api(VALIDATE, checked("a1", [7]))
    node = await node_of(api, "a1")
    assert taints(node) == {} and free(node) == [4, 5, 6, 7]
    assert [g["healthReasons"] for g in node["gpus"]] == [[]] * 8
    assert await inconsistencies(engine) == []


async def test_the_remediation_of_a_gpu_rises_to_its_recommended_action(
    api: Api, engine: AsyncEngine
) -> None:
    # One NVLink group of eight: XID 74 on GPU 4 concerns GPU 1 as well.
    await api(REGISTER, board("h1", H100, ONE_GROUP))
    await api(REGISTER, board("h1", H100, ONE_GROUP, xids={1: [48]}))
    await api(REGISTER, board("h1", H100, ONE_GROUP, xids={4: [94]}))
    await api(REGISTER, board("h1", H100, ONE_GROUP, xids={4: [74]}))

    node = await node_of(api, "h1")
    assert node["gpus"][4]["recommendedAction"] == "RESET_GPU"
    by_gpu = {i: r for r in await remediations(api) for i in r["gpuIndices"]}
    # GPU 4's own remediation takes the fault (not GPU 1's, the group's oldest).
    assert by_gpu[4]["trigger"] == "xid-94" and by_gpu[4]["action"] == "RESET_GPU"
    assert by_gpu[1]["trigger"] == "xid-48" and by_gpu[1]["action"] == "RESET_GPU"
    assert by_gpu[0]["trigger"] == "xid-74"
    # Each GPU is in one open remediation, whose action is at least what the
    # GPU's sticky faults recommend.
    rank = ["NONE", "RESTART_APP", "RESET_GPU", "REBOOT_NODE", "CONTACT_SUPPORT"]
    assert sorted(by_gpu) == list(range(8)) and len({r["id"] for r in by_gpu.values()}) == 3
    for g in node["gpus"]:
        assert rank.index(by_gpu[g["index"]]["action"]) >= rank.index(g["recommendedAction"])
    assert free(node) == []

    # A reset the agent saw on GPU 4 carries out GPU 4's remediation.
    await api(
        REGISTER, board("h1", H100, ONE_GROUP, resets={4: "the volatile ECC count went down"})
    )
    assert {r["id"]: r["state"] for r in await remediations(api)}[by_gpu[4]["id"]] == (
        "AWAITING_VALIDATION"
    )
    # And a reboot the rest.
    await api(REGISTER, board("h1", H100, ONE_GROUP, boot="boot-b"))
    assert {r["state"] for r in await remediations(api)} == {"AWAITING_VALIDATION"}
    assert await inconsistencies(engine) == []


async def test_a_group_fault_joins_each_gpus_own_remediation(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, board("a1", A100, TWO_GROUPS))
    await api(REGISTER, board("a1", A100, TWO_GROUPS, xids={5: [48], 6: [79]}))
    await api(REGISTER, board("a1", A100, TWO_GROUPS, xids={4: [74]}))
    assert shown(await remediations(api)) == [
        ([5], "RESET_GPU", "PENDING", "xid-48"),
        ([6], "REBOOT_NODE", "PENDING", "xid-79"),
        ([4, 7], "RESET_GPU", "PENDING", "xid-74"),
    ]
    node = await node_of(api, "a1")
    assert {i: keys for i, keys in taints(node).items()} == {
        4: ["xid-74:NO_SCHEDULE"],
        5: ["xid-48:NO_SCHEDULE", "xid-74:NO_SCHEDULE"],
        6: ["xid-74:NO_SCHEDULE", "xid-79:NO_SCHEDULE"],
        7: ["xid-74:NO_SCHEDULE"],
    }
    events = (await api(EVENTS, {"kinds": ["remediation_created", "remediation_joined"]}))["events"]
    assert [(e["kind"], e["detail"]["gpuIndices"], e["detail"].get("on")) for e in events] == [
        ("remediation_created", [5], None),
        ("remediation_created", [6], None),
        ("remediation_joined", [5], [5]),
        ("remediation_joined", [6], [6]),
        ("remediation_created", [4, 7], None),
    ]
    # GPU 5's validation lifts xid-74 from GPU 5 only: the rest of the group
    # stays out until its own remediations are validated.
    await api(
        REGISTER, board("a1", A100, TWO_GROUPS, resets={5: "the volatile ECC count went down"})
    )
    await api(VALIDATE, checked("a1", [5]))
    node = await node_of(api, "a1")
    assert 5 not in taints(node) and free(node) == [0, 1, 2, 3, 5]
    assert await inconsistencies(engine) == []


async def test_a_tainting_fault_sends_a_remediation_awaiting_validation_back_to_pending(
    api: Api,
) -> None:
    await api(REGISTER, board("n1", H100, None, xids={3: [79]}))
    await api(REGISTER, board("n1", H100, None, boot="boot-b"))
    [r] = await remediations(api)
    assert r["state"] == "AWAITING_VALIDATION"
    # The GPU falls off the bus again after the reboot: what was carried out
    # did not stop the fault, and a validation must not re-admit it.
    await api(REGISTER, board("n1", H100, None, boot="boot-b", xids={3: [79]}))
    [r] = await remediations(api)
    assert (r["state"], r["action"]) == ("PENDING", "REBOOT_NODE")
    node = await node_of(api, "n1")
    assert node["validationsToRun"] == []
    assert (await api(VALIDATE, checked("n1", [3])))["recordValidation"] is None
    assert taints(await node_of(api, "n1")) == {3: ["xid-79:NO_SCHEDULE"]}
    # A fault that does not taint (XID 94) leaves a waiting one waiting.
    await api(REGISTER, board("n1", H100, None, boot="boot-c"))
    await api(REGISTER, board("n1", H100, None, boot="boot-c", xids={3: [94]}))
    [r] = await remediations(api)
    assert (r["state"], r["action"]) == ("AWAITING_VALIDATION", "REBOOT_NODE")
    assert (await api(VALIDATE, checked("n1", [3])))["recordValidation"]["state"] == "DONE"
    assert taints(await node_of(api, "n1")) == {}


async def test_a_later_fault_on_an_escalated_gpu_is_escalated_from_the_start(api: Api) -> None:
    await api(REGISTER, board("n1", H100, None, xids={2: [48]}))
    [r] = await remediations(api)
    await api(START, {"id": r["id"]})
    await api(FINISH, {"id": r["id"], "ok": False, "note": "reset hung"})
    # ESCALATED is closed to the automation: XID 94 (RESTART_APP, no taint of
    # its own) on the same GPU joins nothing; its remediation is ESCALATED
    # from the start, CONTACT_SUPPORT, and taints NO_SCHEDULE.
    await api(REGISTER, board("n1", H100, None, xids={2: [94]}))
    assert shown(await remediations(api)) == [
        ([2], "CONTACT_SUPPORT", "ESCALATED", "xid-48"),
        ([2], "CONTACT_SUPPORT", "ESCALATED", "xid-94"),
    ]
    node = await node_of(api, "n1")
    assert taints(node) == {2: ["xid-48:NO_SCHEDULE", "xid-94:NO_SCHEDULE"]}
    # A reboot carries out nothing of them: the taints stay until an operator lifts them.
    await api(REGISTER, board("n1", H100, None, boot="boot-b"))
    assert taints(await node_of(api, "n1")) == {2: ["xid-48:NO_SCHEDULE", "xid-94:NO_SCHEDULE"]}


async def test_a_join_passes_the_circuit_breaker(api: Api, installed: None) -> None:
    # Two nodes of 8: a class of 16 whose breaker lets the policy taint one GPU an hour.
    policy.install(policy.parse("[breaker]\nfraction = 0.05\nfloor = 1\n"))
    for node in ("n1", "n2"):
        await api(REGISTER, board(node, H100, None))
    await api(REGISTER, board("n1", H100, None, xids={0: [94]}))  # no taint: not counted
    await api(REGISTER, board("n2", H100, None, xids={1: [79]}))  # the one place
    await api(REGISTER, board("n1", H100, None, xids={0: [48]}))
    # The join would be a second GPU: it changes nothing, and says why.
    assert shown(await remediations(api, node="n1")) == [([0], "RESTART_APP", "PENDING", None)]
    node = await node_of(api, "n1")
    assert taints(node) == {} and node["gpus"][0]["healthy"] and 0 in free(node)
    [joined] = (await api(EVENTS, {"kinds": ["remediation_joined"]}))["events"]
    assert joined["detail"]["suppressed"] is True
    assert joined["reason"].startswith(
        "circuit breaker: more than 1 of 16 H100-80GB GPUs tainted by the policy in the last hour"
    )
    # A join on a GPU the policy already tainted takes no new place.
    await api(REGISTER, board("n2", H100, None, xids={1: [48]}))
    assert taints(await node_of(api, "n2")) == {1: ["xid-48:NO_SCHEDULE", "xid-79:NO_SCHEDULE"]}


@pytest.mark.parametrize(("nodes", "limit"), [(12, 9), (13, 10)])
async def test_the_breakers_tenth_rounds_down(api: Api, nodes: int, limit: int) -> None:
    # 96 GPUs: a tenth is 9.6, at most 9 tainted; 104: 10.4, at most 10 (the floor is 8).
    for n in range(nodes):
        await api(REGISTER, board(f"n{n:02d}", H100, None))
    for n in range(limit + 1):
        await api(REGISTER, board(f"n{n:02d}", H100, None, xids={0: [79]}))
    states = [r["state"] for r in await remediations(api)]
    assert states == ["PENDING"] * limit + ["SUPPRESSED"]
    [told] = [
        e
        for e in (await api(EVENTS, {"kinds": ["remediation_created"]}))["events"]
        if e["detail"]["state"] == "SUPPRESSED"
    ]
    assert told["reason"].startswith(f"circuit breaker: more than {limit} of {nodes * 8} H100-80GB")


def test_the_breakers_share_is_the_decimal_written_rounded_down() -> None:
    at = policy.parse
    assert at("[breaker]\nfraction = 0.57\nfloor = 0\n").breaker_limit(100) == 57
    assert at("[breaker]\nfraction = 0.29\nfloor = 0\n").breaker_limit(100) == 29
    assert at("[breaker]\nfraction = 0.1\nfloor = 0\n").breaker_limit(95) == 9
    assert at("[breaker]\nfraction = 0.1\nfloor = 0\n").breaker_limit(99) == 9
    assert at("[breaker]\nfraction = 0.1\nfloor = 0\n").breaker_limit(100) == 10
    assert policy.BUILT_IN.breaker_limit(95) == 9
    assert policy.BUILT_IN.breaker_limit(79) == 8  # the floor
