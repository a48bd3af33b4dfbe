"""Bad input for reservations (issue 47's "Bad input"): each answer names the field and the value, and nothing stored changes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from service.bounds import MAX_RESERVATION_START_PAST, MAX_RESERVATION_WINDOW
from tests.support.api import Api
from tests.support.reports import REGISTER, node_input
from tests.support.reservations import (
    RESERVATIONS,
    RESERVE,
    free_by_node,
    iso,
    reserve,
    shape,
    soon,
)
from tests.support.tenancy import place, set_tenant


async def fleet(api: Api) -> None:
    for i in range(2):
        await api(REGISTER, {"input": node_input(f"hgx-{i}")})
    await set_tenant(api, "rollout")
    await set_tenant(api, "other")


async def unchanged(api: Api, reservations: int) -> None:
    assert len((await api(RESERVATIONS))["reservations"]) == reservations
    assert len(await free_by_node(api)) == 2 - reservations


def spec(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "r",
        "tenant": "rollout",
        "shape": shape(),
        "count": 1,
        "start": iso(soon(60)),
        "end": iso(soon(120)),
    }
    return {**base, **fields}


# Each case's fields made when it runs (the windows are relative to now).
CASES: list[tuple[Callable[[], dict[str, Any]], str, str]] = [
    (lambda: {"count": 0}, "count", "at least 1"),
    (lambda: {"count": -3}, "count", "at least 1"),
    (lambda: {"end": iso(soon(30))}, "end", "after start"),
    (lambda: {"start": iso(at := soon(60)), "end": iso(at)}, "end", "after start"),
    (
        lambda: {"start": iso(soon(-MAX_RESERVATION_START_PAST - 60)), "end": iso(soon(60))},
        "start",
        "in the past",
    ),
    (
        lambda: {"start": iso(soon(60)), "end": iso(soon(60 + MAX_RESERVATION_WINDOW + 5))},
        "end",
        "longer than",
    ),
    (lambda: {"releaseIfUnusedAfter": -1}, "releaseIfUnusedAfter", "between 0"),
]


@pytest.mark.parametrize(("fields", "field", "says"), CASES)
async def test_bad_reserve_is_refused_naming_the_field(
    api: Api, fields: Callable[[], dict[str, Any]], field: str, says: str
) -> None:
    await fleet(api)
    error = await api.fails(RESERVE, {"input": spec(**fields())})
    assert error["extensions"]["code"] == "BAD_INPUT", error
    assert error["extensions"]["field"] == field, error
    assert says in error["message"], error
    await unchanged(api, 0)


async def test_an_id_reused_with_another_spec_is_a_conflict(api: Api) -> None:
    await fleet(api)
    first = spec()
    made = (await api(RESERVE, {"input": first}))["reserve"]
    assert made["__typename"] == "Reservation", made
    # The same id and spec again: what is stored, nothing set aside twice.
    again = (await api(RESERVE, {"input": first}))["reserve"]
    assert again == made
    await unchanged(api, 1)
    for other in ({"count": 2}, {"end": iso(soon(180))}, {"shape": shape(per=4)}):
        error = await api.fails(RESERVE, {"input": {**first, **other}})
        assert error["extensions"]["code"] == "CONFLICT", error
        assert error["extensions"]["field"] == "id" and error["extensions"]["value"] == "r"
    await unchanged(api, 1)


async def test_placing_into_a_reservation_wrongly(api: Api) -> None:
    await fleet(api)
    made = await reserve(api, "r", tenant="rollout", start=soon(60), end=soon(120))
    assert made["__typename"] == "Reservation", made
    # No such reservation.
    missing = await place(api, "x", tenant="rollout", reservation="nope")
    assert missing["__typename"] == "AllocationRejected", missing
    assert missing["code"] == "INVALID" and "reservation='nope'" in missing["message"]
    # Before its start: CONFLICT, naming when it starts.
    early = await place(api, "x", tenant="rollout", reservation="r")
    assert early["code"] == "CONFLICT" and "starts at" in early["message"], early
    # Another class than it sets aside.
    other_class = await place(api, "x", tenant="rollout", reservation="r", gpuClass="A100-40GB")
    assert other_class["code"] == "INVALID" and "H100-80GB" in other_class["message"]
    # `until` in the past.
    past = await place(api, "x", tenant="other", until=iso(soon(-1)))
    assert past["__typename"] == "AllocationRejected", past
    assert past["code"] == "INVALID" and past["message"].startswith("until="), past
    await unchanged(api, 1)


async def test_a_bound_start_in_the_recent_past_starts_at_once(api: Api) -> None:
    await fleet(api)
    made = await reserve(
        api, "now", tenant="rollout", start=soon(-5), end=soon(60) + timedelta(seconds=1)
    )
    assert made["__typename"] == "Reservation", made
    assert made["state"] == "ACTIVE"
    got = await place(api, "in", tenant="rollout", reservation="now")
    assert got["__typename"] == "Allocated", got
