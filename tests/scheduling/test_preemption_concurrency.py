"""Four tenants preempting at once through two service processes, near their limits.

The fleet is filled at priority 0 by deployments with disruption budgets;
then every tenant places replicas of higher priority with preemption
LOWER_PRIORITY, through both processes at once. While they run, a sampler
reads the database over and over: no tenant over its limit, no GPU held
twice, every quota counter equal to what its tenant holds, and no budgeted
deployment below its minAvailable. Afterwards each victim's node, told in a
heartbeat what its engines run, is told to stop exactly the preempted
shards (PREEMPTED, naming the preemptor) and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict
from typing import Any

import asyncpg
import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.db import libpq_url
from tests.support.fencing import BEAT
from tests.support.preemption import PLACE, post
from tests.support.reports import REGISTER, node_input
from tests.support.tenancy import SET_BUDGET, SET_TENANT

NODES = [f"gpu-{i:02d}" for i in range(6)]  # 48 H100
LIMITS = {"t0": 16, "t1": 16, "t2": 16, "t3": 16}
MIN_AVAILABLE = 3
LOWER = {"preemption": "LOWER_PRIORITY"}

SAMPLE = """
SELECT
  (SELECT coalesce(json_object_agg(h.tenant, h.n), '{}') FROM (
      SELECT tenant, count(*) AS n FROM allocated_gpus WHERE gpu_class = 'H100-80GB'
      GROUP BY tenant) h) AS held,
  (SELECT coalesce(json_object_agg(q.tenant, q.used), '{}') FROM tenant_quotas q) AS counted,
  (SELECT count(*) FROM (
      SELECT s.node_id, i FROM shards s CROSS JOIN LATERAL unnest(s.gpu_indices) i
      GROUP BY 1, 2 HAVING count(*) > 1) d) AS twice,
  (SELECT coalesce(json_agg(b.tenant || '/' || b.deployment), '[]') FROM disruption_budgets b
   WHERE (SELECT count(DISTINCT s.replica_id) FROM shards s
          WHERE s.tenant = b.tenant AND s.deployment = b.deployment) < b.min_available)
      AS below
"""


class Sampler:
    def __init__(self, url: str) -> None:
        self.url = url
        self.samples = 0
        self.wrong: list[str] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
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
                below = json.loads(row["below"])
                if below:
                    self.wrong.append(f"below their budgets: {below}")
                await asyncio.sleep(0.005)
        finally:
            await conn.close()


def shape(replica: str, per: int, tenant: str, priority: int, **more: Any) -> dict[str, Any]:
    return {"input": {"replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": per,
                      "tenant": tenant, "priority": priority, **more}}  # fmt: skip


async def test_four_tenants_preempting_at_once_through_two_processes(
    live_service_factory: Any, engine: AsyncEngine, database_url: str
) -> None:
    rng = random.Random(46)
    first, second = await asyncio.gather(
        asyncio.to_thread(live_service_factory), asyncio.to_thread(live_service_factory)
    )
    urls = (first.url, second.url)
    # shard id -> (node, fence) of every shard placed, and the replicas preempted.
    running: dict[str, tuple[str, int, str]] = {}
    async with httpx.AsyncClient(timeout=120) as client:
        for node_id in NODES:
            await post(client, first.url, REGISTER, {"input": node_input(node_id)})
        for tenant, limit in LIMITS.items():
            quotas = [{"gpuClass": "H100-80GB", "guaranteed": 8, "limit": limit}]
            await post(client, first.url, SET_TENANT, {"input": {"id": tenant, "quotas": quotas}})

        # The fleet filled at priority 0: 12 GPUs per tenant in replicas of 2,
        # one deployment each, with a budget of MIN_AVAILABLE of its 6.
        for tenant in LIMITS:
            for i in range(6):
                data = await post(client, urls[i % 2], PLACE,
                                  shape(f"{tenant}-low{i}", 2, tenant, 0, deployment=f"{tenant}-batch"))  # fmt: skip
                answer = data["place"]
                assert answer["__typename"] == "Allocated", answer
                for a in answer["allocations"]:
                    running[a["shardId"]] = (a["nodeId"], a["fence"], a["replicaId"])
            budget = {"deployment": f"{tenant}-batch", "tenant": tenant,
                      "minAvailable": MIN_AVAILABLE}  # fmt: skip
            await post(client, first.url, SET_BUDGET, {"input": budget})

        sampler = Sampler(libpq_url(database_url))
        sampling = asyncio.create_task(sampler.run())
        # Every tenant asks for more at priorities 10 and 20, sizes 1 to 4,
        # all at once, alternating the processes.
        calls = [
            (tenant, f"{tenant}-hi{i}", rng.choice((1, 2, 2, 4)), rng.choice((10, 20)))
            for tenant in LIMITS
            for i in range(8)
        ]
        rng.shuffle(calls)
        answers = await asyncio.gather(
            *(
                post(
                    client,
                    urls[i % 2],
                    PLACE,
                    shape(replica, per, tenant, priority, preemption="LOWER_PRIORITY"),
                )
                for i, (tenant, replica, per, priority) in enumerate(calls)
            )
        )
        sampler.stop.set()
        await sampling

        preempted_by: dict[str, str] = {}
        placed = 0
        for (_, replica, _, _), data in zip(calls, answers, strict=True):
            answer = data["place"]
            if answer["__typename"] != "Allocated":
                assert answer["__typename"] == "Unplaceable", answer
                continue
            placed += 1
            for a in answer["allocations"]:
                running[a["shardId"]] = (a["nodeId"], a["fence"], a["replicaId"])
            for victim in answer["preempted"]:
                assert victim["replicaId"] not in preempted_by, "preempted twice"
                preempted_by[victim["replicaId"]] = replica
        assert placed > 0 and preempted_by, (placed, preempted_by)

        # Each node, told what its engines run, is told to stop exactly the
        # preempted shards, naming their preemptor.
        beat = BEAT.replace("reason }", "reason preemptedBy }")
        on: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for shard_id, (node_id, fence, _) in sorted(running.items()):
            on[node_id].append({"shardId": shard_id, "fence": fence})
        told: dict[str, tuple[str, str | None]] = {}
        for node_id, shards in sorted(on.items()):
            data = await post(client, first.url, beat, {"id": node_id, "running": shards})
            for stop in data["heartbeat"]["shardsToStop"]:
                told[stop["shardId"]] = (stop["reason"], stop["preemptedBy"])
        expected = {
            shard_id: ("PREEMPTED", preempted_by[replica])
            for shard_id, (_, _, replica) in running.items()
            if replica in preempted_by
        }
        assert told == expected

    assert sampler.samples > 10, "the sampler saw too little of the run"
    assert sampler.wrong == []
    conn = await asyncpg.connect(libpq_url(database_url))
    try:
        final = await conn.fetchrow(SAMPLE)
    finally:
        await conn.close()
    assert final["twice"] == 0 and json.loads(final["below"]) == []
