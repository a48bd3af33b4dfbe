from datetime import datetime
from typing import Optional

from pydantic import Field

from .base_model import BaseModel
from .enums import (
    LocalityLevel,
    NodeState,
    PreemptionPolicy,
    TaintEffect,
    TolerationOperator,
)


class AllocateInput(BaseModel):
    replica_id: str = Field(alias="replicaId")
    shards: list["ShardInput"]
    generation: Optional[int] = None
    "When adding shards to an existing replica: its generation as last read (Allocation.generation). A replica that changed since is refused with GENERATION_CONFLICT, nothing written."
    tolerations: Optional[list["TolerationInput"]] = None
    "Taints the request tolerates: a GPU withheld by NO_SCHEDULE or NO_EXECUTE taints is offered only when every one of them is tolerated; tolerated PREFER_NO_SCHEDULE GPUs are not used last. A GPU withheld otherwise: GPU_TAINTED."
    tenant: Optional[str] = None
    "Charged to this tenant; a token bound to a tenant may only name its own (or none). Null: the token's tenant, else default."
    priority: Optional[int] = 0
    "Higher is more important; preemption only takes from lower. From -1000000 to 1000000."
    deployment: Optional[str] = None
    "Replicas of one deployment share a disruption budget."


class GroupLocalityInput(BaseModel):
    """How close a group's replicas should be: NODE closest, ANY no constraint. LABEL: nodes sharing the value of `label` (e.g. a rack or leaf-switch label) count as close."""

    level: LocalityLevel
    label: Optional[str] = None
    hard: bool = False


class GroupRoleInput(BaseModel):
    """One role of a group: `replicas` replicas of `shape` (PlaceInput as fit reads it: its replicaId names nothing)."""

    role: str
    replicas: int
    shape: "PlaceInput"


class KeyValueInput(BaseModel):
    key: str
    value: str


class NodeFilter(BaseModel):
    state: Optional[NodeState] = None
    schedulable: Optional[bool] = None
    fabric: Optional[str] = None
    gpu_class: Optional[str] = Field(alias="gpuClass", default=None)
    label: Optional["KeyValueInput"] = None
    has_weights: Optional[str] = Field(alias="hasWeights", default=None)
    "Nodes that hold exactly this weights path. A node that was not asked to look (no weights reported) is not excluded."
    min_local_disk_free: Optional[int] = Field(alias="minLocalDiskFree", default=None)
    "Nodes whose local disk has at least this much free. A node whose disk is unknown is not excluded."


class PlaceGroupInput(BaseModel):
    group_id: str = Field(alias="groupId")
    roles: list["GroupRoleInput"]
    locality: Optional["GroupLocalityInput"] = None
    kv_from: Optional[str] = Field(alias="kvFrom", default=None)
    "Which roles send KV cache to which, for kvPaths and the locality score (e.g. prefill -> decode)."
    kv_to: Optional[str] = Field(alias="kvTo", default=None)
    tenant: Optional[str] = None
    "Charged to this tenant; a token bound to a tenant may only name its own (or none). Null: the token's tenant, else default."
    priority: Optional[int] = 0
    "Higher is more important; preemption only takes from lower. From -1000000 to 1000000."
    deployment: Optional[str] = None
    "Replicas of one deployment share a disruption budget."
    preemption: Optional[PreemptionPolicy] = PreemptionPolicy.NEVER
    "For the whole group or not at all (see PreemptionPolicy)."


class PlaceInput(BaseModel):
    replica_id: str = Field(alias="replicaId")
    "Shards are named <replicaId>-s0, -s1, ..."
    gpu_class: str = Field(alias="gpuClass")
    "As gpuClasses names them, e.g. H100-80GB."
    shards: int = 1
    "How many shards; never split."
    gpus_per_shard: int = Field(alias="gpusPerShard")
    fabric: Optional[str] = None
    "Place only on nodes attached to this fabric."
    weights: Optional[str] = None
    "A weights path the nodes must hold; nodes that hold it are preferred (READY, then present without a state, then DOWNLOADING), nodes that were not asked to look are not excluded. The replica's shards pin it on their nodes until released."
    weights_ready: Optional[bool] = Field(alias="weightsReady", default=False)
    "Only nodes whose copy of `weights` is READY (verdict WEIGHTS_NOT_READY otherwise). Needs weights."
    min_local_disk_free: Optional[int] = Field(alias="minLocalDiskFree", default=None)
    "A node whose local disk is unknown is not excluded."
    label: Optional["KeyValueInput"] = None
    nvlink_shards: Optional[bool] = Field(alias="nvlinkShards", default=False)
    "Each shard's GPUs must lie in one NVLink group of its node. A node whose topology is unknown does not qualify."
    same_nvlink_domain: Optional[bool] = Field(alias="sameNvlinkDomain", default=False)
    "Every shard in one multi-node NVLink domain (e.g. one GB200 NVL72 rack)."
    rail_aligned: Optional[bool] = Field(alias="railAligned", default=False)
    "Every GPU of a shard must have a rail-aligned HCA on the chosen fabric; the shard is handed exactly those HCAs. Needs fabric."
    max_age: Optional[int] = Field(alias="maxAge", default=None)
    "Seconds: only nodes whose GPU facts (Node.gpusObservedAt) are at most this old; the others get the verdict FACTS_STALE. Negative: refused."
    tolerations: Optional[list["TolerationInput"]] = None
    "Taints the request tolerates: a GPU withheld by NO_SCHEDULE or NO_EXECUTE taints is offered only when every one of them is tolerated; tolerated PREFER_NO_SCHEDULE GPUs are not used last. A node short only of withheld GPUs: TAINTED."
    tenant: Optional[str] = None
    "Charged to this tenant; a token bound to a tenant may only name its own (or none). Null: the token's tenant, else default."
    priority: Optional[int] = 0
    "Higher is more important; preemption only takes from lower. From -1000000 to 1000000."
    deployment: Optional[str] = None
    "Replicas of one deployment share a disruption budget."
    preemption: Optional[PreemptionPolicy] = PreemptionPolicy.NEVER
    "Whether replicas may be stopped to make room (see PreemptionPolicy)."
    reservation: Optional[str] = None
    "Place into this reservation (its tenant only; only while it is ACTIVE or DEGRADED)."
    until: Optional[datetime] = None
    "The replica promises to be released by then: it may use GPUs set aside for a later window or on nodes whose maintenance starts later; if still placed at that time its shards are told to stop."


class ShardInput(BaseModel):
    shard_id: str = Field(alias="shardId")
    node_id: str = Field(alias="nodeId")
    gpu_indices: list[int] = Field(alias="gpuIndices")


class TolerationInput(BaseModel):
    """A toleration matches a taint with the same key (and value, for EQUAL); effect null matches every effect. tolerationSeconds: how long a NO_EXECUTE taint is tolerated."""

    key: str
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: Optional[str] = None
    effect: Optional[TaintEffect] = None
    toleration_seconds: Optional[int] = Field(alias="tolerationSeconds", default=None)


AllocateInput.model_rebuild()
GroupRoleInput.model_rebuild()
NodeFilter.model_rebuild()
PlaceGroupInput.model_rebuild()
PlaceInput.model_rebuild()
