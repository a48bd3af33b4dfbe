from datetime import datetime
from typing import Optional

from pydantic import Field

from .base_model import BaseModel
from .enums import KvPathKind, NodeState, RejectionCode, VerdictCode, WeightsState


class Allocation(BaseModel):
    shard_id: str = Field(alias="shardId")
    replica_id: str = Field(alias="replicaId")
    node_id: str = Field(alias="nodeId")
    gpu_indices: list[int] = Field(alias="gpuIndices")
    fabric: Optional[str]
    hcas: list[str]
    fence: int
    generation: int
    created_at: datetime = Field(alias="createdAt")
    held_since: Optional[datetime] = Field(alias="heldSince")


class Allocated(BaseModel):
    allocations: list["AllocatedAllocations"]


class AllocatedAllocations(Allocation):
    pass


class AllocationRejected(BaseModel):
    code: RejectionCode
    message: str
    node_id: Optional[str] = Field(alias="nodeId")
    gpu_index: Optional[int] = Field(alias="gpuIndex")
    held_by: Optional[str] = Field(alias="heldBy")


class GroupPlaced(BaseModel):
    group_id: str = Field(alias="groupId")
    generation: int
    members: list["GroupPlacedMembers"]
    kv_paths: list["GroupPlacedKvPaths"] = Field(alias="kvPaths")


class GroupPlacedMembers(BaseModel):
    role: str
    replica_id: str = Field(alias="replicaId")
    allocations: list["GroupPlacedMembersAllocations"]


class GroupPlacedMembersAllocations(Allocation):
    pass


class GroupPlacedKvPaths(BaseModel):
    from_: str = Field(alias="from")
    to: str
    kind: KvPathKind


class NodeSummary(BaseModel):
    id: str
    labels: list["NodeSummaryLabels"]
    fabrics: list["NodeSummaryFabrics"]
    local_disk: Optional["NodeSummaryLocalDisk"] = Field(alias="localDisk")
    largest_free_nvlink_group: Optional[int] = Field(alias="largestFreeNvlinkGroup")
    nvlink_groups: str = Field(alias="nvlinkGroups")


class NodeSummaryLabels(BaseModel):
    key: str
    value: str


class NodeSummaryFabrics(BaseModel):
    fabric: str
    hcas: list[str]
    rate_gbps: int = Field(alias="rateGbps")


class NodeSummaryLocalDisk(BaseModel):
    free_bytes: int = Field(alias="freeBytes")
    total_bytes: int = Field(alias="totalBytes")


class NodeDetails(NodeSummary):
    hostname: str
    state: NodeState
    state_reason: Optional[str] = Field(alias="stateReason")
    schedulable: bool
    last_seen: datetime = Field(alias="lastSeen")
    incarnation: int
    shared_disk: Optional["NodeDetailsSharedDisk"] = Field(alias="sharedDisk")
    gpus: list["NodeDetailsGpus"]
    weights: list["NodeDetailsWeights"]


class NodeDetailsSharedDisk(BaseModel):
    free_bytes: int = Field(alias="freeBytes")
    total_bytes: int = Field(alias="totalBytes")


class NodeDetailsGpus(BaseModel):
    index: int
    name: str
    gpu_class: str = Field(alias="gpuClass")
    memory_mb: Optional[int] = Field(alias="memoryMb")
    healthy: bool
    health_reasons: list[str] = Field(alias="healthReasons")
    cordon_reason: Optional[str] = Field(alias="cordonReason")
    numa_node: Optional[int] = Field(alias="numaNode")
    nvlink_group: Optional[int] = Field(alias="nvlinkGroup")
    nvlink_domain: Optional[str] = Field(alias="nvlinkDomain")
    near_hcas: Optional[list[str]] = Field(alias="nearHcas")
    allocation: Optional["NodeDetailsGpusAllocation"]


class NodeDetailsGpusAllocation(BaseModel):
    shard_id: str = Field(alias="shardId")
    replica_id: str = Field(alias="replicaId")


class NodeDetailsWeights(BaseModel):
    path: str
    state: Optional[WeightsState]
    size_bytes: Optional[int] = Field(alias="sizeBytes")
    total_bytes: Optional[int] = Field(alias="totalBytes")
    pinned_by: list[str] = Field(alias="pinnedBy")


class NodeFreeGpus(BaseModel):
    gpu_indices: list[int] = Field(alias="gpuIndices")
    node: "NodeFreeGpusNode"


class NodeFreeGpusNode(NodeSummary):
    pass


class PlacementVerdict(BaseModel):
    node_id: str = Field(alias="nodeId")
    code: VerdictCode
    detail: str


class Unplaceable(BaseModel):
    message: str
    verdicts: list["UnplaceableVerdicts"]
    verdicts_omitted: int = Field(alias="verdictsOmitted")
    roles: list["UnplaceableRoles"]


class UnplaceableVerdicts(PlacementVerdict):
    pass


class UnplaceableRoles(BaseModel):
    role: str
    placeable: bool
    message: str


Allocation.model_rebuild()
Allocated.model_rebuild()
AllocationRejected.model_rebuild()
GroupPlaced.model_rebuild()
NodeSummary.model_rebuild()
NodeDetails.model_rebuild()
NodeFreeGpus.model_rebuild()
PlacementVerdict.model_rebuild()
Unplaceable.model_rebuild()
