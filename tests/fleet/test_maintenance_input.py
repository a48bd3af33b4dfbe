"""Bad maintenance windows are refused naming the field and the value, and nothing stored changes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from service.bounds import MAX_MAINTENANCE_SECONDS, MAX_MAINTENANCE_START_PAST_SECONDS
from tests.support.api import Api
from tests.support.maintenance import SCHEDULE, WINDOWS, at, schedule, window_input
from tests.support.reports import REGISTER, node_input
from tests.support.tenancy import PLACE


async def fleet(api: Api) -> None:
    for node_id in ("n-0", "n-1"):
        await api(REGISTER, {"input": node_input(node_id)})


async def stored(api: Api) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await api(WINDOWS))["maintenanceWindows"]
    return found


def _same_start_and_end() -> dict[str, Any]:
    moment = at(60)
    return {"start": moment, "end": moment}


# Each case: the fields it changes (made when the test runs: times are from now) and the field named.
BAD: dict[str, tuple[Callable[[], dict[str, Any]], str]] = {
    "end at start": (_same_start_and_end, "end"),
    "end before start": (lambda: {"start": at(120), "end": at(60)}, "end"),
    "start long past": (
        lambda: {"start": at(-MAX_MAINTENANCE_START_PAST_SECONDS - 60), "end": at(60)},
        "start",
    ),
    "too long": (lambda: {"start": at(60), "end": at(60 + MAX_MAINTENANCE_SECONDS + 1)}, "end"),
    "negative drain lead": (lambda: {"drain_lead": -1}, "drainLead"),
    "unknown node": (lambda: {"node_ids": ["n-0", "nowhere"]}, "nodeIds[1]"),
    "node twice": (lambda: {"node_ids": ["n-1", "n-1"]}, "nodeIds[1]"),
    "empty reason": (lambda: {"reason": "  "}, "reason"),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_a_bad_window_is_refused_naming_the_field(api: Api, case: str) -> None:
    await fleet(api)
    fields, field = BAD[case]
    spec: dict[str, Any] = {
        "window_id": "w",
        "node_ids": ["n-0"],
        "start": at(3600),
        "end": at(7200),
        **fields(),
    }
    error = await api.fails(SCHEDULE, {"input": window_input(**spec)})
    assert error["extensions"]["code"] == "BAD_INPUT", error
    assert error["extensions"]["field"] == field, error
    assert f"{field}=" in error["message"], error
    assert await stored(api) == []


async def test_an_overlap_on_a_node_is_a_conflict_and_a_resend_answers_what_is_stored(
    api: Api,
) -> None:
    await fleet(api)
    first = await schedule(
        api, window_id="a", node_ids=["n-0", "n-1"], start=at(3600), end=at(7200)
    )
    # The same id and spec again: what is stored, nothing new.
    again = await api(
        SCHEDULE,
        {
            "input": window_input(
                "a", ["n-0", "n-1"], first["start"], first["end"], reason="rack firmware upgrade"
            )
        },
    )
    assert again["scheduleMaintenance"] == first
    # The same id with another spec: CONFLICT naming the id.
    error = await api.fails(
        SCHEDULE, {"input": window_input("a", ["n-0"], first["start"], first["end"])}
    )
    assert (error["extensions"]["code"], error["extensions"]["field"]) == ("CONFLICT", "id")
    # Another window meeting [start, end) on n-1: CONFLICT naming the node and the window.
    error = await api.fails(SCHEDULE, {"input": window_input("b", ["n-1"], at(5000), at(9000))})
    assert error["extensions"]["code"] == "CONFLICT", error
    assert (error["extensions"]["field"], error["extensions"]["value"]) == ("nodeIds", "n-1")
    assert error["extensions"]["window"] == "a"
    # Half-open: one that starts at a's end is no overlap.
    later = await schedule(api, window_id="c", node_ids=["n-1"], start=first["end"], end=at(9000))
    assert later["state"] == "SCHEDULED"
    assert [w["id"] for w in await stored(api)] == ["a", "c"]


async def test_a_cancelled_window_no_longer_conflicts(api: Api) -> None:
    await fleet(api)
    await schedule(api, window_id="a", node_ids=["n-0"], start=at(3600), end=at(7200))
    await api('mutation { cancelMaintenance(id: "a") { state } }')
    booked = await schedule(api, window_id="b", node_ids=["n-0"], start=at(3600), end=at(7200))
    assert booked["state"] == "SCHEDULED"
    error = await api.fails('mutation { cancelMaintenance(id: "nope") { state } }')
    assert (error["extensions"]["code"], error["extensions"]["field"]) == ("BAD_INPUT", "id")


async def test_until_in_the_past_is_refused_naming_it(api: Api) -> None:
    await fleet(api)
    shape = {"replicaId": "r", "gpuClass": "H100-80GB", "gpusPerShard": 1, "until": at(-5)}
    answer = (await api(PLACE, {"input": shape}))["place"]
    assert answer["__typename"] == "AllocationRejected", answer
    assert answer["code"] == "INVALID" and "until=" in answer["message"], answer
    assert (await api("{ allocations { shardId } }"))["allocations"] == []


async def test_the_same_booking_sent_at_once_is_stored_once(api: Api) -> None:
    await fleet(api)
    spec = window_input("a", ["n-0", "n-1"], at(3600), at(7200))
    answers = await asyncio.gather(*(api(SCHEDULE, {"input": spec}) for _ in range(8)))
    assert len({json.dumps(a["scheduleMaintenance"], sort_keys=True) for a in answers}) == 1
    assert [w["id"] for w in await stored(api)] == ["a"]


async def test_overlapping_bookings_at_once_store_one(api: Api) -> None:
    await fleet(api)
    start, end = at(3600), at(7200)
    answers = await asyncio.gather(
        *(
            api.raw(SCHEDULE, {"input": window_input(f"w{i}", ["n-1", "n-0"], start, end)})
            for i in range(8)
        )
    )
    booked = [a for a in answers if not a.get("errors")]
    refused = [a["errors"][0]["extensions"]["code"] for a in answers if a.get("errors")]
    assert len(booked) == 1 and refused == ["CONFLICT"] * 7, answers
    assert len(await stored(api)) == 1
