"""A maintenance window seconds long moves on time with two service processes, each transition once.

Both processes run the transitions loop (every 0.2 s here). The first is
killed (SIGKILL) once the window drains: the second, alone, starts and ends
it. Each transition's event is written once, within a few loop intervals of
its due time by the database's clock, and the replicas asked to move are
asked once.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.maintenance import SCHEDULE, window_input
from tests.support.reports import REGISTER, node_input
from tests.support.tenancy import PLACE

INTERVAL = 0.2
# How late a transition may be: a few loop intervals, and a loaded machine's pause.
LATE = 3.0
ENV = {"INVENTORY_TIMELINE_INTERVAL": str(INTERVAL)}


async def post(client: httpx.AsyncClient, url: str, query: str, variables: Any) -> Any:
    response = await client.post(url, json={"query": query, "variables": variables})
    assert response.status_code == 200, (response.status_code, response.text)
    body = response.json()
    assert "errors" not in body, body
    return body["data"]


async def state_of(engine: AsyncEngine, window_id: str) -> str:
    async with engine.connect() as conn:
        state: str = (
            await conn.execute(
                text("SELECT state FROM maintenance_windows WHERE id = :id"), {"id": window_id}
            )
        ).scalar_one()
    return state


async def wait_for(engine: AsyncEngine, window_id: str, state: str, within: float) -> None:
    for _ in range(int(within / 0.1)):
        if await state_of(engine, window_id) == state:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{window_id} not {state} within {within} s")


async def test_transitions_happen_on_time_once_whichever_process_is_up(
    live_service_factory: Any, engine: AsyncEngine
) -> None:
    first, second = await asyncio.gather(
        asyncio.to_thread(live_service_factory, ENV), asyncio.to_thread(live_service_factory, ENV)
    )
    async with httpx.AsyncClient(timeout=60) as client:
        for node_id in ("rack-0", "rack-1", "spare-0"):
            await post(client, first.url, REGISTER, {"input": node_input(node_id)})
        for i in range(4):
            shape = {"replicaId": f"r-{i}", "gpuClass": "H100-80GB", "gpusPerShard": 4}
            await post(client, second.url, PLACE, {"input": shape})
        async with engine.connect() as conn:
            now: datetime = (await conn.execute(text("SELECT now()"))).scalar_one()
        start, end = now + timedelta(seconds=4), now + timedelta(seconds=7)
        spec = window_input(
            "w", ["rack-0", "rack-1"], start.isoformat(), end.isoformat(), drain_lead=2
        )
        await post(client, first.url, SCHEDULE, {"input": spec})

        await wait_for(engine, "w", "DRAINING", within=10)
        # The first process dies mid-window; the second carries on alone.
        await asyncio.to_thread(first.kill)
        await wait_for(engine, "w", "DONE", within=20)

    async with engine.connect() as conn:
        rows = list(
            await conn.execute(
                text(
                    "SELECT kind, at, replica_id FROM events"
                    " WHERE kind LIKE 'maintenance%' OR kind = 'replica_must_move' ORDER BY id"
                )
            )
        )
        placed_on_rack = (
            await conn.execute(
                text(
                    "SELECT count(DISTINCT replica_id) FROM events WHERE kind = 'allocated'"
                    " AND node_id IN ('rack-0', 'rack-1')"
                )
            )
        ).scalar_one()
        asked = (await conn.execute(text("SELECT count(*) FROM maintenance_moves"))).scalar_one()
    kinds = [r.kind for r in rows if r.kind.startswith("maintenance")]
    assert kinds == ["maintenance_draining", "maintenance_started", "maintenance_done"]
    due = {
        "maintenance_draining": start - timedelta(seconds=2),
        "maintenance_started": start,
        "maintenance_done": end,
    }
    for r in rows:
        if r.kind in due:
            late = (r.at - due[r.kind]).total_seconds()
            assert 0 <= late <= LATE, (r.kind, late)
    # Each replica on the rack asked once (no budget: one wave), however many loops ran.
    must_move = [r.replica_id for r in rows if r.kind == "replica_must_move"]
    assert len(must_move) == len(set(must_move)) == placed_on_rack > 0
    # The window is done: its asks are forgotten.
    assert asked == 0
