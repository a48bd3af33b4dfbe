from datetime import datetime
from typing import Optional

from pydantic import Field

from .base_model import BaseModel
from .enums import (
    LocalityLevel,
    NodeState,
    TaintEffect,
    TolerationOperator,
    WeightsState,
)


class AllocateInput(BaseModel):
    replica_id: str = Field(alias="replicaId")
    shards: list["ShardInput"]
    generation: Optional[int] = None
    "When adding shards to an existing replica: its generation as last read (Allocation.generation). A replica that changed since is refused with GENERATION_CONFLICT, nothing written."
    tolerations: Optional[list["TolerationInput"]] = None
    "Taints the request tolerates: a GPU withheld by NO_SCHEDULE or NO_EXECUTE taints is offered only when every one of them is tolerated; tolerated PREFER_NO_SCHEDULE GPUs are not used last. A GPU withheld otherwise: GPU_TAINTED."


class FabricInput(BaseModel):
    fabric: str
    hcas: list[str]
    rate_gbps: int = Field(alias="rateGbps")


class FilesystemInput(BaseModel):
    id: str
    mount_point: str = Field(alias="mountPoint")
    fs_type: Optional[str] = Field(alias="fsType", default=None)
    shared: bool
    free_bytes: int = Field(alias="freeBytes")
    total_bytes: int = Field(alias="totalBytes")
    directories: Optional[list[str]] = None


class GpuInput(BaseModel):
    index: int
    uuid: Optional[str] = None
    pci_bus_id: Optional[str] = Field(alias="pciBusId", default=None)
    "The driver's PCI bus id, e.g. 00000000:18:00.0."
    name: str
    gpu_class: Optional[str] = Field(alias="gpuClass", default=None)
    "Optional override; derived from name and memory when absent."
    memory_mb: Optional[int] = Field(alias="memoryMb", default=None)
    healthy: bool
    "False when the GPU must not be scheduled. true with any healthReasons is refused (BAD_INPUT naming healthReasons): a report cannot be healthy and faulty at once."
    health_reasons: Optional[list[str]] = Field(alias="healthReasons", default=None)
    "Why the GPU is unhealthy (only with healthy: false), e.g. ecc_uncorrected, row_remap_pending, row_remap_failed, retired_pages_pending, foreign_process, nvml_error. Open text: a reason this service does not know is stored as sent, because a newer agent may know more faults than the service."
    xids: Optional[list[int]] = None
    "Critical XID errors the driver raised for this GPU since the last report."
    numa_node: Optional[int] = Field(alias="numaNode", default=None)
    "The NUMA node the GPU is attached to."
    nvlink_peers: Optional[list[int]] = Field(alias="nvlinkPeers", default=None)
    "Indices of the GPUs on this node that this one reaches over NVLink, directly or through NVSwitch. Null: unknown; empty: none (PCIe only)."
    nvlink_domain: Optional[str] = Field(alias="nvlinkDomain", default=None)
    "The multi-node NVLink domain the GPU belongs to (NVML GPU fabric info: cluster UUID and clique id, written 'uuid/clique'). Null: none or unknown."
    near_hcas: Optional[list[str]] = Field(alias="nearHcas", default=None)
    "The node's adapters under the same PCIe switch as this GPU (nvidia-smi topo PIX or PXB): its rail-aligned HCAs. Null: unknown."


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


class NodeInput(BaseModel):
    id: str
    hostname: str
    mgmt_addr: str = Field(alias="mgmtAddr")
    labels: Optional[list["KeyValueInput"]] = None
    memory_total_mb: Optional[int] = Field(alias="memoryTotalMb", default=None)
    gpus: list["GpuInput"]
    fabrics: Optional[list["FabricInput"]] = None
    storage: Optional[list["FilesystemInput"]] = None
    "Null or empty: nothing known about disk (an old agent, or no model directories)."
    weights: Optional[list["WeightsInput"]] = None
    "Null or empty: the node was not asked to look."
    agent_version: Optional[str] = Field(alias="agentVersion", default=None)
    engine_versions: Optional[list["KeyValueInput"]] = Field(
        alias="engineVersions", default=None
    )
    boot_id: Optional[str] = Field(alias="bootId", default=None)
    "The kernel's boot id (/proc/sys/kernel/random/boot_id). A new one means the node rebooted, so its GPUs were reset."
    sent_at: Optional[datetime] = Field(alias="sentAt", default=None)
    "When the agent sent this report, by its clock. Differing from the service's receive time by more than INVENTORY_CLOCK_SKEW, it shifts every observedAt by the difference (Node.observedAtCorrection says so)."
    gpus_observed_at: Optional[datetime] = Field(alias="gpusObservedAt", default=None)
    "When the agent observed the GPUs, by its clock (corrected by sentAt). Later than the service's receive time by more than the skew: BAD_INPUT. Null: the receive time."
    fabrics_observed_at: Optional[datetime] = Field(
        alias="fabricsObservedAt", default=None
    )
    "When the agent observed the fabrics; as gpusObservedAt."
    storage_observed_at: Optional[datetime] = Field(
        alias="storageObservedAt", default=None
    )
    "When the agent observed storage; as gpusObservedAt."


class PlaceGroupInput(BaseModel):
    group_id: str = Field(alias="groupId")
    roles: list["GroupRoleInput"]
    locality: Optional["GroupLocalityInput"] = None
    kv_from: Optional[str] = Field(alias="kvFrom", default=None)
    "Which roles send KV cache to which, for kvPaths and the locality score (e.g. prefill -> decode)."
    kv_to: Optional[str] = Field(alias="kvTo", default=None)


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


class RunningShardInput(BaseModel):
    """A shard an engine on this node runs, with the fence it was started with."""

    shard_id: str = Field(alias="shardId")
    fence: int


class ShardInput(BaseModel):
    shard_id: str = Field(alias="shardId")
    node_id: str = Field(alias="nodeId")
    gpu_indices: list[int] = Field(alias="gpuIndices")


class TaintInput(BaseModel):
    key: str
    value: Optional[str] = None
    effect: TaintEffect
    reason: str


class TolerationInput(BaseModel):
    """A toleration matches a taint with the same key (and value, for EQUAL); effect null matches every effect. tolerationSeconds: how long a NO_EXECUTE taint is tolerated."""

    key: str
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: Optional[str] = None
    effect: Optional[TaintEffect] = None
    toleration_seconds: Optional[int] = Field(alias="tolerationSeconds", default=None)


class WeightsInput(BaseModel):
    path: str
    "Absolute path of the weights directory."
    size_bytes: Optional[int] = Field(alias="sizeBytes", default=None)
    "Bytes present."
    revision: Optional[str] = None
    state: Optional[WeightsState] = None
    "Null: present, state unknown (an agent that does not say)."
    total_bytes: Optional[int] = Field(alias="totalBytes", default=None)
    "Bytes when complete; sizeBytes may not exceed it."
    digest: Optional[str] = None
    "sha256:<64 hex>."
    observed_at: Optional[datetime] = Field(alias="observedAt", default=None)
    "When the agent saw the weights so (its clock, with a UTC offset). Later than the service's receive time by more than INVENTORY_CLOCK_SKEW: BAD_INPUT."


AllocateInput.model_rebuild()
GroupRoleInput.model_rebuild()
NodeFilter.model_rebuild()
NodeInput.model_rebuild()
PlaceGroupInput.model_rebuild()
PlaceInput.model_rebuild()
