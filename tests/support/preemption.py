"""Preemption as a scheduler meets it over GraphQL: the documents and helpers its tests share."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.api import Api

PREEMPTION = "replicaId tenant priority deployment gpus nodeIds kind reason"
PLACE = f"""
mutation Place($input: PlaceInput!) {{
  place(input: $input) {{
    __typename
    ... on Allocated {{
      allocations {{ shardId replicaId nodeId gpuIndices fence tenant priority deployment borrowed }}
      preempted {{ {PREEMPTION} }}
    }}
    ... on Unplaceable {{
      message quota {{ tenant gpuClass used limit asked }}
      blockingBudgets {{ deployment tenant minAvailable placed }}
    }}
    ... on AllocationRejected {{ code message }}
  }}
}}
"""
EXPLAIN = f"""
query E($input: PlaceInput!) {{
  explainPlacement(input: $input) {{ placeable message preemptions {{ {PREEMPTION} }} }}
}}
"""


def shape(replica_id: str, per: int = 8, **fields: Any) -> dict[str, Any]:
    return {"replicaId": replica_id, "gpuClass": "H100-80GB", "gpusPerShard": per, **fields}


async def place(api: Api, replica_id: str, per: int = 8, **fields: Any) -> Any:
    return (await api(PLACE, {"input": shape(replica_id, per, **fields)}))["place"]


async def explain(api: Api, replica_id: str, per: int = 8, **fields: Any) -> Any:
    return (await api(EXPLAIN, {"input": shape(replica_id, per, **fields)}))["explainPlacement"]


def victims(answer: dict[str, Any]) -> list[str]:
    """The replica ids an Allocated answer (preempted) or an explanation (preemptions) lists."""
    listed = answer.get("preempted", answer.get("preemptions"))
    assert listed is not None, answer
    return sorted(p["replicaId"] for p in listed)


async def post(client: httpx.AsyncClient, url: str, query: str, variables: Any) -> Any:
    """One GraphQL call to a live service process: its data, no errors."""
    response = await client.post(url, json={"query": query, "variables": variables})
    assert response.status_code == 200, (response.status_code, response.text)
    body = response.json()
    assert "errors" not in body, body
    return body["data"]


PLACE_GROUP = f"""
mutation P($input: PlaceGroupInput!) {{
  placeGroup(input: $input) {{
    __typename
    ... on GroupPlaced {{
      members {{ role replicaId allocations {{ nodeId gpuIndices priority }} }}
      preempted {{ {PREEMPTION} }}
    }}
    ... on Unplaceable {{ message blockingBudgets {{ deployment tenant }} }}
    ... on AllocationRejected {{ code message }}
  }}
}}
"""


def pd_group(group_id: str, prefill: int = 4, decodes: int = 2, **charge: Any) -> dict[str, Any]:
    """One prefill of `prefill` GPUs and `decodes` decodes of 2: a disaggregated serving group."""

    def role(name: str, replicas: int, per: int) -> dict[str, Any]:
        shape = {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": per}
        return {"role": name, "replicas": replicas, "shape": shape}

    roles = [role("prefill", 1, prefill), role("decode", decodes, 2)]
    return {"groupId": group_id, "roles": roles, **charge}


SCALE_GROUP = f"""
mutation S($id: ID!, $role: String!, $n: Int!) {{
  scaleGroup(groupId: $id, role: $role, replicas: $n) {{
    __typename
    ... on GroupPlaced {{
      generation members {{ role replicaId allocations {{ nodeId gpuIndices priority }} }}
      preempted {{ {PREEMPTION} }}
    }}
    ... on Unplaceable {{ message blockingBudgets {{ deployment tenant minAvailable placed }} }}
    ... on AllocationRejected {{ code message }}
  }}
}}
"""
