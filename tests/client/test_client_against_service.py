"""The schedulers' typed client against the real service, as a scheduler uses it.

Most stories run against the app in this process (httpx.ASGITransport, the
session's PostgreSQL), where the fast path's counters say which route
answered; the subscription and one whole story go through a `serve` process
over real HTTP and a websocket.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from llmgw_inventory_client import (
    Allocated,
    AllocateInput,
    AllocationRejected,
    BadInput,
    Conflict,
    DeadlineExceeded,
    Forbidden,
    GroupLocalityInput,
    GroupPlaced,
    GroupRoleInput,
    InventoryClient,
    KeyValueInput,
    LocalityLevel,
    NodeFilter,
    NodeState,
    PlaceGroupInput,
    PlaceInput,
    RejectionCode,
    ShardInput,
    Unauthenticated,
    Unplaceable,
    VerdictCode,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.direct_execution import answered, route_counts
from tests.support.live_service import LiveService
from tests.support.reports import L40S, REGISTER, gpus, node_input

H100 = "H100-80GB"


@pytest.fixture
async def inventory(client: httpx.AsyncClient) -> AsyncIterator[InventoryClient]:
    async with InventoryClient("http://inventory/graphql", http_client=client) as client:
        yield client


async def register(http: httpx.AsyncClient, *nodes: dict[str, Any]) -> None:
    api = Api(http)
    for node in nodes:
        await api(REGISTER, {"input": node})


def shape(replica_id: str, **fields: Any) -> PlaceInput:
    return PlaceInput(
        **{"replica_id": replica_id, "gpu_class": H100, "gpus_per_shard": 4, **fields}
    )


async def test_a_scheduler_places_reads_and_releases_with_typed_results(
    client: httpx.AsyncClient, inventory: InventoryClient, fast_path: bool
) -> None:
    await register(
        client,
        node_input("gpu-01", labels=[{"key": "rack", "value": "r1"}]),
        node_input("gpu-02", gpus=gpus(L40S, 4)),
    )
    before = route_counts()

    free = await inventory.free_gpus(gpu_class=H100, min_free=4)
    assert [(f.node.id, f.gpu_indices) for f in free] == [("gpu-01", list(range(8)))]
    assert free[0].node.labels[0].key == "rack" and free[0].node.labels[0].value == "r1"

    placed = await inventory.place(shape("llama-r1", label=KeyValueInput(key="rack", value="r1")))
    assert isinstance(placed, Allocated)
    (shard,) = placed.allocations
    assert (shard.replica_id, shard.node_id, len(shard.gpu_indices)) == ("llama-r1", "gpu-01", 4)
    assert isinstance(shard.created_at, datetime) and shard.fence > 0 and shard.generation >= 1

    # The same place again (a retry after a lost answer) answers what is stored.
    again = await inventory.place(shape("llama-r1", label=KeyValueInput(key="rack", value="r1")))
    assert isinstance(again, Allocated) and again.allocations == placed.allocations

    nodes = await inventory.nodes(filter_=NodeFilter(gpu_class=H100))
    assert [n.id for n in nodes] == ["gpu-01"] and nodes[0].state is NodeState.READY
    held = [g.index for g in nodes[0].gpus if g.allocation is not None]
    assert held == sorted(shard.gpu_indices)
    assert [a.shard_id for a in await inventory.allocations(replica_id="llama-r1")] == [
        shard.shard_id
    ]

    assert await inventory.release_replica("llama-r1") == 4
    assert (await inventory.free_gpus(gpu_class=H100))[0].gpu_indices == list(range(8))
    assert await inventory.allocations(replica_id="llama-r1") == []

    # The client's documents carry no named fragment: with the fast path on, the
    # service answers the place and the pages on its compiled routes, not
    # through graphql-core (off, Strawberry's view answers everything).
    assert answered(before, "place") == (2 if fast_path else 0)
    assert answered(before, "page") == (3 if fast_path else 0)


async def test_every_member_of_places_union_is_its_own_type(
    client: httpx.AsyncClient, inventory: InventoryClient
) -> None:
    await register(client, node_input("gpu-01"))

    match await inventory.place(shape("too-big", gpus_per_shard=12)):
        case Unplaceable(message=message, verdicts=verdicts):
            assert "12" in message, message
            assert [(v.node_id, v.code) for v in verdicts] == [
                ("gpu-01", VerdictCode.NOT_ENOUGH_GPUS)
            ]
        case other:
            pytest.fail(f"expected Unplaceable, got {other!r}")

    taken = await inventory.allocate(
        AllocateInput(
            replica_id="a", shards=[ShardInput(shard_id="a-s0", node_id="gpu-01", gpu_indices=[0])]
        )
    )
    assert isinstance(taken, Allocated)
    match await inventory.allocate(
        AllocateInput(
            replica_id="b", shards=[ShardInput(shard_id="b-s0", node_id="gpu-01", gpu_indices=[0])]
        )
    ):
        case AllocationRejected(code=code, held_by=held_by, message=message):
            assert code is RejectionCode.GPU_TAKEN and held_by == "a-s0", message
        case other:
            pytest.fail(f"expected AllocationRejected, got {other!r}")

    explained = await inventory.explain_placement(shape("x", gpus_per_shard=12))
    assert not explained.placeable and explained.verdicts[0].code is VerdictCode.NOT_ENOUGH_GPUS
    fit = await inventory.fit(shape("x"))
    assert fit.replicas == 1 and [(n.node_id, n.gpus) for n in fit.nodes] == [("gpu-01", 4)]


async def test_the_services_refusals_are_typed_errors_with_its_code_and_message(
    client: httpx.AsyncClient, inventory: InventoryClient, api_as: Any
) -> None:
    # Tokens in force (made before the first request): the client sends its own.
    scheduler, reader = await api_as("scheduler"), await api_as("reader")
    await (await api_as("operator"))(REGISTER, {"input": node_input("gpu-01")})

    def token(api: Api) -> str:
        assert api.headers is not None
        return api.headers["Authorization"].removeprefix("Bearer ")

    with pytest.raises(Unauthenticated) as refused:
        await inventory.free_gpus()  # it has no token
    assert refused.value.status == 401 and refused.value.code == "UNAUTHENTICATED"
    assert "token" in refused.value.message

    async with InventoryClient(
        "http://inventory/graphql", token(scheduler), http_client=client
    ) as as_scheduler:
        with pytest.raises(BadInput) as bad:
            await as_scheduler.free_gpus(first=0)
        assert (bad.value.code, bad.value.field, bad.value.value) == ("BAD_INPUT", "first", 0)
        assert "first" in bad.value.message

        placed = await as_scheduler.place(shape("r1"))
        assert isinstance(placed, Allocated)
        generation = placed.allocations[0].generation
        with pytest.raises(Conflict) as conflict:
            await as_scheduler.release_replica("r1", generation=generation + 1)
        assert conflict.value.code == "CONFLICT"
        assert conflict.value.current_generation == generation
        assert len(await as_scheduler.allocations(replica_id="r1")) == 1  # nothing freed

    async with InventoryClient(
        "http://inventory/graphql", token(reader), http_client=client
    ) as as_reader:
        assert len(await as_reader.free_gpus()) == 1
        with pytest.raises(Forbidden) as forbidden:
            await as_reader.place(shape("r2"))
        assert forbidden.value.code == "FORBIDDEN", forbidden.value.message


async def test_lists_are_read_whole_page_by_page_without_first(
    client: httpx.AsyncClient, inventory: InventoryClient
) -> None:
    await register(client, *(node_input(f"gpu-{n:02d}") for n in range(7)))
    inventory.page_size = 3
    sent: list[Any] = []

    async def record(request: httpx.Request) -> None:
        sent.append(request)

    client.event_hooks["request"].append(record)
    everything = await inventory.free_gpus(gpu_class=H100)
    assert [f.node.id for f in everything] == [f"gpu-{n:02d}" for n in range(7)]
    assert len(sent) == 3  # 3 + 3 + 1
    assert [n.id for n in await inventory.nodes(after="gpu-02")] == [
        f"gpu-{n:02d}" for n in range(3, 7)
    ]
    one_page = await inventory.nodes(first=2, after="gpu-04")
    assert [n.id for n in one_page] == ["gpu-05", "gpu-06"]


async def test_groups_are_placed_read_scaled_and_released(
    client: httpx.AsyncClient, inventory: InventoryClient
) -> None:
    await register(client, node_input("gpu-01"), node_input("gpu-02"))
    group = PlaceGroupInput(
        group_id="chat",
        roles=[
            GroupRoleInput(role="prefill", replicas=1, shape=shape("-")),
            GroupRoleInput(role="decode", replicas=2, shape=shape("-", gpus_per_shard=2)),
        ],
        locality=GroupLocalityInput(level=LocalityLevel.NODE),
        kv_from="prefill",
        kv_to="decode",
    )
    assert (await inventory.fit_group(group)).groups == 2

    placed = await inventory.place_group(group)
    assert isinstance(placed, GroupPlaced)
    assert sorted(m.replica_id for m in placed.members) == [
        "chat-decode-0", "chat-decode-1", "chat-prefill-0"
    ]  # fmt: skip
    assert await inventory.place_group(group) == placed  # the same input again: what is stored
    read = await inventory.group("chat")
    assert read is not None and read.generation == placed.generation

    scaled = await inventory.scale_group("chat", "decode", 1, generation=placed.generation)
    assert isinstance(scaled, GroupPlaced) and len(scaled.members) == 4
    with pytest.raises(Conflict):
        await inventory.release_group("chat", generation=placed.generation)
    assert await inventory.release_group("chat", generation=scaled.generation) == 4 + 2 * 3
    assert await inventory.group("chat") is None


async def test_a_scheduler_process_places_and_follows_events_over_http_and_a_websocket(
    live_service: LiveService,
) -> None:
    http = httpx.AsyncClient()
    await register_live(http, live_service.url, node_input("gpu-01"))
    async with InventoryClient(live_service.url, timeout=5) as inventory:
        events = inventory.events(replica_id="live-r1", after="0")
        first = asyncio.ensure_future(anext(events))
        placed = await inventory.place(shape("live-r1"))
        assert isinstance(placed, Allocated)
        event = await asyncio.wait_for(first, 10)
        assert event.replica_id == "live-r1" and event.kind == "allocated"
        assert await inventory.release_replica("live-r1") == 4
        await events.aclose()
    await http.aclose()


async def register_live(http: httpx.AsyncClient, url: str, *nodes: dict[str, Any]) -> None:
    for node in nodes:
        reply = await http.post(url, json={"query": REGISTER, "variables": {"input": node}})
        assert not reply.json().get("errors"), reply.text


async def test_a_place_the_service_cannot_commit_in_the_callers_time_is_given_up_as_the_docs_say(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    # X-Client-Timeout from the client's own timeout (issue 37): a place stuck
    # behind a lock is rolled back at the deadline the client sent, answered
    # DEADLINE_EXCEEDED, and not tried again. The margin leaves the answer 1.5 s
    # to come back, so the service's refusal, not the client's own timeout, ends it.
    await register(client, node_input("gpu-01"))
    async with InventoryClient(
        "http://inventory/graphql", http_client=client, timeout=3, deadline_margin=1.5
    ) as inventory:
        async with engine.connect() as holder:
            await holder.begin()
            await holder.execute(text("SELECT 1 FROM nodes WHERE id = 'gpu-01' FOR UPDATE"))
            with pytest.raises(DeadlineExceeded) as late:
                await inventory.place(shape("stuck"))
            await holder.rollback()
        assert late.value.code == "DEADLINE_EXCEEDED" and inventory.retried == {}
        sent = late.value.extensions["timeoutSeconds"]
        assert 1.3 <= sent <= 1.5, sent
        assert await inventory.allocations(replica_id="stuck") == []

        # Then, as docs/scheduler/deadlines.md asks: release the id (it held
        # nothing: a tombstone refuses a late place of it) and place a new one.
        assert await inventory.release_replica("stuck") == 0
        with pytest.raises(Conflict) as refused:
            await inventory.place(shape("stuck"))
        assert refused.value.tombstone_until is not None, refused.value.extensions
        assert "new replica id" in refused.value.message
        assert isinstance(await inventory.place(shape("stuck.a2")), Allocated)
