"""/metrics: the cluster and this process in Prometheus' text format; unknown disk is absent, never 0."""

from __future__ import annotations

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from service.event_log.event_announcements import drain_announcements
from service.metrics import count_rejection
from tests.support.api import Api
from tests.support.liveness import IB_A, place
from tests.support.metrics import scrape
from tests.support.reports import GB, REGISTER, TB, node_input
from tests.support.statements import StatementCounter

DISK = [
    {"id": "dev:259:1", "mountPoint": "/data", "fsType": "xfs", "shared": False,
     "freeBytes": 500 * GB, "totalBytes": 2 * TB},
]  # fmt: skip


async def test_metrics_describe_the_cluster_and_omit_unknown_disks(
    api: Api, client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01", storage=DISK, fabrics=IB_A)})
    await api(REGISTER, {"input": node_input("gpu-02")})  # reports no storage: disk unknown
    await api('mutation { cordonNode(id: "gpu-02", reason: "burn-in") { id } }')
    await place(engine, "r1", {"gpu-01": [0, 1, 2]})

    m = await scrape(client)

    assert m["inventory_database_up"] == 1
    assert m['inventory_nodes{state="ready"}'] == 1
    assert m['inventory_nodes{state="cordoned"}'] == 1
    assert m['inventory_nodes{state="lost"}'] == 0
    assert m['inventory_gpus{gpu_class="H100-80GB",status="free"}'] == 5
    assert m['inventory_gpus{gpu_class="H100-80GB",status="allocated"}'] == 3
    assert m['inventory_gpus{gpu_class="H100-80GB",status="unhealthy"}'] == 0
    assert m['inventory_gpus{gpu_class="H100-80GB",status="unschedulable"}'] == 8

    assert m['inventory_node_local_disk_free_bytes{node="gpu-01"}'] == 500 * GB
    assert m['inventory_node_local_disk_total_bytes{node="gpu-01"}'] == 2 * TB
    # Unknown is absent: a zero would page someone about a full disk.
    assert not any('node="gpu-02"' in key and "disk" in key for key in m)
    assert 0 <= m['inventory_node_heartbeat_age_seconds{node="gpu-02"}'] < 60


async def test_rejections_and_request_latencies_are_counted_in_this_process(
    api: Api, client: httpx.AsyncClient
) -> None:
    before = await scrape(client)
    count_rejection("GPU_TAKEN")
    count_rejection("GPU_TAKEN")
    await api("{ nodes { id } }")
    after = await scrape(client)

    key = 'inventory_allocation_rejections_total{code="GPU_TAKEN"}'
    assert after[key] - before.get(key, 0) == 2
    count = (
        'inventory_http_request_duration_seconds_count{method="POST",route="/graphql",status="200"}'
    )
    assert after[count] - before.get(count, 0) >= 1
    inf = 'inventory_http_request_duration_seconds_bucket{method="POST",route="/graphql",status="200",le="+Inf"}'
    assert after[inf] == after[count]


async def test_a_scrape_costs_the_same_statements_for_two_nodes_or_twenty(
    api: Api, client: httpx.AsyncClient, engine: AsyncEngine, count_statements: StatementCounter
) -> None:
    async def statements_per_scrape() -> int:
        # Each registration's event is announced (pg_notify) by a background
        # flush after the mutation answers; on a loaded machine that statement
        # landed inside a scrape's count. Let it finish before counting.
        await drain_announcements(engine)
        start = count_statements.count
        await scrape(client)
        return count_statements.count - start

    for i in range(2):
        await api(REGISTER, {"input": node_input(f"gpu-{i:02d}", storage=DISK)})
    small = await statements_per_scrape()
    for i in range(2, 20):
        await api(REGISTER, {"input": node_input(f"gpu-{i:02d}", storage=DISK)})
    assert await statements_per_scrape() == small


async def test_a_scrape_during_a_database_outage_still_answers_for_the_process(
    unreachable_client: httpx.AsyncClient,
) -> None:
    count_rejection("NO_SUCH_GPU")
    m = await scrape(unreachable_client)
    assert m["inventory_database_up"] == 0
    assert m['inventory_allocation_rejections_total{code="NO_SUCH_GPU"}'] >= 1
    assert not any(key.startswith("inventory_nodes") for key in m)
