"""The dashboard's next 48 hours: each node's maintenance windows and reservations as bars on one time axis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.support.chromium import chromium
from tests.support.dashboard import SCREENSHOTS, call, needs_chromium, open_dashboard, register
from tests.support.live_service import LiveService
from tests.support.maintenance import SCHEDULE, window_input
from tests.support.reservations import RESERVE
from tests.support.tenancy import SET_TENANT

# Skipped without Chromium, like the other browser tests.
pytestmark = [pytest.mark.browser, needs_chromium]

# Each booking's [left, width] as fractions of its track, and its title.
BARS = """
[...document.querySelectorAll('#timeline tbody tr')].map(tr => [tr.dataset.node,
  [...tr.querySelectorAll('.booking')].map(b => {
    const track = b.parentElement.getBoundingClientRect(), r = b.getBoundingClientRect();
    return [(r.left - track.left) / track.width, r.width / track.width, b.title];
  })])
"""


def hours(h: float) -> str:
    return (datetime.now(UTC) + timedelta(hours=h)).isoformat()


async def test_the_next_48_hours_show_each_nodes_windows(service: LiveService) -> None:
    for node_id in ("hgx-0", "hgx-1", "hgx-2"):
        register(service, node_id)
    booked = [
        window_input("fw", ["hgx-0", "hgx-1"], hours(12), hours(24), reason="rack firmware"),
        # Past the 48 hours shown: clipped at the right edge.
        window_input("psu", ["hgx-1"], hours(36), hours(60), reason="psu swap"),
        # Beyond the 48 hours: not shown.
        window_input("later", ["hgx-2"], hours(72), hours(80), reason="later"),
    ]
    for spec in booked:
        call(service, SCHEDULE, {"input": spec})

    async with chromium() as page:
        await open_dashboard(page, service)
        await page.wait_for(
            "document.querySelectorAll('#timeline tbody tr').length === 2", "two nodes booked"
        )
        rows = dict(await page.evaluate(BARS))
        assert sorted(rows) == ["hgx-0", "hgx-1"]
        (fw,) = rows["hgx-0"]
        assert round(fw[0], 2) == 0.25 and round(fw[1], 2) == 0.25, fw
        assert fw[2].startswith("maintenance fw (SCHEDULED): rack firmware")
        spans = sorted((round(left, 2), round(width, 2)) for left, width, _ in rows["hgx-1"])
        assert spans == [(0.25, 0.25), (0.75, 0.25)]
        await page.screenshot(SCREENSHOTS / "dashboard-timeline.png")


async def test_a_reservation_shows_on_the_nodes_its_gpus_are_on(service: LiveService) -> None:
    register(service, "hgx-0")
    call(service, SET_TENANT, {"input": {"id": "rollout", "quotas": []}})
    spec = {
        "id": "v2",
        "tenant": "rollout",
        "count": 1,
        "start": hours(12),
        "shape": {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": 8},
    }
    made = call(service, RESERVE, {"input": spec})["reserve"]
    assert made["__typename"] == "Reservation", made

    async with chromium() as page:
        await open_dashboard(page, service)
        await page.wait_for(
            "document.querySelectorAll('#timeline .booking.reservation').length === 1",
            "the reservation's bar",
        )
        rows = dict(await page.evaluate(BARS))
        (bar,) = rows["hgx-0"]
        # From 12 hours on, with no end: to the right edge of the 48 hours shown.
        assert round(bar[0], 2) == 0.25 and round(bar[1], 2) == 0.75, bar
        assert bar[2].startswith("reservation v2 (SCHEDULED) for rollout: GPUs 0,1,2,3,4,5,6,7")
        assert bar[2].endswith("until released")
