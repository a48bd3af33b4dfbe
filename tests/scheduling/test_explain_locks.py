"""explainPlacement with LOWER_PRIORITY acts on nothing and keeps no place waiting.

docs/scheduler/tenancy.md ("What a scheduler sees"): its victim trials run
on the primary in a transaction that is always rolled back, take none of the
claim's locks (a claim in flight on the victim's node does not hold it up),
give up at once what they hold when they meet a claim's row, and hold
nothing once they are done: a place stopping the same victim commits while
an explain's transaction is still open.
"""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections
from service.scheduling import placement
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import Explanation, preemption
from service.scheduling.tenancy.charges import Charge, PreemptionPolicy
from tests.support.api import Api
from tests.support.metrics import scrape
from tests.support.preemption import explain, place, victims
from tests.support.reports import REGISTER, node_input
from tests.support.tenancy import set_tenant

LOWER = {"preemption": "LOWER_PRIORITY"}
RETRIED = "inventory_preemption_explain_trials_retried_total"


async def research_holds_both_nodes(api: Api) -> str:
    """One node held whole by research-0 (8 GPUs), the other half by research-1 (4): that one's id."""
    for node_id in ("hgx-0", "hgx-1"):
        await api(REGISTER, {"input": node_input(node_id)})
    await set_tenant(api, "research")
    await set_tenant(api, "prod")
    first = await place(api, "research-0", 8, tenant="research")
    second = await place(api, "research-1", 4, tenant="research")
    assert first["__typename"] == second["__typename"] == "Allocated", (first, second)
    return str(second["allocations"][0]["nodeId"])


async def test_an_explain_held_open_keeps_no_place_of_the_same_gpus_waiting(
    api: Api, engine: AsyncEngine
) -> None:
    await research_holds_both_nodes(api)
    request = PlaceRequest(
        replica_id="chat-0",
        gpu_class="H100-80GB",
        gpus_per_shard=8,
        charge=Charge("prod", 100, None),
        preemption=PreemptionPolicy.LOWER_PRIORITY,
    )
    # The explain's transaction, its trials done, is still open while a
    # place stops the victim it named: the place commits at once.
    async with connections.rolled_back(engine) as conn:
        said = await placement.explain(conn, request)
        assert isinstance(said, Explanation) and said.placeable, said
        assert [p.replica_id for p in said.preemptions] == ["research-1"]
        placed = await asyncio.wait_for(
            place(api, "chat-0", tenant="prod", priority=100, **LOWER), timeout=10
        )
        assert placed["__typename"] == "Allocated", placed
        assert victims(placed) == ["research-1"]
        # It holds no lock but its own transaction's ids (no row carries
        # them: every write was a trial's, rolled back) and the tables' open
        # for reading: no row, advisory or tuple lock.
        held = await conn.execute(
            text(
                "SELECT locktype, mode FROM pg_locks WHERE pid = pg_backend_pid()"
                " AND locktype NOT IN ('virtualxid', 'transactionid', 'relation')"
            )
        )
        assert [tuple(r) for r in held] == [], "an explain holds a lock past its trials"
    held = (await api("{ allocations { replicaId } }"))["allocations"]
    assert sorted({a["replicaId"] for a in held}) == ["chat-0", "research-0"]


async def test_a_claim_in_flight_on_the_victims_node_does_not_hold_an_explain_up(
    api: Api, client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    node = await research_holds_both_nodes(api)
    async with connections.transaction(engine, deadline=None) as claim:
        # What a claim takes first: the node's row (placement/claims.py).
        await claim.execute(text("SELECT id FROM nodes WHERE id = :n FOR UPDATE"), {"n": node})
        said = await asyncio.wait_for(
            explain(api, "chat-0", tenant="prod", priority=100, **LOWER), timeout=10
        )
        assert said["placeable"] is True and victims(said) == ["research-1"], said

        # The claim now writes the node's pool too: the explain's trial meets
        # that row, gives it up at once and tries again; the claim never waits
        # for it. A claim that outlasts every try answers the explain CONFLICT.
        before = (await scrape(client))[RETRIED]
        await claim.execute(
            text("UPDATE gpu_pools SET free = free WHERE node_id = :n"), {"n": node}
        )
        error = await asyncio.wait_for(
            api.fails(
                "query E($input: PlaceInput!) { explainPlacement(input: $input) { placeable } }",
                {"input": {"replicaId": "chat-0", "gpuClass": "H100-80GB", "gpusPerShard": 8,
                           "tenant": "prod", "priority": 100, **LOWER}},
            ),
            timeout=10,
        )  # fmt: skip
        assert error["extensions"]["code"] == "CONFLICT", error
        tried = (await scrape(client))[RETRIED] - before
        assert tried == preemption.MAX_ATTEMPTS, tried
    # The claim gone, the explain answers; nothing was stopped by any of it.
    said = await explain(api, "chat-0", tenant="prod", priority=100, **LOWER)
    assert victims(said) == ["research-1"], said
    held = (await api("{ allocations { replicaId } }"))["allocations"]
    assert sorted({a["replicaId"] for a in held}) == ["research-0", "research-1"]
