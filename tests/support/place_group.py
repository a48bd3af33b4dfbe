"""placeGroup, releaseGroup, fitGroup and explainPlacementGroup as schedulers send them, and a role of a group."""

from __future__ import annotations

from typing import Any

GROUP_FIELDS = """
groupId generation
members { role replicaId allocations { shardId nodeId gpuIndices fabric generation } }
kvPaths { from to kind }
"""


PLACE_GROUP = f"""
mutation P($input: PlaceGroupInput!) {{
  placeGroup(input: $input) {{
    __typename
    ... on GroupPlaced {{ {GROUP_FIELDS} }}
    ... on Unplaceable {{ message verdicts {{ nodeId code detail }} roles {{ role placeable message }} }}
    ... on AllocationRejected {{ code message }}
  }}
}}
"""


FIT_GROUP = "query F($g: PlaceGroupInput!) { fitGroup(group: $g) { groups limitedBy } }"


def role(
    name: str, replicas: int, gpus: int, cls: str = "H100-80GB", **shape: Any
) -> dict[str, Any]:
    return {
        "role": name,
        "replicas": replicas,
        "shape": {"replicaId": "x", "gpuClass": cls, "gpusPerShard": gpus, **shape},
    }


EXPLAIN_GROUP = """
query E($input: PlaceGroupInput!) {
  explainGroupPlacement(input: $input) {
    placeable message level zone
    members { role replicaId nodeIds }
    kvPaths { from to kind }
    roles { role placeable message verdicts { nodeId code } verdictsOmitted }
  }
}
"""
