"""Retries, backoff, deadlines and headers, at the process edge (httpx.MockTransport).

A database that answers DATABASE_UNAVAILABLE for exactly one request, a proxy
page, a connection refused mid-failover: faults a real service cannot be made
to show on cue. Each handler below plays the service's side as
docs/scheduler/errors.md and deadlines.md describe it; the client's side is
the real one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from llmgw_inventory_client import (
    Allocated,
    BadInput,
    DatabaseUnavailable,
    DeadlineExceeded,
    GroupRoleInput,
    InventoryClient,
    PlaceGroupInput,
    PlaceInput,
    Retry,
    Unavailable,
)

URL = "http://inventory/graphql"
SHAPE = PlaceInput(replica_id="r1", gpu_class="H100-80GB", gpus_per_shard=8)

ALLOCATED = {
    "data": {
        "place": {
            "__typename": "Allocated",
            "allocations": [
                {
                    "shardId": "r1-s0", "replicaId": "r1", "nodeId": "gpu-01",
                    "gpuIndices": list(range(8)), "fabric": None, "hcas": [], "fence": 7,
                    "generation": 1, "createdAt": "2026-12-06T02:11:04.512Z", "heldSince": None,
                }
            ],
        }
    }
}  # fmt: skip
UNAVAILABLE = {
    "data": None,
    "errors": [
        {"message": "database unavailable; retry shortly",
         "extensions": {"code": "DATABASE_UNAVAILABLE"}}
    ],
}  # fmt: skip


def answer(body: Any, status: int = 200, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


class Service:
    """A scripted service: each request gets the next answer (or raises the next error)."""

    def __init__(self, *answers: httpx.Response | Exception | Callable[[], httpx.Response]):
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.sent_at: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.sent_at.append(time.monotonic())
        step = self.answers.pop(0)
        if isinstance(step, Exception):
            raise step
        if isinstance(step, httpx.Response):
            return step
        return step()

    def client(self, **options: Any) -> InventoryClient:
        http = httpx.AsyncClient(transport=httpx.MockTransport(self))
        return InventoryClient(URL, "s3cret", http_client=http, **options)

    def header(self, name: str) -> list[str | None]:
        return [r.headers.get(name) for r in self.requests]

    def operations(self) -> list[str]:
        return [json.loads(r.content)["operationName"] for r in self.requests]


FAST = Retry(attempts=4, base=0.01, cap=0.05)


async def test_a_place_the_database_could_not_serve_is_sent_again_after_its_retry_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = Service(answer(UNAVAILABLE, **{"Retry-After": "1"}), answer(ALLOCATED))
    caplog.set_level(logging.INFO, "llmgw_inventory_client")
    async with service.client(retry=FAST) as inventory:
        placed = await inventory.place(SHAPE)
    assert isinstance(placed, Allocated) and placed.allocations[0].fence == 7
    assert service.operations() == ["place", "place"]
    # Retry-After wins over the (much shorter) backoff.
    assert service.sent_at[1] - service.sent_at[0] >= 1.0
    assert inventory.retried == {"DATABASE_UNAVAILABLE": 1}
    assert "place: database unavailable; retry shortly [DATABASE_UNAVAILABLE]" in caplog.text
    assert all(h == "Bearer s3cret" for h in service.header("authorization"))


async def test_a_release_is_never_sent_twice() -> None:
    # A second releaseReplica of a replica already gone would leave a tombstone.
    service = Service(answer(UNAVAILABLE, 503, **{"Retry-After": "0"}))
    async with service.client(retry=FAST) as inventory:
        with pytest.raises(DatabaseUnavailable) as raised:
            await inventory.release_replica("r1")
    assert raised.value.retry_after == 0 and raised.value.status == 503
    assert service.operations() == ["releaseReplica"]

    cut = Service(httpx.ConnectError("connection refused"))
    async with cut.client(retry=FAST) as inventory:
        with pytest.raises(Unavailable):
            await inventory.scale_group("g", "decode", 1)
    assert len(cut.requests) == 1 and inventory.retried == {}


async def test_reads_and_idempotent_writes_are_tried_again_after_faults_of_the_way() -> None:
    proxy_page = httpx.Response(502, text="<html>Bad Gateway</html>")
    service = Service(
        httpx.ConnectError("connection refused"),
        proxy_page,
        answer({"data": {"freeGpus": []}}),
    )
    async with service.client(retry=FAST) as inventory:
        assert await inventory.free_gpus(first=10) == []
    assert service.operations() == ["freeGpusCompiled"] * 3
    assert inventory.retried == {"ConnectError": 1, "HTTP 502": 1}


async def test_attempts_run_out_with_the_last_error() -> None:
    service = Service(*[answer(UNAVAILABLE) for _ in range(3)])
    async with service.client(retry=Retry(attempts=3, base=0.01, cap=0.01)) as inventory:
        with pytest.raises(DatabaseUnavailable):
            await inventory.nodes(first=5)
    assert len(service.requests) == 3


async def test_refusals_are_not_tried_again() -> None:
    refused = {
        "data": None,
        "errors": [{"message": "first=0: must be 1 to 1000",
                    "extensions": {"code": "BAD_INPUT", "field": "first", "value": 0}}],
    }  # fmt: skip
    service = Service(answer(refused))
    async with service.client(retry=FAST) as inventory:
        with pytest.raises(BadInput) as bad:
            await inventory.free_gpus(first=0)
    assert (bad.value.field, bad.value.value) == ("first", 0)
    assert len(service.requests) == 1


async def test_a_wait_past_the_calls_timeout_is_not_made() -> None:
    # The service asks for 30 s; the caller gave the call 1 s: fail now, saying so.
    service = Service(answer(UNAVAILABLE, **{"Retry-After": "30"}))
    started = time.monotonic()
    async with service.client(retry=FAST, timeout=1) as inventory:
        with pytest.raises(DatabaseUnavailable) as raised:
            await inventory.place(SHAPE)
    assert time.monotonic() - started < 0.5
    assert raised.value.retry_after == 30 and len(service.requests) == 1


async def test_retry_after_may_be_a_date() -> None:
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=2), usegmt=True)
    service = Service(answer(UNAVAILABLE, **{"Retry-After": soon}))
    async with service.client(retry=Retry(attempts=1)) as inventory:
        with pytest.raises(DatabaseUnavailable) as raised:
            await inventory.group("g")
    assert raised.value.retry_after is not None and 0 < raised.value.retry_after <= 2


async def test_writes_that_hold_gpus_carry_the_time_left_as_x_client_timeout() -> None:
    service = Service(
        answer(UNAVAILABLE, **{"Retry-After": "0.3"}),
        answer(ALLOCATED),
        answer({"data": {"releaseReplica": 8}}),
        answer({"data": {"freeGpus": []}}),
        answer({"data": {"placeGroup": {"__typename": "AllocationRejected", "code": "INVALID",
                                        "message": "roles[0].replicas=0: at least 1",
                                        "nodeId": None, "gpuIndex": None, "heldBy": None}}}),
    )  # fmt: skip
    async with service.client(retry=FAST, timeout=2.0, deadline_margin=0.1) as inventory:
        await inventory.place(SHAPE)
        assert await inventory.release_replica("r1") == 8
        await inventory.free_gpus(first=1)
        group = PlaceGroupInput(
            group_id="g", roles=[GroupRoleInput(role="p", replicas=0, shape=SHAPE)]
        )
        await inventory.place_group(group, timeout=5)
    first, second, release, read, place_group = service.header("x-client-timeout")
    assert first is not None and second is not None and place_group is not None
    # What the caller has left, less the margin for the way back; less on the retry.
    assert 1.85 <= float(first) <= 1.9
    assert float(second) <= float(first) - 0.29  # the Retry-After waited
    assert 4.85 <= float(place_group) <= 4.9
    # Not on releases (a late release still frees) nor on reads (they commit nothing).
    assert release is None and read is None
    # Plain seconds, as the service reads them (no exponent).
    assert all(v is None or v.replace(".", "").isdigit() for v in (first, second, place_group))


async def test_a_call_gives_up_at_its_timeout_and_says_so() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    http = httpx.AsyncClient(transport=httpx.MockTransport(hang))
    started = time.monotonic()
    async with InventoryClient(URL, http_client=http, timeout=0.5, retry=FAST) as inventory:
        with pytest.raises(DeadlineExceeded) as raised:
            await inventory.place(SHAPE)
    assert time.monotonic() - started < 1.5
    assert "did not answer within the" in raised.value.message
    assert "s left of the call's timeout" in raised.value.message and raised.value.code is None

    # Less time than the margin for the way back: not sent at all.
    service = Service()
    async with service.client(timeout=1, deadline_margin=0.5) as inventory:
        with pytest.raises(DeadlineExceeded) as late:
            await inventory.place(SHAPE, timeout=0.4)
    assert service.requests == [] and "before it could be sent" in late.value.message


async def test_an_answer_that_is_not_graphql_says_what_came_back() -> None:
    service = Service(httpx.Response(405, text="Method Not Allowed"))
    http = httpx.AsyncClient(transport=httpx.MockTransport(service))
    async with InventoryClient("http://inventory:8080", http_client=http) as inventory:
        with pytest.raises(Exception) as raised:
            await inventory.release_replica("r1")
    assert "HTTP 405 without a GraphQL response" in str(raised.value)
    assert "(the service's endpoint is /graphql)" in str(raised.value)
