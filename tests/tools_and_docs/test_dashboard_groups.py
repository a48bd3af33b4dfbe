"""The dashboard lists placement groups, and a group's view shows its members and their KV paths."""

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
from tests.support.topology import hgx_h100

# Skipped without Chromium, like the other browser tests.
pytestmark = [pytest.mark.browser, needs_chromium]

PLACE_GROUP = "mutation P($g: PlaceGroupInput!) { placeGroup(input: $g) { __typename } }"
ROWS = """
[...document.querySelectorAll('#%s tbody tr')].map(tr =>
  [...tr.children].map(td => td.innerText.trim()))
"""


def role(name: str, replicas: int, per: int) -> dict[str, object]:
    shape = {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": per}
    return {"role": name, "replicas": replicas, "shape": shape}


async def test_a_groups_view_shows_its_members_and_kv_paths(
    service: LiveService,
) -> None:
    register(service, "gpu-01", gpus=hgx_h100(near=False))
    group = {
        "groupId": "chat-pd",
        "roles": [role("prefill", 1, 4), role("decode", 2, 2)],
        "locality": {"level": "NODE"},
        "kvFrom": "prefill",
        "kvTo": "decode",
    }
    placed = call(service, PLACE_GROUP, {"g": group})
    assert placed["placeGroup"]["__typename"] == "GroupPlaced", placed

    async with chromium() as page:
        await open_dashboard(page, service)
        await page.wait_for(
            "document.querySelectorAll('#groups tbody tr').length === 1", "the group listed"
        )
        assert await page.evaluate(ROWS % "groups") == [
            ["chat-pd", "1", "prefill: 1, decode: 2", "gpu-01"]
        ]
        await page.evaluate("document.querySelector('#groups a.open-group').click()")
        await page.wait_for(
            "document.querySelectorAll('#group-paths tbody tr').length === 2", "the KV paths"
        )
        await page.screenshot(SCREENSHOTS / "dashboard-group.png")
        assert await page.evaluate(ROWS % "group-members") == [
            ["prefill", "chat-pd-prefill-0", "gpu-01:0,1,2,3"],
            ["decode", "chat-pd-decode-0", "gpu-01:4,5"],
            ["decode", "chat-pd-decode-1", "gpu-01:6,7"],
        ]
        assert await page.evaluate(ROWS % "group-paths") == [
            ["chat-pd-prefill-0", "chat-pd-decode-0", "same nvlink group"],
            ["chat-pd-prefill-0", "chat-pd-decode-1", "same nvlink group"],
        ]
        assert "group=chat-pd" in await page.evaluate("location.hash")
        assert page.errors == []
