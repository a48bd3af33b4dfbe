"""Reservations as a scheduler meets them: the rollout example of docs/scheduler/reservations.md, step by step.

Four nodes of 8 H100. The rollout tenant reserves two 8-GPU replicas for a
window seconds long; batch work of another tenant places around it; a batch
replica that promises to be gone by the start (`until`) may use the
reserved GPUs and is freed at the start; the owner places into the
reservation once it is ACTIVE; at the end the unused part is free again and
what was placed into it stays. The changes on time are made by the timeline
(service/scheduling/timeline/), run here one round at a time as every
service process runs it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.fencing import ALLOCATIONS, BEAT
from tests.support.place_group import PLACE_GROUP, role
from tests.support.reports import REGISTER, node_input
from tests.support.reservations import (
    RELEASE_RESERVATION,
    RESERVATION,
    RESERVATIONS,
    free_by_node,
    iso,
    reserve,
    shape,
    soon,
    tick,
    until_past,
)
from tests.support.tenancy import (
    PLACE,
    RELEASE,
    REMOVE_TENANT,
    place,
    quota,
    set_tenant,
    tenant,
    usage_of,
)

NODES = [f"hgx-{i}" for i in range(4)]


async def fleet(api: Api) -> None:
    for node_id in NODES:
        await api(REGISTER, {"input": node_input(node_id)})
    await set_tenant(api, "rollout", quota(guaranteed=16, limit=24))
    await set_tenant(api, "batch")


def reserved_nodes(reservation: dict[str, Any]) -> set[str]:
    return {g["nodeId"] for g in reservation["gpus"]}


async def events(engine: AsyncEngine, kind: str) -> list[Any]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT replica_id, detail FROM events WHERE kind = :k ORDER BY id"), {"k": kind}
        )
        return list(rows)


async def test_the_rollout_example(api: Api, engine: AsyncEngine) -> None:
    await fleet(api)
    start, end = soon(3), soon(6)

    # 1. The reservation: two 8-GPU replicas for [start, end). The GPUs are
    # chosen now, by place's rules, two whole nodes.
    made = await reserve(
        api, "v2-rollout", tenant="rollout", count=2, start=start, end=end, reason="v2 rollout"
    )
    assert made["__typename"] == "Reservation", made
    assert (made["state"], made["count"], made["used"], made["missingGpus"]) == (
        "SCHEDULED", 2, 0, 0
    )  # fmt: skip
    assert len(reserved_nodes(made)) == 2
    assert all(g["gpuIndices"] == list(range(8)) for g in made["gpus"])
    reserved = reserved_nodes(made)
    # freeGpus does not list them; the quota counts them from creation.
    assert set(await free_by_node(api)) == set(NODES) - reserved
    assert usage_of(await tenant(api, "rollout"))["used"] == 16

    # 2. Another tenant's places never get them: two fit on the free nodes,
    # the third is Unplaceable, and the reserved nodes say RESERVED.
    for i in range(2):
        got = await place(api, f"batch-{i}", tenant="batch")
        assert got["__typename"] == "Allocated", got
        assert got["allocations"][0]["nodeId"] not in reserved
    refused = await place(api, "batch-2", tenant="batch")
    assert refused["__typename"] == "Unplaceable", refused
    codes = {v["nodeId"]: v["code"] for v in refused["verdicts"]}
    assert {codes[n] for n in reserved} == {"RESERVED"}, refused

    # 3. A replica that promises to be gone by the start may use them.
    early = await place(api, "batch-early", tenant="batch", until=iso(start))
    assert early["__typename"] == "Allocated", early
    assert early["allocations"][0]["nodeId"] in reserved
    # One that would stay past the start may not.
    late = await place(api, "batch-late", tenant="batch", until=iso(start + timedelta(seconds=1)))
    assert late["__typename"] == "Unplaceable", late

    # 4. The owner cannot place into it before the start; another tenant never.
    before = await place(api, "v2-0", tenant="rollout", reservation="v2-rollout")
    assert before["__typename"] == "AllocationRejected", before
    assert before["code"] == "CONFLICT" and "v2-rollout" in before["message"], before
    forbidden = await api.fails(
        PLACE,
        {"input": shape(replicaId="x", tenant="batch", reservation="v2-rollout")},
    )
    assert forbidden["extensions"]["code"] == "FORBIDDEN", forbidden
    assert forbidden["extensions"]["field"] == "reservation"

    # What the early replica's engine runs (its shard and fence).
    node = early["allocations"][0]["nodeId"]
    held = (await api(ALLOCATIONS, {"nodeId": node}))["allocations"]
    running = [{"shardId": a["shardId"], "fence": a["fence"]} for a in held]
    assert [a["replicaId"] for a in held] == ["batch-early"]

    # 5. The start: ACTIVE, and the early replica is freed, told RESERVATION.
    await until_past(start)
    assert await tick(engine) >= 1
    active = (await api(RESERVATION, {"id": "v2-rollout"}))["reservation"]
    assert active["state"] == "ACTIVE"
    released = [r for r in await events(engine, "released") if r.replica_id == "batch-early"]
    assert released and released[0].detail["reservation"] == "v2-rollout"
    assert len(await events(engine, "reservation_active")) == 1
    beat = (await api(BEAT, {"id": node, "running": running}))["heartbeat"]
    assert [(x["shardId"], x["reason"]) for x in beat["shardsToStop"]] == [
        (running[0]["shardId"], "RESERVATION")
    ]
    # A second round (another process) changes nothing.
    assert await tick(engine) == 0

    # 6. The owner places into it: only its GPUs, and no more than it holds.
    for i in range(2):
        got = await place(api, f"v2-{i}", tenant="rollout", reservation="v2-rollout")
        assert got["__typename"] == "Allocated", got
        assert got["allocations"][0]["nodeId"] in reserved
    full = await place(api, "v2-2", tenant="rollout", reservation="v2-rollout")
    assert full["__typename"] == "Unplaceable", full
    assert (await api(RESERVATION, {"id": "v2-rollout"}))["reservation"]["used"] == 2
    # Counted once: held now, no longer reserved.
    assert usage_of(await tenant(api, "rollout"))["used"] == 16

    # 7. The end: ENDED; the replicas placed into it stay.
    await until_past(end)
    assert await tick(engine) >= 1
    ended = (await api(RESERVATION, {"id": "v2-rollout"}))["reservation"]
    assert (ended["state"], ended["gpus"]) == ("ENDED", [])
    assert len(await events(engine, "reservation_ended")) == 1
    listed = (await api(RESERVATIONS, {"tenant": "rollout"}))["reservations"]
    assert [r["id"] for r in listed] == ["v2-rollout"]


async def test_unused_part_is_free_again_at_the_end(api: Api, engine: AsyncEngine) -> None:
    await fleet(api)
    start, end = soon(1), soon(2.5)
    made = await reserve(api, "r", tenant="rollout", count=2, start=start, end=end)
    assert made["__typename"] == "Reservation", made
    await until_past(start)
    await tick(engine)
    got = await place(api, "one", tenant="rollout", reservation="r")
    assert got["__typename"] == "Allocated", got
    assert len(await free_by_node(api)) == 2
    await until_past(end)
    await tick(engine)
    # The reserved node not placed into is offered again; the placed one stays held.
    assert len(await free_by_node(api)) == 3
    assert usage_of(await tenant(api, "rollout"))["used"] == 8


async def test_release_if_unused_after_ends_an_idle_reservation(
    api: Api, engine: AsyncEngine
) -> None:
    await fleet(api)
    start = soon(1)
    made = await reserve(api, "idle", tenant="rollout", start=start, releaseIfUnusedAfter=1)
    assert made["__typename"] == "Reservation" and made["end"] is None, made
    await until_past(start)
    await tick(engine)
    assert (await api(RESERVATION, {"id": "idle"}))["reservation"]["state"] == "ACTIVE"
    await until_past(start + timedelta(seconds=1))
    await tick(engine)
    assert (await api(RESERVATION, {"id": "idle"}))["reservation"]["state"] == "ENDED"
    assert len(await free_by_node(api)) == 4
    assert usage_of(await tenant(api, "rollout"))["used"] == 0


async def test_release_frees_at_once_and_is_answered_again(api: Api, engine: AsyncEngine) -> None:
    await fleet(api)
    made = await reserve(api, "r", tenant="rollout", count=3, start=soon(60), end=soon(120))
    assert made["__typename"] == "Reservation", made
    assert len(await free_by_node(api)) == 1
    released = (await api(RELEASE_RESERVATION, {"id": "r"}))["releaseReservation"]
    assert (released["state"], released["gpus"]) == ("ENDED", [])
    assert len(await free_by_node(api)) == 4
    again = (await api(RELEASE_RESERVATION, {"id": "r"}))["releaseReservation"]
    assert again["state"] == "ENDED"
    assert len(await events(engine, "reservation_ended")) == 1


CLASSES = (
    "{ gpuClasses { gpuClass total free allocated unhealthy unschedulable tainted reserved } }"
)


async def test_a_tenant_with_a_reservation_not_ended_is_not_removed(api: Api) -> None:
    """Its reserved GPUs count as its used: removed under them, they would be set aside for no one."""
    await fleet(api)
    made = await reserve(api, "r", tenant="rollout", count=1, start=soon(60), end=soon(120))
    assert made["__typename"] == "Reservation", made
    before = await tenant(api, "rollout")

    error = await api.fails(REMOVE_TENANT, {"id": "rollout"})
    assert error["extensions"] == {"code": "CONFLICT", "field": "id", "value": "rollout"}
    assert "reservations not ended (r)" in error["message"]
    assert await tenant(api, "rollout") == before
    assert (await api(RESERVATION, {"id": "r"}))["reservation"]["state"] == "SCHEDULED"
    # The class's statuses add up, the reserved GPUs among them (not free).
    [h100] = (await api(CLASSES))["gpuClasses"]
    assert h100["reserved"] == 8
    parts = ("free", "allocated", "unhealthy", "unschedulable", "tainted", "reserved")
    assert sum(h100[p] for p in parts) == h100["total"], h100

    await api(RELEASE_RESERVATION, {"id": "r"})
    assert (await api(CLASSES))["gpuClasses"][0]["reserved"] == 0
    assert (await api(REMOVE_TENANT, {"id": "rollout"}))["removeTenant"] is True


async def test_all_or_nothing_and_within_the_limit(api: Api) -> None:
    await fleet(api)
    # Five 8-GPU replicas on four nodes: nothing set aside.
    too_many = await reserve(api, "big", tenant="batch", count=5, start=soon(60))
    assert too_many["__typename"] == "Unplaceable", too_many
    assert len(await free_by_node(api)) == 4
    assert (await api(RESERVATION, {"id": "big"}))["reservation"] is None
    # rollout's limit is 24: a fourth replica of 8 is past it, reserved or held.
    over = await reserve(api, "over", tenant="rollout", count=4, start=soon(60))
    assert over["__typename"] == "Unplaceable" and over["quota"] is not None, over
    ok = await reserve(api, "three", tenant="rollout", count=3, start=soon(60))
    assert ok["__typename"] == "Reservation", ok
    refused = await place(api, "more", tenant="rollout")
    assert refused["__typename"] == "Unplaceable" and refused["quota"] is not None, refused


TAINT = """
mutation T($node: ID!, $indices: [Int!]!) {
  taintGpus(nodeId: $node, indices: $indices,
            taint: {key: "bad", effect: NO_SCHEDULE, reason: "flaky"}) { index }
}
"""


async def test_a_failed_reserved_gpu_is_replaced_else_degraded(
    api: Api, engine: AsyncEngine
) -> None:
    for node_id in NODES[:3]:
        await api(REGISTER, {"input": node_input(node_id)})
    await set_tenant(api, "rollout")
    await set_tenant(api, "batch")
    made = await reserve(api, "r", tenant="rollout", count=1, start=soon(60), end=soon(120))
    (first,) = reserved_nodes(made)
    # An operator's NO_SCHEDULE taint on a reserved GPU: the slot is set
    # aside again, whole, on a node with room (place's rules).
    await api(TAINT, {"node": first, "indices": [3]})
    assert await tick(engine) == 1
    moved = (await api(RESERVATION, {"id": "r"}))["reservation"]
    assert (moved["state"], moved["missingGpus"]) == ("SCHEDULED", 0), moved
    (second,) = reserved_nodes(moved)
    assert second != first and moved["gpus"][0]["gpuIndices"] == list(range(8))
    # The failed node's other GPUs are free again; the new node's are not.
    free = await free_by_node(api)
    assert second not in free and len(free[first]) == 7
    # Nothing left to replace it with: another tenant holds every other GPU.
    for node_id in NODES[:3]:
        if node_id != second:
            for i in range(len(free.get(node_id, []))):
                got = await place(api, f"fill-{node_id}-{i}", per=1, tenant="batch")
                assert got["__typename"] == "Allocated", got
    await api(TAINT, {"node": second, "indices": [0]})
    await tick(engine)
    degraded = (await api(RESERVATION, {"id": "r"}))["reservation"]
    assert (degraded["state"], degraded["missingGpus"], degraded["gpus"]) == (
        "DEGRADED", 8, []
    ), degraded  # fmt: skip
    assert len(await events(engine, "reservation_degraded")) == 1
    # Another round finds nothing new: no second event.
    await tick(engine)
    assert len(await events(engine, "reservation_degraded")) == 1
    # Room again (the batch replicas released): replaced on the one node
    # with 8 usable GPUs left.
    for node_id in NODES[:3]:
        if node_id != second:
            for i in range(len(free.get(node_id, []))):
                await api(RELEASE, {"id": f"fill-{node_id}-{i}"})
    (third,) = set(NODES[:3]) - {first, second}
    await tick(engine)
    back = (await api(RESERVATION, {"id": "r"}))["reservation"]
    assert (back["state"], back["missingGpus"]) == ("SCHEDULED", 0), back
    assert reserved_nodes(back) == {third}


async def test_a_cordoned_node_s_reserved_gpus_move(api: Api, engine: AsyncEngine) -> None:
    for node_id in NODES[:2]:
        await api(REGISTER, {"input": node_input(node_id)})
    await set_tenant(api, "rollout")
    made = await reserve(api, "r", tenant="rollout", count=1, start=soon(60), end=soon(120))
    (first,) = reserved_nodes(made)
    await api(
        'mutation C($id: ID!) { cordonNode(id: $id, reason: "firmware") { id } }', {"id": first}
    )
    assert await tick(engine) == 1
    moved = (await api(RESERVATION, {"id": "r"}))["reservation"]
    assert reserved_nodes(moved) == set(NODES[:2]) - {first}
    assert (moved["state"], moved["missingGpus"]) == ("SCHEDULED", 0)


async def test_a_group_member_with_until_or_a_reservation_is_refused_naming_it(
    api: Api, engine: AsyncEngine
) -> None:
    """Not built for groups: refused naming the field, never placed without the promise."""
    await fleet(api)
    made = await reserve(api, "r", tenant="rollout", count=1, start=soon(60), end=soon(120))
    assert made["__typename"] == "Reservation", made
    for named, value in (("until", iso(soon(30))), ("reservation", "r")):
        group = {"groupId": "g", "roles": [role("decode", 1, 2, **{named: value})]}
        got = (await api(PLACE_GROUP, {"input": group}))["placeGroup"]
        assert got["__typename"] == "AllocationRejected", got
        assert got["code"] == "INVALID"
        assert got["message"].startswith(f"roles[0].shape.{named}: "), got
    held = await engine.connect()
    try:
        assert (await held.execute(text("SELECT count(*) FROM shards"))).scalar_one() == 0
    finally:
        await held.close()
