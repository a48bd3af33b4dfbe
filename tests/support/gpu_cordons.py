"""GPU cordons' mutations and what they store."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

CLEAR = """
mutation($node: ID!, $index: Int!) {
  clearGpuHealth(nodeId: $node, index: $index) { index healthy healthReasons }
}
"""


EVENTS = """
query($kinds: [String!]) {
  events(kinds: $kinds) { kind nodeId replicaId shardId actor reason detail }
}
"""


async def stored(engine: AsyncEngine) -> tuple[Any, ...]:
    async with engine.connect() as conn:
        gpus_now = (await conn.execute(text("SELECT * FROM gpus ORDER BY node_id, idx"))).all()
        pools = (await conn.execute(text("SELECT * FROM gpu_pools ORDER BY node_id"))).all()
        events = (await conn.execute(text("SELECT count(*) FROM events"))).scalar_one()
    return tuple(gpus_now), tuple(pools), events
