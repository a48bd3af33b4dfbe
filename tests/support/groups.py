"""Placement groups' mutations and requests, as schedulers send them."""

from __future__ import annotations

from typing import Any

from service.scheduling.groups import GroupRequest, GroupRole, Locality, LocalityLevel
from service.scheduling.place_request import PlaceRequest

PLACE_GROUP = """
mutation P($input: PlaceGroupInput!) {
  placeGroup(input: $input) {
    __typename
    ... on GroupPlaced { groupId members { replicaId allocations { nodeId gpuIndices } } }
    ... on Unplaceable { message }
    ... on AllocationRejected { code message }
  }
}
"""


RELEASE_GROUP = "mutation R($id: ID!) { releaseGroup(groupId: $id) }"


def role(name: str, replicas: int, per: int, **shape: Any) -> dict[str, Any]:
    return {
        "role": name,
        "replicas": replicas,
        "shape": {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": per, **shape},
    }


def request_of(spec: dict[str, Any], group_id: str = "fit") -> GroupRequest:
    """A group spec of these tests as the domain takes it (what PlaceGroupInput.to_request makes)."""

    def shape(s: dict[str, Any]) -> PlaceRequest:
        return PlaceRequest(
            "",
            s["gpuClass"],
            s["gpusPerShard"],
            shards=s.get("shards", 1),
            fabric=s.get("fabric"),
            nvlink_shards=s.get("nvlinkShards", False),
        )

    locality = spec.get("locality", {})
    return GroupRequest(
        group_id,
        tuple(GroupRole(r["role"], r["replicas"], shape(r["shape"])) for r in spec["roles"]),
        Locality(LocalityLevel(locality.get("level", "ANY")), None, locality.get("hard", False)),
        spec.get("kvFrom"),
        spec.get("kvTo"),
    )
