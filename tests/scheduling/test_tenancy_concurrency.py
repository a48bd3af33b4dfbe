"""Four tenants placing at once through two service processes, near their limits.

The limit is checked in the claiming transaction (service/scheduling/tenancy/
quota_claims.py), so no process's memory can help: while the places run, a
sampler reads the database over and over and finds no tenant over its limit,
no GPU held twice and every quota counter equal to what its tenant holds;
and a tenant with room for K GPUs, asked for many more one at a time, gets
exactly K.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.db import libpq_url
from tests.support.reports import REGISTER, node_input
from tests.support.tenancy import PLACE, RELEASE, SET_TENANT

NODES = [f"gpu-{i:02d}" for i in range(6)]  # 48 H100
LIMITS = {"t0": 10, "t1": 10, "t2": 12, "t3": 8}  # 40: the limits bind before the fleet does

# One statement, one snapshot: what each tenant holds, what its counter
# says, and any GPU two shards claim.
SAMPLE = """
SELECT
  (SELECT coalesce(json_object_agg(h.tenant, h.n), '{}') FROM (
      SELECT tenant, count(*) AS n FROM allocated_gpus WHERE gpu_class = 'H100-80GB'
      GROUP BY tenant) h) AS held,
  (SELECT coalesce(json_object_agg(q.tenant, q.used), '{}') FROM tenant_quotas q) AS counted,
  (SELECT count(*) FROM (
      SELECT s.node_id, i FROM shards s CROSS JOIN LATERAL unnest(s.gpu_indices) i
      GROUP BY 1, 2 HAVING count(*) > 1) d) AS twice
"""


async def post(client: httpx.AsyncClient, url: str, query: str, variables: Any) -> Any:
    response = await client.post(url, json={"query": query, "variables": variables})
    assert response.status_code == 200, (response.status_code, response.text)
    body = response.json()
    assert "errors" not in body, body
    return body["data"]


class Sampler:
    """Reads the database every few milliseconds while the places run; keeps what it saw wrong."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples = 0
        self.wrong: list[str] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        import json

        conn = await asyncpg.connect(self.url)
        try:
            while not self.stop.is_set():
                row = await conn.fetchrow(SAMPLE)
                held, counted = json.loads(row["held"]), json.loads(row["counted"])
                self.samples += 1
                for tenant, limit in LIMITS.items():
                    if held.get(tenant, 0) > limit:
                        self.wrong.append(f"{tenant} held {held[tenant]} > {limit}")
                    if counted.get(tenant) != held.get(tenant, 0):
                        self.wrong.append(f"{tenant} counted {counted.get(tenant)} != {held}")
                if row["twice"]:
                    self.wrong.append(f"{row['twice']} GPUs held twice")
                await asyncio.sleep(0.005)
        finally:
            await conn.close()


async def test_four_tenants_near_their_limits_through_two_processes(
    live_service_factory: Any, engine: AsyncEngine, database_url: str
) -> None:
    first, second = await asyncio.gather(
        asyncio.to_thread(live_service_factory), asyncio.to_thread(live_service_factory)
    )
    urls = (first.url, second.url)
    async with httpx.AsyncClient(timeout=120) as client:
        for node_id in NODES:
            await post(client, first.url, REGISTER, {"input": node_input(node_id)})
        for tenant, limit in LIMITS.items():
            quotas = [{"gpuClass": "H100-80GB", "guaranteed": limit // 2, "limit": limit}]
            await post(client, first.url, SET_TENANT, {"input": {"id": tenant, "quotas": quotas}})

        sampler = Sampler(libpq_url(database_url))
        sampling = asyncio.create_task(sampler.run())

        # Round 1: every tenant asks for twice its room, one GPU at a time,
        # all at once, alternating the processes.
        calls = [
            (tenant, f"{tenant}-a{i}", 1)
            for tenant, limit in LIMITS.items()
            for i in range(2 * limit)
        ]
        calls.sort(key=lambda c: hash(c[1]) % 997)
        answers = await asyncio.gather(
            *(
                post(
                    client,
                    urls[i % 2],
                    PLACE,
                    {
                        "input": {
                            "replicaId": replica,
                            "gpuClass": "H100-80GB",
                            "gpusPerShard": per,
                            "tenant": tenant,
                        }
                    },
                )
                for i, (tenant, replica, per) in enumerate(calls)
            )
        )
        placed: Counter[str] = Counter()
        refused: Counter[str] = Counter()
        for (tenant, _, _), data in zip(calls, answers, strict=True):
            answer = data["place"]
            if answer["__typename"] == "Allocated":
                placed[tenant] += 1
            else:
                assert answer["__typename"] == "Unplaceable", answer
                assert answer["quota"]["tenant"] == tenant, answer
                assert answer["quota"]["used"] + 1 > answer["quota"]["limit"], answer
                refused[tenant] += 1
        # Exactly K for room K, whichever process each call went through.
        assert dict(placed) == LIMITS
        assert dict(refused) == LIMITS

        # Round 2: half of each tenant's replicas released while mixed sizes
        # are placed at once: the limit holds through releases too.
        releases = [f"{t}-a{i}" for t in LIMITS for i in range(0, 2 * LIMITS[t], 2)]
        mixed = [
            (tenant, f"{tenant}-b{i}", 1 + i % 3)
            for tenant in LIMITS
            for i in range(LIMITS[tenant])
        ]
        work = [post(client, urls[i % 2], RELEASE, {"id": r}) for i, r in enumerate(releases)]
        work += [
            post(
                client,
                urls[i % 2],
                PLACE,
                {
                    "input": {
                        "replicaId": replica,
                        "gpuClass": "H100-80GB",
                        "gpusPerShard": per,
                        "tenant": tenant,
                    }
                },
            )
            for i, (tenant, replica, per) in enumerate(mixed)
        ]
        await asyncio.gather(*work)
        sampler.stop.set()
        await sampling

    assert sampler.samples > 10, "the sampler saw too little of the run"
    assert sampler.wrong == []
    conn = await asyncpg.connect(libpq_url(database_url))
    try:
        final = await conn.fetchrow(SAMPLE)
    finally:
        await conn.close()
    import json

    held, counted = json.loads(final["held"]), json.loads(final["counted"])
    assert held == {t: counted[t] for t in LIMITS if counted[t]}
    assert all(held.get(t, 0) <= limit for t, limit in LIMITS.items())
