"""/metrics per tenant and GPU class: what each holds, what it borrowed, its limit, what was preempted."""

from __future__ import annotations

import httpx

from tests.support.api import Api
from tests.support.metrics import scrape
from tests.support.reports import REGISTER, node_input
from tests.support.tenancy import place, quota, set_tenant


async def test_tenants_used_borrowed_and_limit_per_class(
    api: Api, client: httpx.AsyncClient
) -> None:
    for i in range(2):
        await api(REGISTER, {"input": node_input(f"hgx-{i}")})
    await set_tenant(api, "prod", quota(guaranteed=4, limit=12))
    for i in range(3):
        assert (await place(api, f"chat-{i}", per=2, tenant="prod"))["__typename"] == "Allocated"
    assert (await place(api, "batch-0", per=1))["__typename"] == "Allocated"

    samples = await scrape(client)
    prod = '{tenant="prod",gpu_class="H100-80GB"}'
    default = '{tenant="default",gpu_class="H100-80GB"}'
    assert samples[f"inventory_tenant_gpus_used{prod}"] == 6
    assert samples[f"inventory_tenant_gpus_borrowed{prod}"] == 2
    assert samples[f"inventory_tenant_gpus_limit{prod}"] == 12
    assert samples[f"inventory_tenant_gpus_used{default}"] == 1
    assert samples[f"inventory_tenant_gpus_borrowed{default}"] == 1
    # No limit: no series, never a zero that would read as "nothing allowed".
    assert f"inventory_tenant_gpus_limit{default}" not in samples
    # Registered at 0 for every tenant and class, for preemption to count.
    assert samples[f"inventory_tenant_replicas_preempted_total{prod}"] == 0
