"""Tenancy as a scheduler and an operator use it over GraphQL: the documents and small helpers tests share."""

from __future__ import annotations

from typing import Any

from tests.support.api import Api
from tests.support.reports import REGISTER, node_input

TENANT_FIELDS = """
id description
quotas { gpuClass guaranteed limit }
usage { gpuClass used borrowed guaranteed limit available }
notices
"""
SET_TENANT = (
    f"mutation S($input: TenantInput!) {{ setTenant(input: $input) {{ {TENANT_FIELDS} }} }}"
)
REMOVE_TENANT = "mutation R($id: ID!) { removeTenant(id: $id) }"
TENANTS = f"{{ tenants {{ {TENANT_FIELDS} }} }}"
TENANT = f"query T($id: ID!) {{ tenant(id: $id) {{ {TENANT_FIELDS} }} }}"

QUOTA = "quota { tenant gpuClass used limit asked }"
PLACE = f"""
mutation Place($input: PlaceInput!) {{
  place(input: $input) {{
    __typename
    ... on Allocated {{
      allocations {{ shardId replicaId nodeId gpuIndices tenant priority deployment borrowed }}
      preempted {{ replicaId }}
    }}
    ... on Unplaceable {{ message verdicts {{ nodeId code detail }} {QUOTA} blockingBudgets {{ deployment }} }}
    ... on AllocationRejected {{ code message {QUOTA} }}
  }}
}}
"""
ALLOCATE = f"""
mutation Allocate($input: AllocateInput!) {{
  allocate(input: $input) {{
    __typename
    ... on Allocated {{ allocations {{ shardId nodeId gpuIndices tenant priority deployment borrowed }} }}
    ... on AllocationRejected {{ code message {QUOTA} }}
  }}
}}
"""
RELEASE = "mutation R($id: ID!) { releaseReplica(replicaId: $id) }"
FIT = """
query Fit($shape: PlaceInput!) {
  fit(shape: $shape) { replicas nodes { nodeId shards } limitedBy { code nodes } }
}
"""
EXPLAIN = """
query E($input: PlaceInput!) {
  explainPlacement(input: $input) { placeable message verdicts { nodeId code } preemptions { replicaId } }
}
"""
SET_BUDGET = """
mutation B($input: DisruptionBudgetInput!) {
  setDisruptionBudget(input: $input) { deployment tenant minAvailable placed }
}
"""
REMOVE_BUDGET = (
    "mutation R($d: String!, $t: ID) { removeDisruptionBudget(deployment: $d, tenant: $t) }"
)
BUDGETS = """
query B($tenant: ID) { disruptionBudgets(tenant: $tenant) { deployment tenant minAvailable placed } }
"""
CREATE_TOKEN = """
mutation T($role: Role!, $tenant: ID) {
  createToken(role: $role, tenant: $tenant) { secret token { id role tenant } }
}
"""


def quota(
    gpu_class: str = "H100-80GB", guaranteed: int = 0, limit: int | None = None
) -> dict[str, Any]:
    return {"gpuClass": gpu_class, "guaranteed": guaranteed, "limit": limit}


async def set_tenant(api: Api, tenant_id: str, *quotas: dict[str, Any], **fields: Any) -> Any:
    answer = await api(SET_TENANT, {"input": {"id": tenant_id, "quotas": list(quotas), **fields}})
    return answer["setTenant"]


async def place(api: Api, replica_id: str, per: int = 8, **fields: Any) -> Any:
    shape = {"replicaId": replica_id, "gpuClass": "H100-80GB", "gpusPerShard": per, **fields}
    return (await api(PLACE, {"input": shape}))["place"]


def usage_of(tenant: dict[str, Any], gpu_class: str = "H100-80GB") -> dict[str, Any]:
    return next(u for u in tenant["usage"] if u["gpuClass"] == gpu_class)


async def tenant(api: Api, tenant_id: str) -> Any:
    return (await api(TENANT, {"id": tenant_id}))["tenant"]


# The worked example's fleet (docs/scheduler/tenancy.md): five nodes of 8 H100.
NODES = [f"hgx-{i}" for i in range(5)]


async def register_fleet(api: Api) -> None:
    for node_id in NODES:
        await api(REGISTER, {"input": node_input(node_id)})


async def worked_example_tenants(api: Api) -> None:
    await set_tenant(api, "prod", quota(guaranteed=16, limit=24), description="serving")
    await set_tenant(api, "staging", quota(limit=8))
    await set_tenant(api, "research")
