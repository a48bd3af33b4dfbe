from collections.abc import AsyncIterator
from typing import Any, Optional, Union

from .allocate import (
    Allocate,
    AllocateAllocateAllocated,
    AllocateAllocateAllocationRejected,
)
from .allocations import Allocations, AllocationsAllocations
from .async_base_client import AsyncBaseClient
from .base_model import UNSET, UnsetType
from .events import Events, EventsEvents
from .explain_group_placement import (
    ExplainGroupPlacement,
    ExplainGroupPlacementExplainGroupPlacement,
)
from .explain_placement import ExplainPlacement, ExplainPlacementExplainPlacement
from .fit import Fit, FitFit
from .fit_group import FitGroup, FitGroupFitGroup
from .free_gpus import FreeGpus, FreeGpusFreeGpus
from .free_gpus_compiled import FreeGpusCompiled, FreeGpusCompiledFreeGpus
from .gpu_classes import GpuClasses, GpuClassesGpuClasses
from .group import Group, GroupGroup
from .input_types import (
    AllocateInput,
    NodeFilter,
    PlaceGroupInput,
    PlaceInput,
    TolerationInput,
)
from .node import Node, NodeNode
from .nodes import Nodes, NodesNodes
from .nodes_compiled import NodesCompiled, NodesCompiledNodes
from .place import (
    Place,
    PlacePlaceAllocated,
    PlacePlaceAllocationRejected,
    PlacePlaceUnplaceable,
)
from .place_group import (
    PlaceGroup,
    PlaceGroupPlaceGroupAllocationRejected,
    PlaceGroupPlaceGroupGroupPlaced,
    PlaceGroupPlaceGroupUnplaceable,
)
from .release_group import ReleaseGroup
from .release_replica import ReleaseReplica
from .scale_group import (
    ScaleGroup,
    ScaleGroupScaleGroupAllocationRejected,
    ScaleGroupScaleGroupGroupPlaced,
    ScaleGroupScaleGroupUnplaceable,
)
from .shards_to_move import ShardsToMove, ShardsToMoveShardsToMove


def gql(q: str) -> str:
    return q


