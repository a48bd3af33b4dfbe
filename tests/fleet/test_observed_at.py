"""When the agent observed its facts, on the service's clock (service/fleet/observed_at.py).

A scheduler asking for facts no older than maxAge relies on these times: an
agent whose clock is off must neither look stale forever (clock behind) nor
fresh forever (clock ahead).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service import metrics
from service.errors import InvalidInput
from service.fleet.observed_at import agent_clock
from tests.support.api import Api
from tests.support.reports import REGISTER, node_input

TIMES = """
query Node($id: ID!) {
  node(id: $id) {
    gpusObservedAt fabricsObservedAt storageObservedAt observedAtCorrection lastSeen
  }
}
"""

SKEW = 5.0  # INVENTORY_CLOCK_SKEW's default, which the tests' settings keep


def at(moment: datetime) -> str:
    return moment.isoformat()


async def times(api: Api, node_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await api(TIMES, {"id": node_id}))["node"]
    return found


def instant(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_the_agents_times_are_kept_when_its_clock_agrees(api: Api) -> None:
    now = datetime.now(UTC)
    gpus_seen, fabrics_seen, storage_seen = (now - timedelta(seconds=s) for s in (90, 80, 70))
    report = node_input(
        "gpu-07",
        sentAt=at(now),
        gpusObservedAt=at(gpus_seen),
        fabricsObservedAt=at(fabrics_seen),
        storageObservedAt=at(storage_seen),
    )
    await api(REGISTER, {"input": report})

    got = await times(api, "gpu-07")
    assert instant(got["gpusObservedAt"]) == gpus_seen
    assert instant(got["fabricsObservedAt"]) == fabrics_seen
    assert instant(got["storageObservedAt"]) == storage_seen
    assert got["observedAtCorrection"] is None


async def test_a_clock_an_hour_behind_is_corrected_and_said(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    behind = timedelta(hours=1)
    agent_now = datetime.now(UTC) - behind
    before = metrics.clock_corrections().get("gpu-07", 0)
    report = node_input(
        "gpu-07", sentAt=at(agent_now), gpusObservedAt=at(agent_now - timedelta(seconds=30))
    )
    await api(REGISTER, {"input": report})

    got = await times(api, "gpu-07")
    # Shifted by the hour the clock is behind: 30 s old, as the agent saw it.
    age = instant(got["lastSeen"]) - instant(got["gpusObservedAt"])
    assert timedelta(seconds=25) < age < timedelta(seconds=35)
    assert "behind the service's" in got["observedAtCorrection"]
    assert "+3600" in got["observedAtCorrection"]
    assert metrics.clock_corrections()["gpu-07"] == before + 1
    assert any("gpu-07" in r.getMessage() and "behind" in r.getMessage() for r in caplog.records)


async def test_a_clock_ahead_is_corrected_the_other_way(api: Api) -> None:
    agent_now = datetime.now(UTC) + timedelta(minutes=10)
    await api(
        REGISTER,
        {"input": node_input("gpu-07", sentAt=at(agent_now), gpusObservedAt=at(agent_now))},
    )
    got = await times(api, "gpu-07")
    assert instant(got["gpusObservedAt"]) <= datetime.now(UTC)
    assert "ahead of the service's" in got["observedAtCorrection"]


async def test_an_unchanged_report_still_moves_the_times(api: Api, engine: AsyncEngine) -> None:
    # The same hardware seen again is the same report (nothing rewritten),
    # but it was seen again: maxAge must see the newer time.
    first = datetime.now(UTC) - timedelta(minutes=5)
    await api(REGISTER, {"input": node_input("gpu-07", gpusObservedAt=at(first))})
    for _ in range(2):  # the second time by the lightest path (same_as_last_stored)
        later = datetime.now(UTC)
        await api(REGISTER, {"input": node_input("gpu-07", gpusObservedAt=at(later))})
        assert instant((await times(api, "gpu-07"))["gpusObservedAt"]) == later
    async with engine.connect() as conn:
        reported = await conn.scalar(text("SELECT reported_at FROM nodes WHERE id = 'gpu-07'"))
    assert reported < later, "an unchanged report does not count as a changed one"


async def test_without_times_the_receive_time_stands(api: Api) -> None:
    before = datetime.now(UTC)
    await api(REGISTER, {"input": node_input("gpu-07")})
    got = await times(api, "gpu-07")
    assert before <= instant(got["gpusObservedAt"]) <= datetime.now(UTC)
    assert got["observedAtCorrection"] is None


@pytest.mark.parametrize(
    "field, with_sent_at",
    [
        ("gpusObservedAt", False),
        ("storageObservedAt", False),
        # sentAt agrees with the service, so nothing excuses the future time.
        ("fabricsObservedAt", True),
    ],
)
async def test_an_observation_from_the_future_is_refused_and_nothing_stored(
    api: Api, field: str, with_sent_at: bool
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    stored = await times(api, "gpu-07")
    future = datetime.now(UTC) + timedelta(seconds=SKEW + 60)
    sent = {"sentAt": at(datetime.now(UTC))} if with_sent_at else {}
    error = await api.fails(
        REGISTER, {"input": node_input("gpu-07", **{field: at(future)}, **sent, hostname="moved")}
    )
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == f"input.{field}"
    assert error["extensions"]["value"] == at(future)
    assert "future" in error["message"]
    assert await times(api, "gpu-07") == stored


async def test_a_time_without_an_offset_is_refused(api: Api) -> None:
    error = await api.fails(
        REGISTER, {"input": node_input("gpu-07", gpusObservedAt="2026-12-05T08:00:00")}
    )
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == "input.gpusObservedAt"


def test_the_rule_within_and_past_the_skew() -> None:
    received = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
    # Within the skew: taken as sent; a little ahead is the receive time.
    clock = agent_clock(received - timedelta(seconds=4), received, SKEW)
    assert clock.correction is None
    assert clock.settle("f", received - timedelta(seconds=60)) == received - timedelta(seconds=60)
    assert clock.settle("f", received + timedelta(seconds=3)) == received
    # Past it: shifted by the whole difference.
    clock = agent_clock(received - timedelta(seconds=6), received, SKEW)
    assert clock.settle("f", received - timedelta(seconds=66)) == received - timedelta(seconds=60)
    with pytest.raises(InvalidInput) as refused:
        agent_clock(None, received, SKEW).settle("f", received + timedelta(seconds=6))
    assert refused.value.field == "f"


@pytest.mark.parametrize(
    ("sent_at", "observed_at"),
    [
        # An agent clock at year 1 shifts every time forward by 2025 years.
        (datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC)),
        # One at year 9999 shifts them back by 7973.
        (datetime(9999, 12, 30, tzinfo=UTC), datetime(1, 1, 2, tzinfo=UTC)),
    ],
)
def test_a_time_shifted_past_the_calendars_ends_is_refused_naming_the_field(
    sent_at: datetime, observed_at: datetime
) -> None:
    received = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
    with pytest.raises(InvalidInput) as refused:
        agent_clock(sent_at, received, SKEW).settle("input.weights[0].observedAt", observed_at)
    assert refused.value.field == "input.weights[0].observedAt"
    assert "out of range once shifted" in str(refused.value)
