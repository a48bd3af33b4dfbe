"""/metrics for reservations: GPUs set aside, of them unused, reservations by state."""

from __future__ import annotations

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.metrics import scrape
from tests.support.reports import REGISTER, node_input
from tests.support.reservations import reserve, soon, tick, until_past
from tests.support.tenancy import place, set_tenant


async def test_reserved_unused_and_states(
    api: Api, client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    for i in range(3):
        await api(REGISTER, {"input": node_input(f"hgx-{i}")})
    await set_tenant(api, "rollout")
    start = soon(1)
    made = await reserve(api, "v2", tenant="rollout", count=2, start=start, end=soon(60))
    assert made["__typename"] == "Reservation", made
    await until_past(start)
    await tick(engine)
    assert (await place(api, "v2-0", tenant="rollout", reservation="v2"))["__typename"] == (
        "Allocated"
    )
    samples = await scrape(client)
    labels = '{tenant="rollout",gpu_class="H100-80GB"}'
    assert samples[f"inventory_reserved_gpus{labels}"] == 16
    assert samples[f"inventory_reserved_unused_gpus{labels}"] == 8
    assert samples['inventory_reservations{state="ACTIVE"}'] == 1
    assert samples['inventory_reservations{state="DEGRADED"}'] == 0