class Client(AsyncBaseClient):
    async def allocate(
        self, input: AllocateInput, **kwargs: Any
    ) -> Union[AllocateAllocateAllocated, AllocateAllocateAllocationRejected]:
        query = gql("""
            mutation allocate($input: AllocateInput!) {
              allocate(input: $input) {
                __typename
                ... on Allocated {
                  allocations {
                    shardId
                    replicaId
                    nodeId
                    gpuIndices
                    fabric
                    hcas
                    fence
                    generation
                    createdAt
                    heldSince
                  }
                }
                ... on AllocationRejected {
                  code
                  message
                  nodeId
                  gpuIndex
                  heldBy
                }
              }
            }
            """)
        variables: dict[str, object] = {"input": input}
        response = await self.execute(
            query=query, operation_name="allocate", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return Allocate.model_validate(data).allocate

    async def allocations(
        self,
        node_id: Union[Optional[str], UnsetType] = UNSET,
        replica_id: Union[Optional[str], UnsetType] = UNSET,
        first: Union[Optional[int], UnsetType] = UNSET,
        after: Union[Optional[str], UnsetType] = UNSET,
        held: Union[Optional[bool], UnsetType] = UNSET,
        **kwargs: Any,
    ) -> list[AllocationsAllocations]:
        query = gql("""
            query allocations($nodeId: ID, $replicaId: ID, $first: Int, $after: ID, $held: Boolean) {
              allocations(
                nodeId: $nodeId
                replicaId: $replicaId
                first: $first
                after: $after
                held: $held
              ) {
                shardId
                replicaId
                nodeId
                gpuIndices
                fabric
                hcas
                fence
                generation
                createdAt
                heldSince
              }
            }
            """)
        variables: dict[str, object] = {
            "nodeId": node_id,
            "replicaId": replica_id,
            "first": first,
            "after": after,
            "held": held,
        }
        response = await self.execute(
            query=query, operation_name="allocations", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return Allocations.model_validate(data).allocations

    async def events(
        self,
        node_id: Union[Optional[str], UnsetType] = UNSET,
        replica_id: Union[Optional[str], UnsetType] = UNSET,
        kinds: Union[Optional[list[str]], UnsetType] = UNSET,
        after: Union[Optional[str], UnsetType] = UNSET,
        **kwargs: Any,
    ) -> AsyncIterator[EventsEvents]:
        query = gql("""
            subscription events($nodeId: ID, $replicaId: ID, $kinds: [String!], $after: ID) {
              events(nodeId: $nodeId, replicaId: $replicaId, kinds: $kinds, after: $after) {
                id
                at
                kind
                nodeId
                replicaId
                shardId
                actor
                reason
                detail
              }
            }
            """)
        variables: dict[str, object] = {
            "nodeId": node_id,
            "replicaId": replica_id,
            "kinds": kinds,
            "after": after,
        }
        async for data in self.execute_ws(
            query=query, operation_name="events", variables=variables, **kwargs
        ):
            yield Events.model_validate(data).events

    async def explain_group_placement(
        self, input: PlaceGroupInput, **kwargs: Any
    ) -> ExplainGroupPlacementExplainGroupPlacement:
        query = gql("""
            query explainGroupPlacement($input: PlaceGroupInput!) {
              explainGroupPlacement(input: $input) {
                placeable
                message
                level
                zone
                members {
                  role
                  replicaId
                  nodeIds
                  fabric
                }
                kvPaths {
                  from
                  to
                  kind
                }
                roles {
                  role
                  placeable
                  message
                  verdicts {
                    nodeId
                    code
                    detail
                  }
                  verdictsOmitted
                }
              }
            }
            """)
        variables: dict[str, object] = {"input": input}
        response = await self.execute(
            query=query,
            operation_name="explainGroupPlacement",
            variables=variables,
            **kwargs,
        )
        data = self.get_data(response)
        return ExplainGroupPlacement.model_validate(data).explain_group_placement

    async def explain_placement(
        self, input: PlaceInput, **kwargs: Any
    ) -> ExplainPlacementExplainPlacement:
        query = gql("""
            query explainPlacement($input: PlaceInput!) {
              explainPlacement(input: $input) {
                placeable
                message
                fabric
                nvlinkDomain
                plan {
                  shardId
                  nodeId
                  gpuCount
                }
                verdicts {
                  nodeId
                  code
                  detail
                }
                verdictsOmitted
              }
            }
            """)
        variables: dict[str, object] = {"input": input}
        response = await self.execute(
            query=query,
            operation_name="explainPlacement",
            variables=variables,
            **kwargs,
        )
        data = self.get_data(response)
        return ExplainPlacement.model_validate(data).explain_placement

    async def fit(
        self,
        shape: PlaceInput,
        exclude_nodes: Union[Optional[list[str]], UnsetType] = UNSET,
        first: Union[Optional[int], UnsetType] = UNSET,
        **kwargs: Any,
    ) -> FitFit:
        query = gql("""
            query fit($shape: PlaceInput!, $excludeNodes: [ID!], $first: Int) {
              fit(shape: $shape, excludeNodes: $excludeNodes, first: $first) {
                replicas
                nodes {
                  nodeId
                  shards
                  gpus
                }
                nodesOmitted
                limitedBy {
                  code
                  nodes
                }
              }
            }
            """)
        variables: dict[str, object] = {
            "shape": shape,
            "excludeNodes": exclude_nodes,
            "first": first,
        }
        response = await self.execute(
            query=query, operation_name="fit", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return Fit.model_validate(data).fit

    async def fit_group(
        self, group: PlaceGroupInput, **kwargs: Any
    ) -> FitGroupFitGroup:
        query = gql("""
            query fitGroup($group: PlaceGroupInput!) {
              fitGroup(group: $group) {
                groups
                limitedBy
              }
            }
            """)
        variables: dict[str, object] = {"group": group}
        response = await self.execute(
            query=query, operation_name="fitGroup", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return FitGroup.model_validate(data).fit_group

    async def free_gpus(
        self,
        gpu_class: Union[Optional[str], UnsetType] = UNSET,
        fabric: Union[Optional[str], UnsetType] = UNSET,
        min_free: Union[Optional[int], UnsetType] = UNSET,
        first: Union[Optional[int], UnsetType] = UNSET,
        after: Union[Optional[str], UnsetType] = UNSET,
        max_age: Union[Optional[int], UnsetType] = UNSET,
        tolerations: Union[Optional[list[TolerationInput]], UnsetType] = UNSET,
        **kwargs: Any,
    ) -> list[FreeGpusFreeGpus]:
        query = gql("""
            query freeGpus($gpuClass: String, $fabric: String, $minFree: Int, $first: Int, $after: ID, $maxAge: Int, $tolerations: [TolerationInput!]) {
              freeGpus(
                gpuClass: $gpuClass
                fabric: $fabric
                minFree: $minFree
                first: $first
                after: $after
                maxAge: $maxAge
                tolerations: $tolerations
              ) {
                gpuIndices
                node {
                  id
                  labels {
                    key
                    value
                  }
                  fabrics {
                    fabric
                    hcas
                    rateGbps
                  }
                  localDisk {
                    freeBytes
                    totalBytes
                  }
                  largestFreeNvlinkGroup
                  nvlinkGroups
                }
              }
            }
            """)
        variables: dict[str, object] = {
            "gpuClass": gpu_class,
            "fabric": fabric,
            "minFree": min_free,
            "first": first,
            "after": after,
            "maxAge": max_age,
            "tolerations": tolerations,
        }
        response = await self.execute(
            query=query, operation_name="freeGpus", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return FreeGpus.model_validate(data).free_gpus

    async def free_gpus_compiled(
        self,
        gpu_class: Union[Optional[str], UnsetType] = UNSET,
        fabric: Union[Optional[str], UnsetType] = UNSET,
        min_free: Union[Optional[int], UnsetType] = UNSET,
        first: Union[Optional[int], UnsetType] = UNSET,
        after: Union[Optional[str], UnsetType] = UNSET,
        **kwargs: Any,
    ) -> list[FreeGpusCompiledFreeGpus]:
        query = gql("""
            query freeGpusCompiled($gpuClass: String, $fabric: String, $minFree: Int, $first: Int, $after: ID) {
              freeGpus(
                gpuClass: $gpuClass
                fabric: $fabric
                minFree: $minFree
                first: $first
                after: $after
              ) {
                gpuIndices
                node {
                  id
                  labels {
                    key
                    value
                  }
                  fabrics {
                    fabric
                    hcas
                    rateGbps
                  }
                  localDisk {
                    freeBytes
                    totalBytes
                  }
                  largestFreeNvlinkGroup
                  nvlinkGroups
                }
              }
            }
            """)
        variables: dict[str, object] = {
            "gpuClass": gpu_class,
            "fabric": fabric,
            "minFree": min_free,
            "first": first,
            "after": after,
        }
        response = await self.execute(
            query=query,
            operation_name="freeGpusCompiled",
            variables=variables,
            **kwargs,
        )
        data = self.get_data(response)
        return FreeGpusCompiled.model_validate(data).free_gpus

    async def gpu_classes(self, **kwargs: Any) -> list[GpuClassesGpuClasses]:
        query = gql("""
            query gpuClasses {
              gpuClasses {
                gpuClass
                total
                free
                allocated
                unhealthy
                unschedulable
                tainted
              }
            }
            """)
        variables: dict[str, object] = {}
        response = await self.execute(
            query=query, operation_name="gpuClasses", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return GpuClasses.model_validate(data).gpu_classes

    async def group(self, group_id: str, **kwargs: Any) -> Optional[GroupGroup]:
        query = gql("""
            query group($groupId: ID!) {
              group(groupId: $groupId) {
                groupId
                generation
                members {
                  role
                  replicaId
                  allocations {
                    shardId
                    replicaId
                    nodeId
                    gpuIndices
                    fabric
                    hcas
                    fence
                    generation
                    createdAt
                    heldSince
                  }
                }
                kvPaths {
                  from
                  to
                  kind
                }
              }
            }
            """)
        variables: dict[str, object] = {"groupId": group_id}
        response = await self.execute(
            query=query, operation_name="group", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return Group.model_validate(data).group

    async def node(self, id: str, **kwargs: Any) -> Optional[NodeNode]:
        query = gql("""
            query node($id: ID!) {
              node(id: $id) {
                id
                labels {
                  key
                  value
                }
                fabrics {
                  fabric
                  hcas
                  rateGbps
                }
                localDisk {
                  freeBytes
                  totalBytes
                }
                largestFreeNvlinkGroup
                nvlinkGroups
                hostname
                state
                stateReason
                schedulable
                lastSeen
                incarnation
                sharedDisk {
                  freeBytes
                  totalBytes
                }
                gpus {
                  index
                  name
                  gpuClass
                  memoryMb
                  healthy
                  healthReasons
                  cordonReason
                  numaNode
                  nvlinkGroup
                  nvlinkDomain
                  nearHcas
                  allocation {
                    shardId
                    replicaId
                  }
                }
                weights {
                  path
                  state
                  sizeBytes
                  totalBytes
                  pinnedBy
                }
              }
            }
            """)
        variables: dict[str, object] = {"id": id}
        response = await self.execute(
            query=query, operation_name="node", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return Node.model_validate(data).node

    async def nodes(
        self,
        filter_: Union[Optional[NodeFilter], UnsetType] = UNSET,
        first: Union[Optional[int], UnsetType] = UNSET,
        after: Union[Optional[str], UnsetType] = UNSET,
        max_age: Union[Optional[int], UnsetType] = UNSET,
        **kwargs: Any,
    ) -> list[NodesNodes]:
        query = gql("""
            query nodes($filter: NodeFilter, $first: Int, $after: ID, $maxAge: Int) {
              nodes(filter: $filter, first: $first, after: $after, maxAge: $maxAge) {
                id
                labels {
                  key
                  value
                }
                fabrics {
                  fabric
                  hcas
                  rateGbps
                }
                localDisk {
                  freeBytes
                  totalBytes
                }
                largestFreeNvlinkGroup
                nvlinkGroups
                hostname
                state
                stateReason
                schedulable
                lastSeen
                incarnation
                sharedDisk {
                  freeBytes
                  totalBytes
                }
                gpus {
                  index
                  name
                  gpuClass
                  memoryMb
                  healthy
                  healthReasons
                  cordonReason
                  numaNode
                  nvlinkGroup
                  nvlinkDomain
                  nearHcas
                  allocation {
                    shardId
                    replicaId
                  }
                }
                weights {
                  path
                  state
                  sizeBytes
                  totalBytes
                  pinnedBy
                }
              }
            }
            """)
        variables: dict[str, object] = {
            "filter": filter_,
            "first": first,
            "after": after,
            "maxAge": max_age,
        }
        response = await self.execute(
            query=query, operation_name="nodes", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return Nodes.model_validate(data).nodes

    async def nodes_compiled(
        self,
        filter_: Union[Optional[NodeFilter], UnsetType] = UNSET,
        first: Union[Optional[int], UnsetType] = UNSET,
        after: Union[Optional[str], UnsetType] = UNSET,
        **kwargs: Any,
    ) -> list[NodesCompiledNodes]:
        query = gql("""
            query nodesCompiled($filter: NodeFilter, $first: Int, $after: ID) {
              nodes(filter: $filter, first: $first, after: $after) {
                id
                labels {
                  key
                  value
                }
                fabrics {
                  fabric
                  hcas
                  rateGbps
                }
                localDisk {
                  freeBytes
                  totalBytes
                }
                largestFreeNvlinkGroup
                nvlinkGroups
                hostname
                state
                stateReason
                schedulable
                lastSeen
                incarnation
                sharedDisk {
                  freeBytes
                  totalBytes
                }
                gpus {
                  index
                  name
                  gpuClass
                  memoryMb
                  healthy
                  healthReasons
                  cordonReason
                  numaNode
                  nvlinkGroup
                  nvlinkDomain
                  nearHcas
                  allocation {
                    shardId
                    replicaId
                  }
                }
                weights {
                  path
                  state
                  sizeBytes
                  totalBytes
                  pinnedBy
                }
              }
            }
            """)
        variables: dict[str, object] = {
            "filter": filter_,
            "first": first,
            "after": after,
        }
        response = await self.execute(
            query=query, operation_name="nodesCompiled", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return NodesCompiled.model_validate(data).nodes

    async def place(
        self, input: PlaceInput, **kwargs: Any
    ) -> Union[
        PlacePlaceAllocated, PlacePlaceUnplaceable, PlacePlaceAllocationRejected
    ]:
        query = gql("""
            mutation place($input: PlaceInput!) {
              place(input: $input) {
                __typename
                ... on Allocated {
                  allocations {
                    shardId
                    replicaId
                    nodeId
                    gpuIndices
                    fabric
                    hcas
                    fence
                    generation
                    createdAt
                    heldSince
                  }
                }
                ... on Unplaceable {
                  message
                  verdicts {
                    nodeId
                    code
                    detail
                  }
                  verdictsOmitted
                  roles {
                    role
                    placeable
                    message
                  }
                }
                ... on AllocationRejected {
                  code
                  message
                  nodeId
                  gpuIndex
                  heldBy
                }
              }
            }
            """)
        variables: dict[str, object] = {"input": input}
        response = await self.execute(
            query=query, operation_name="place", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return Place.model_validate(data).place

    async def place_group(
        self, input: PlaceGroupInput, **kwargs: Any
    ) -> Union[
        PlaceGroupPlaceGroupGroupPlaced,
        PlaceGroupPlaceGroupUnplaceable,
        PlaceGroupPlaceGroupAllocationRejected,
    ]:
        query = gql("""
            mutation placeGroup($input: PlaceGroupInput!) {
              placeGroup(input: $input) {
                __typename
                ... on GroupPlaced {
                  groupId
                  generation
                  members {
                    role
                    replicaId
                    allocations {
                      shardId
                      replicaId
                      nodeId
                      gpuIndices
                      fabric
                      hcas
                      fence
                      generation
                      createdAt
                      heldSince
                    }
                  }
                  kvPaths {
                    from
                    to
                    kind
                  }
                }
                ... on Unplaceable {
                  message
                  verdicts {
                    nodeId
                    code
                    detail
                  }
                  verdictsOmitted
                  roles {
                    role
                    placeable
                    message
                  }
                }
                ... on AllocationRejected {
                  code
                  message
                  nodeId
                  gpuIndex
                  heldBy
                }
              }
            }
            """)
        variables: dict[str, object] = {"input": input}
        response = await self.execute(
            query=query, operation_name="placeGroup", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return PlaceGroup.model_validate(data).place_group

    async def release_group(
        self,
        group_id: str,
        generation: Union[Optional[int], UnsetType] = UNSET,
        **kwargs: Any,
    ) -> int:
        query = gql("""
            mutation releaseGroup($groupId: ID!, $generation: Int) {
              releaseGroup(groupId: $groupId, generation: $generation)
            }
            """)
        variables: dict[str, object] = {"groupId": group_id, "generation": generation}
        response = await self.execute(
            query=query, operation_name="releaseGroup", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return ReleaseGroup.model_validate(data).release_group

    async def release_replica(
        self,
        replica_id: str,
        generation: Union[Optional[int], UnsetType] = UNSET,
        **kwargs: Any,
    ) -> int:
        query = gql("""
            mutation releaseReplica($replicaId: ID!, $generation: Int) {
              releaseReplica(replicaId: $replicaId, generation: $generation)
            }
            """)
        variables: dict[str, object] = {
            "replicaId": replica_id,
            "generation": generation,
        }
        response = await self.execute(
            query=query, operation_name="releaseReplica", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return ReleaseReplica.model_validate(data).release_replica

    async def scale_group(
        self,
        group_id: str,
        role: str,
        replicas: int,
        shape: Union[Optional[PlaceInput], UnsetType] = UNSET,
        generation: Union[Optional[int], UnsetType] = UNSET,
        **kwargs: Any,
    ) -> Union[
        ScaleGroupScaleGroupGroupPlaced,
        ScaleGroupScaleGroupUnplaceable,
        ScaleGroupScaleGroupAllocationRejected,
    ]:
        query = gql("""
            mutation scaleGroup($groupId: ID!, $role: String!, $replicas: Int!, $shape: PlaceInput, $generation: Int) {
              scaleGroup(
                groupId: $groupId
                role: $role
                replicas: $replicas
                shape: $shape
                generation: $generation
              ) {
                __typename
                ... on GroupPlaced {
                  groupId
                  generation
                  members {
                    role
                    replicaId
                    allocations {
                      shardId
                      replicaId
                      nodeId
                      gpuIndices
                      fabric
                      hcas
                      fence
                      generation
                      createdAt
                      heldSince
                    }
                  }
                  kvPaths {
                    from
                    to
                    kind
                  }
                }
                ... on Unplaceable {
                  message
                  verdicts {
                    nodeId
                    code
                    detail
                  }
                  verdictsOmitted
                  roles {
                    role
                    placeable
                    message
                  }
                }
                ... on AllocationRejected {
                  code
                  message
                  nodeId
                  gpuIndex
                  heldBy
                }
              }
            }
            """)
        variables: dict[str, object] = {
            "groupId": group_id,
            "role": role,
            "replicas": replicas,
            "shape": shape,
            "generation": generation,
        }
        response = await self.execute(
            query=query, operation_name="scaleGroup", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return ScaleGroup.model_validate(data).scale_group

    async def shards_to_move(
        self,
        node_id: Union[Optional[str], UnsetType] = UNSET,
        first: Union[Optional[int], UnsetType] = UNSET,
        after: Union[Optional[str], UnsetType] = UNSET,
        **kwargs: Any,
    ) -> list[ShardsToMoveShardsToMove]:
        query = gql("""
            query shardsToMove($nodeId: ID, $first: Int, $after: ID) {
              shardsToMove(nodeId: $nodeId, first: $first, after: $after) {
                shardId
                allocation {
                  shardId
                  replicaId
                  nodeId
                  gpuIndices
                  fabric
                  hcas
                  fence
                  generation
                  createdAt
                  heldSince
                }
                stopBy
                overdue
                taint {
                  key
                  value
                  effect
                  source
                  reason
                  since
                }
              }
            }
            """)
        variables: dict[str, object] = {
            "nodeId": node_id,
            "first": first,
            "after": after,
        }
        response = await self.execute(
            query=query, operation_name="shardsToMove", variables=variables, **kwargs
        )
        data = self.get_data(response)
        return ShardsToMove.model_validate(data).shards_to_move
