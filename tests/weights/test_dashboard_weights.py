"""The dashboard's node view shows where each weights download stands and who pins it."""

from __future__ import annotations

import pytest

from tests.support.chromium import chromium
from tests.support.dashboard import (
    SCREENSHOTS,
    call,
    needs_chromium,
    open_dashboard,
    register,
)
from tests.support.live_service import LiveService
from tests.support.reports import GB, PLACE, placement

# Skipped without Chromium, like the other browser tests.
pytestmark = [pytest.mark.browser, needs_chromium]

WEIGHTS_VIEW = """
[...document.querySelectorAll('#node-weights tbody tr')].map(tr =>
  [...tr.children].map(td => td.innerText.trim()))
"""


async def test_the_node_view_lists_weights_with_state_progress_and_pins(
    service: LiveService,
) -> None:
    register(
        service,
        "gpu-01",
        weights=[
            {"path": "/models/llama-70b", "state": "READY", "sizeBytes": 140 * GB,
             "totalBytes": 140 * GB},
            {"path": "/models/qwen", "state": "DOWNLOADING", "sizeBytes": 41 * GB,
             "totalBytes": 100 * GB},
        ],
    )  # fmt: skip
    placed = call(service, PLACE, placement("chat", gpusPerShard=8, weights="/models/llama-70b"))
    assert placed["place"]["__typename"] == "Allocated"

    async with chromium() as page:
        await open_dashboard(page, service, "#node=gpu-01")
        await page.wait_for(
            "document.querySelectorAll('#node-weights tbody tr').length === 2", "the node's weights"
        )
        await page.screenshot(SCREENSHOTS / "dashboard-node-weights.png")
        assert await page.evaluate(WEIGHTS_VIEW) == [
            ["/models/llama-70b", "ready", "140 GB", "chat"],
            ["/models/qwen", "downloading", "41.0 GB of 100 GB (41%)", "—"],
        ]
        assert page.errors == []
