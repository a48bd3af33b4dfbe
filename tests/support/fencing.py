"""Fencing stories' pieces: heartbeats and a node lost."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.connections import Connection
from service.database.transactions import in_transaction
from service.fleet.liveness import SweepResult, sweep
from tests.support.liveness import LOST_AFTER, UNREACHABLE_AFTER, silence

BEAT = """
mutation Beat($id: ID!, $incarnation: Int, $running: [RunningShardInput!]) {
  heartbeat(nodeId: $id, incarnation: $incarnation, runningShards: $running) {
    id state incarnation shardsToStop { shardId fence reason }
  }
}
"""

# A fencing story's reads: the allocations as listed, and the events of a node or of some kinds.
ALLOCATIONS = """
query Allocations($nodeId: ID, $held: Boolean) {
  allocations(nodeId: $nodeId, held: $held) {
    shardId replicaId nodeId gpuIndices fence generation heldSince
  }
}
"""

EVENTS = """
query Events($nodeId: ID, $kinds: [String!]) {
  events(nodeId: $nodeId, kinds: $kinds) { kind nodeId replicaId shardId actor reason detail }
}
"""


async def run_sweep(engine: AsyncEngine, policy: str = "free") -> SweepResult:
    async def work(conn: Connection) -> SweepResult:
        return await sweep(conn, UNREACHABLE_AFTER, LOST_AFTER, lost_policy=policy)

    return await in_transaction(engine, work)


async def lose(engine: AsyncEngine, node_id: str, policy: str = "free") -> SweepResult:
    await silence(engine, node_id, LOST_AFTER + 5)
    return await run_sweep(engine, policy)
