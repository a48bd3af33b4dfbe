"""Maintenance windows as operators and schedulers meet them over GraphQL: the documents and small helpers tests share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.transactions import in_transaction
from service.fleet.maintenance import run_round
from service.fleet.maintenance.transitions import Round
from tests.support.api import Api

WINDOW_FIELDS = "id nodeIds start end reason state replicasLeft"
SCHEDULE = f"""
mutation S($input: MaintenanceInput!) {{ scheduleMaintenance(input: $input) {{ {WINDOW_FIELDS} }} }}
"""
CANCEL = f"mutation C($id: ID!) {{ cancelMaintenance(id: $id) {{ {WINDOW_FIELDS} }} }}"
WINDOW = f"query W($id: ID!) {{ maintenanceWindow(id: $id) {{ {WINDOW_FIELDS} }} }}"
WINDOWS = f"""
query Ws($state: MaintenanceState, $first: Int, $after: ID) {{
  maintenanceWindows(state: $state, first: $first, after: $after) {{ {WINDOW_FIELDS} }}
}}
"""
MOVES = """
query M($nodeId: ID) {
  shardsToMove(nodeId: $nodeId) {
    shardId stopBy overdue maintenanceWindow
    allocation { replicaId nodeId deployment }
    taint { key value effect source }
  }
}
"""
TAINTS = "query T($id: ID!) { node(id: $id) { taints { key value effect source } } }"
EVENTS = """
query E($kinds: [String!]) { events(kinds: $kinds) { kind nodeId replicaId shardId actor reason detail } }
"""
ALLOCATE = """
mutation A($input: AllocateInput!) {
  allocate(input: $input) {
    __typename
    ... on Allocated { allocations { shardId nodeId gpuIndices fence } }
    ... on AllocationRejected { code message }
  }
}
"""


def at(seconds: float) -> str:
    """An isoformat time `seconds` from now (UTC)."""
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def window_input(
    window_id: str, node_ids: list[str], start: str, end: str, drain_lead: int = 3600, **more: Any
) -> dict[str, Any]:
    return {
        "id": window_id,
        "nodeIds": node_ids,
        "start": start,
        "end": end,
        "reason": more.pop("reason", "rack firmware upgrade"),
        "drainLead": drain_lead,
        **more,
    }


async def schedule(api: Api, **fields: Any) -> dict[str, Any]:
    data = await api(SCHEDULE, {"input": window_input(**fields)})
    window: dict[str, Any] = data["scheduleMaintenance"]
    return window


async def window(api: Api, window_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await api(WINDOW, {"id": window_id}))["maintenanceWindow"]
    return found


async def maintenance_taints(api: Api, node_id: str) -> list[dict[str, Any]]:
    taints = (await api(TAINTS, {"id": node_id}))["node"]["taints"]
    return [t for t in taints if t["key"] == "maintenance"]


async def allocate(
    api: Api, replica_id: str, node_id: str, indices: list[int], **charge: Any
) -> dict[str, Any]:
    shards = [{"shardId": f"{replica_id}-s0", "nodeId": node_id, "gpuIndices": indices}]
    answer: dict[str, Any] = (
        await api(ALLOCATE, {"input": {"replicaId": replica_id, "shards": shards, **charge}})
    )["allocate"]
    assert answer["__typename"] == "Allocated", answer
    return answer


async def one_round(engine: AsyncEngine) -> Round:
    """One round of the transitions loop, as a service process runs it."""
    return await in_transaction(engine, run_round)
