"""Node reports as an agent would send them, for tests to register."""

from __future__ import annotations

from typing import Any

H100 = {"name": "NVIDIA H100 80GB HBM3", "memoryMb": 81559}
H200 = {"name": "NVIDIA H200", "memoryMb": 143771}
A100 = {"name": "NVIDIA A100-SXM4-40GB", "memoryMb": 40960}
L40S = {"name": "NVIDIA L40S", "memoryMb": 46068}

TB = 10**12
GB = 10**9

REGISTER = """
mutation Register($input: NodeInput!) {
  registerNode(input: $input) { id state stateReason schedulable }
}
"""


def gpus(model: dict[str, Any], count: int = 8, **overrides: Any) -> list[dict[str, Any]]:
    return [
        {"index": i, "uuid": f"GPU-{i:04d}", "healthy": True, **model, **overrides}
        for i in range(count)
    ]


def node_input(node_id: str, **fields: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "id": node_id,
        "hostname": f"{node_id}.cluster.local",
        "mgmtAddr": "10.0.0.7",
        "gpus": gpus(H100),
    }
    report.update(fields)
    return report


# Allocation and placement, as a scheduler sends them.

ALLOCATE = """
mutation Allocate($input: AllocateInput!) {
  allocate(input: $input) {
    __typename
    ... on Allocated { allocations { shardId replicaId nodeId gpuIndices fabric hcas createdAt } }
    ... on AllocationRejected { code message nodeId gpuIndex heldBy }
  }
}
"""

PLACE = """
mutation Place($input: PlaceInput!) {
  place(input: $input) {
    __typename
    ... on Allocated { allocations { shardId replicaId nodeId gpuIndices fabric hcas } }
    ... on Unplaceable { message verdicts { nodeId code detail } verdictsOmitted }
    ... on AllocationRejected { code message nodeId gpuIndex heldBy }
  }
}
"""

EXPLAIN = """
query Explain($input: PlaceInput!) {
  explainPlacement(input: $input) {
    placeable message fabric plan { shardId nodeId gpuCount }
    verdicts { nodeId code detail } verdictsOmitted
  }
}
"""


def shard(shard_id: str, node_id: str, *indices: int) -> dict[str, Any]:
    return {"shardId": shard_id, "nodeId": node_id, "gpuIndices": list(indices)}


def allocation(replica_id: str, *shards: dict[str, Any]) -> dict[str, Any]:
    return {"input": {"replicaId": replica_id, "shards": list(shards)}}


def placement(replica_id: str, gpu_class: str = "H100-80GB", **fields: Any) -> dict[str, Any]:
    return {"input": {"replicaId": replica_id, "gpuClass": gpu_class, **fields}}
