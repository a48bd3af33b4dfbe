"""A DEGRADED reservation is tried again once per change, whichever process looks (docs/scheduler/reservations.md).

Every service process runs the timeline every second; a try of a
reservation's missing GPUs runs place's planner under its nodes' locks. So
a try is made only when something could have changed (more free GPUs of
its class, or RETRY_AFTER_SECONDS after the last), and once: here two loops
run each round at the same moment, as two processes would, and the tries
are read from /metrics (inventory_reservation_retries_total).
"""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.metrics import scrape
from tests.support.reports import REGISTER, node_input
from tests.support.reservations import RESERVATION, reserve, soon, tick
from tests.support.tenancy import RELEASE, place, set_tenant

TAINT = """
mutation T($node: ID!, $indices: [Int!]!) {
  taintGpus(nodeId: $node, indices: $indices,
            taint: {key: "bad", effect: NO_SCHEDULE, reason: "flaky"}) { index }
}
"""
NODES = ("hgx-0", "hgx-1")


async def tries(client: httpx.AsyncClient) -> dict[str, float]:
    samples = await scrape(client)
    return {
        outcome: samples[f'inventory_reservation_retries_total{{outcome="{outcome}"}}']
        for outcome in ("replaced", "missing", "skipped")
    }


async def two_loops(engine: AsyncEngine) -> None:
    """One round of the timeline in two loops at once, as two service processes run it."""
    await asyncio.gather(tick(engine), tick(engine))


async def test_a_degraded_reservation_is_tried_once_per_change(
    api: Api, client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    for node_id in NODES:
        await api(REGISTER, {"input": node_input(node_id)})
    await set_tenant(api, "rollout")
    await set_tenant(api, "batch")
    made = await reserve(api, "r", tenant="rollout", count=1, start=soon(60), end=soon(120))
    (first,) = {g["nodeId"] for g in made["gpus"]}
    (other,) = set(NODES) - {first}
    for i in range(8):
        got = await place(api, f"fill-{i}", per=1, tenant="batch")
        assert got["__typename"] == "Allocated" and got["allocations"][0]["nodeId"] == other
    # A reserved GPU fails and nothing can replace the slot: DEGRADED.
    await api(TAINT, {"node": first, "indices": [0]})
    await tick(engine)
    degraded = (await api(RESERVATION, {"id": "r"}))["reservation"]
    assert (degraded["state"], degraded["missingGpus"]) == ("DEGRADED", 8), degraded
    before = await tries(client)

    # Nothing changed since: rounds try nothing.
    for _ in range(3):
        await two_loops(engine)
    assert await tries(client) == before

    # One GPU freed (not room for the slot, but it could have been): one try
    # between both loops, which finds it still missing.
    await api(RELEASE, {"id": "fill-0"})
    await two_loops(engine)
    once = await tries(client)
    assert (once["missing"] - before["missing"], once["replaced"] - before["replaced"]) == (1, 0)
    # No more tries until something changes again.
    await two_loops(engine)
    assert await tries(client) == once
    assert (await api(RESERVATION, {"id": "r"}))["reservation"]["state"] == "DEGRADED"

    # Room again: the next round replaces the slot, once.
    for i in range(1, 8):
        await api(RELEASE, {"id": f"fill-{i}"})
    await two_loops(engine)
    back = (await api(RESERVATION, {"id": "r"}))["reservation"]
    assert (back["state"], back["missingGpus"]) == ("SCHEDULED", 0), back
    assert {g["nodeId"] for g in back["gpus"]} == {other}
    done = await tries(client)
    assert (done["missing"], done["replaced"] - once["replaced"]) == (once["missing"], 1)
