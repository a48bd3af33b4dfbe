"""The dashboard shows each tenant's use of every GPU class against its guarantee and its limit."""

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
from tests.support.tenancy import PLACE, SET_TENANT

# Skipped without Chromium, like the other browser tests.
pytestmark = [pytest.mark.browser, needs_chromium]

ROWS = """
[...document.querySelectorAll('#tenants tbody tr')].map(tr =>
  [...tr.children].slice(0, 6).map(td => td.innerText.trim()))
"""
# The bar's parts as fractions of its width: within the guarantee, borrowed, the guarantee's tick.
BAR = """
(() => {
  const bar = document.querySelector('#tenants tr[data-tenant="prod"] .usage-bar');
  const width = bar.getBoundingClientRect().width;
  const part = (cls) => bar.querySelector('.' + cls).getBoundingClientRect();
  return [part('within').width / width, part('borrowed').width / width,
          (part('guarantee').left - bar.getBoundingClientRect().left) / width,
          bar.classList.contains('over')];
})()
"""


async def test_each_tenant_against_its_guarantee_and_limit(service: LiveService) -> None:
    for node_id in ("hgx-0", "hgx-1", "hgx-2"):
        register(service, node_id)
    quotas = [{"gpuClass": "H100-80GB", "guaranteed": 8, "limit": 16}]
    call(service, SET_TENANT, {"input": {"id": "prod", "quotas": quotas}})
    for i in range(3):
        shape = {"replicaId": f"chat-{i}", "gpuClass": "H100-80GB", "gpusPerShard": 4,
                 "tenant": "prod"}  # fmt: skip
        assert call(service, PLACE, {"input": shape})["place"]["__typename"] == "Allocated"

    async with chromium() as page:
        await open_dashboard(page, service)
        await page.wait_for(
            "document.querySelectorAll('#tenants tbody tr').length === 1", "prod listed"
        )
        assert await page.evaluate(ROWS) == [["prod", "H100-80GB", "12 / 16", "8", "4", "4"]]
        within, borrowed, tick, over = await page.evaluate(BAR)
        assert (round(within, 2), round(borrowed, 2), round(tick, 2), over) == (
            0.5,
            0.25,
            0.5,
            False,
        )
        await page.screenshot(SCREENSHOTS / "dashboard-tenants.png")

        # An operator lowers the limit below use: the bar says so, and the notice.
        lowered = [{"gpuClass": "H100-80GB", "guaranteed": 8, "limit": 8}]
        call(service, SET_TENANT, {"input": {"id": "prod", "quotas": lowered}})
        await open_dashboard(page, service)  # setTenant is no event: read the page again
        await page.wait_for(
            "document.querySelectorAll('#tenant-notices li').length === 1", "the notice"
        )
        assert (await page.evaluate(BAR))[3] is True
        notice = await page.evaluate("document.querySelector('#tenant-notices li').innerText")
        assert notice.startswith("prod: H100-80GB: holds 12, above its limit 8")
