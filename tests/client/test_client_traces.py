"""The client passes its caller's trace context on: the service's span is the caller's child.

A scheduler that traces its own work (a span around "schedule llama") sees
the service's operation span, and its PostgreSQL statements, inside that
trace. The service here is the app in this process with an in-memory
exporter (tests/support/traces.py's `traced`, on both the fast path
and Strawberry's view); the caller's spans come from a TracerProvider of its
own, as a scheduler's would.
"""

from __future__ import annotations

import httpx
from llmgw_inventory_client import Allocated, InventoryClient, PlaceInput
from opentelemetry.sdk.trace import TracerProvider

from tests.support.traces import Traced

SHAPE = PlaceInput(replica_id="llama-r1", gpu_class="H100-80GB", gpus_per_shard=8)


async def test_a_place_made_under_the_callers_span_is_traced_as_its_child(traced: Traced) -> None:
    sent: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        sent.append(request)

    traced.client.event_hooks["request"].append(record)
    scheduler = TracerProvider().get_tracer("scheduler")
    async with InventoryClient("http://inventory/graphql", http_client=traced.client) as inventory:
        with scheduler.start_as_current_span("schedule llama") as caller:
            placed = await inventory.place(SHAPE)
        # Outside any span: no trace context is made up.
        assert await inventory.release_replica("llama-r1") == 8
    assert isinstance(placed, Allocated)

    context = caller.get_span_context()
    assert [r.headers.get("traceparent") for r in sent] == [
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}",
        None,
    ]
    place = traced.operation("mutation place")
    assert place.context.trace_id == context.trace_id
    assert place.parent is not None and place.parent.span_id == context.span_id
    statements = traced.statements_under(place)
    assert statements and all(s.context.trace_id == context.trace_id for s in statements)
