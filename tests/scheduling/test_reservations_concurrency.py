"""Reserves and places racing through two service processes; the start and end made once by either.

32 calls at once, half reserve and half place, each asking for 4 H100 on a
fleet of 32 (room for K = 8 of them): exactly K succeed, and a sampler
reading the database throughout never finds a GPU held against a
reservation (tests/support/consistency.HELD_AGAINST) nor one held twice.
Then both processes' timelines run (INVENTORY_TIMELINE_INTERVAL): every
reservation's start and end is made once, its event written once, whichever
process made it.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import asyncpg
import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.db import libpq_url
from tests.support.consistency import HELD_AGAINST, inconsistencies
from tests.support.reports import REGISTER, node_input
from tests.support.reservations import RESERVE, iso, shape, soon, until_past
from tests.support.tenancy import PLACE, SET_TENANT

NODES = [f"gpu-{i:02d}" for i in range(4)]  # 32 H100: room for 8 calls of 4
CALLS = 32

SAMPLE = f"""
SELECT (SELECT count(*) FROM ({HELD_AGAINST}) h) AS against,
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
                self.samples += 1
                if row["against"]:
                    self.wrong.append(f"{row['against']} GPUs held against a reservation")
                if row["twice"]:
                    self.wrong.append(f"{row['twice']} GPUs held twice")
                await asyncio.sleep(0.005)
        finally:
            await conn.close()


async def test_reserve_and_place_race_through_two_processes(
    live_service_factory: Any, engine: AsyncEngine, database_url: str
) -> None:
    env = {"INVENTORY_TIMELINE_INTERVAL": "0.2"}
    first, second = await asyncio.gather(
        asyncio.to_thread(live_service_factory, env), asyncio.to_thread(live_service_factory, env)
    )
    urls = (first.url, second.url)
    start, end = soon(6), soon(8)
    async with httpx.AsyncClient(timeout=120) as client:
        for node_id in NODES:
            await post(client, first.url, REGISTER, {"input": node_input(node_id)})
        for tenant in ("owner", "batch"):
            await post(client, first.url, SET_TENANT, {"input": {"id": tenant, "quotas": []}})

        async def call(i: int) -> str:
            url = urls[i % 2]
            if i % 2 == 0:
                spec = {
                    "id": f"res-{i}",
                    "tenant": "owner",
                    "shape": shape(per=4),
                    "count": 1,
                    "start": iso(start),
                    "end": iso(end),
                }
                answer = (await post(client, url, RESERVE, {"input": spec}))["reserve"]
            else:
                request = shape(per=4, replicaId=f"place-{i}", tenant="batch")
                answer = (await post(client, url, PLACE, {"input": request}))["place"]
            return str(answer["__typename"])

        sampler = Sampler(libpq_url(database_url))
        sampling = asyncio.create_task(sampler.run())
        try:
            answers = await asyncio.gather(*(call(i) for i in range(CALLS)))
        finally:
            sampler.stop.set()
            await sampling
        made = Counter(answers)
        assert made["Reservation"] + made["Allocated"] == 8, made
        assert made["Unplaceable"] == CALLS - 8, made
        assert sampler.samples > 0 and not sampler.wrong, sampler.wrong[:5]
        assert await inconsistencies(engine) == []

        # Both processes' timelines: each start and end once.
        reservations = made["Reservation"]
        await until_past(end)
        conn = await asyncpg.connect(libpq_url(database_url))
        try:
            for _ in range(100):
                kinds = {
                    r["kind"]: r["n"]
                    for r in await conn.fetch(
                        "SELECT kind, count(*) AS n FROM events"
                        " WHERE kind LIKE 'reservation_%' GROUP BY kind"
                    )
                }
                if kinds.get("reservation_ended", 0) >= reservations:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # a late duplicate would show by now
            rows = await conn.fetch(
                "SELECT kind, detail FROM events WHERE kind LIKE 'reservation_%' ORDER BY id"
            )
        finally:
            await conn.close()
        per = Counter(
            (r["kind"], json.loads(r["detail"])["reservation"])
            for r in rows
            if r["kind"] != "reservation_created"
        )
        assert len(per) == 2 * reservations, per
        assert set(per.values()) == {1}, per
        assert await inconsistencies(engine) == []
