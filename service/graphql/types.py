"""The GraphQL object types: translations of the domain's records, nothing decided here."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from operator import attrgetter
from typing import Any, Final

import strawberry

from service.fleet import node_reads, topology
from service.fleet.health.policy import DriverRecoveryAction, RemediationAction
from service.fleet.node_details import FabricRecord, FilesystemRecord, GpuRecord, WeightsRecord
from service.fleet.node_reads import NodeRecord
from service.fleet.reports import Disk as DiskRecord
from service.fleet.reports import HcaDiscovery
from service.node_states import NodeState as NodeState
from service.scheduling.allocations import ShardRecord
from service.scheduling.availability import is_free
from service.scheduling.taints import Taint as TaintRecord
from service.scheduling.weights_lifecycle import WeightsState

from .context import Info
from .fencing_types import ShardToStop
from .health_types import (
    DriftFinding,
    Remediation,
    Taint,
    ValidationRequest,
    node_drift,
    node_taints,
    open_remediations,
    validations_to_run,
)
from .loaders import now_or_later
from .scalars import Bytes
from .tenancy_types import Charged

# The states' one home is service/node_states.py; the schema shows its enum as is.
strawberry.enum(NodeState)


@strawberry.type
class KeyValue:
    key: str
    value: str


def key_values(mapping: dict[str, str]) -> list[KeyValue]:
    return [KeyValue(key=k, value=v) for k, v in node_reads.by_key(mapping)]


@strawberry.type
class Disk:
    free_bytes: Bytes
    total_bytes: Bytes

    @classmethod
    def of(cls, disk: DiskRecord | None) -> Disk | None:
        return (
            None
            if disk is None
            else cls(free_bytes=Bytes(disk.free_bytes), total_bytes=Bytes(disk.total_bytes))
        )


@strawberry.type
class Allocation(Charged):
    """Also served by service.scheduling.allocations.ShardRecord itself, in a node's lists."""

    shard_id: strawberry.ID
    replica_id: strawberry.ID
    node_id: strawberry.ID
    gpu_indices: list[int]
    created_at: datetime
    fabric: str | None = strawberry.field(
        description="The fabric a multi-node replica was placed on; null for a single node."
    )
    hcas: list[str] = strawberry.field(
        description="This shard's adapters on that fabric: it is handed only these."
    )

    fence: int = strawberry.field(
        description=(
            "The fencing token this shard's engine is started with: from one sequence, so a "
            "later placement on the same GPU always carries a larger one."
        )
    )
    generation: int = strawberry.field(
        description=(
            "The replica's generation: it moves up with every change of the replica's shards. "
            "releaseReplica(generation:) naming another one is refused with code CONFLICT."
        )
    )
    held_since: datetime | None = strawberry.field(
        description=(
            "Since when this shard is held for its LOST node (INVENTORY_LOST_POLICY=hold): its "
            "GPUs stay allocated until the node confirms it or an operator frees it. Null "
            "otherwise."
        )
    )

    @classmethod
    def of(cls, shard: ShardRecord) -> Allocation:
        return cls(
            shard_id=strawberry.ID(shard.shard_id),
            replica_id=strawberry.ID(shard.replica_id),
            node_id=strawberry.ID(shard.node_id),
            gpu_indices=list(shard.gpu_indices),
            created_at=shard.created_at,
            fabric=shard.fabric,
            hcas=list(shard.hcas),
            fence=shard.fence,
            generation=shard.generation,
            held_since=shard.held_since,
            tenant=strawberry.ID(shard.tenant),
            priority=shard.priority,
            deployment=shard.deployment,
            borrowed=shard.borrowed,
        )


@strawberry.type
class Gpu:
    """Served by service.fleet.node_details.GpuRecord itself (see SERVED_BY_RECORDS).

    A 1,000-node page has 8,000 GPUs: copying each record into this class
    was an eighth of the page's CPU, for values that are the record's own.
    """

    index: int
    uuid: str | None
    pci_bus_id: str | None = strawberry.field(
        description="Where the card sits, e.g. 00000000:18:00.0: what an RMA names."
    )
    name: str = strawberry.field(description="As the driver names it, e.g. NVIDIA H100 80GB HBM3.")
    gpu_class: str = strawberry.field(
        description="Normalized model and memory, e.g. H100-80GB: what schedulers ask for."
    )
    memory_mb: int | None
    healthy: bool
    health_reasons: list[str] = strawberry.field(
        description=(
            "Why it is not healthy, e.g. ecc_uncorrected, foreign_process, or xid_79: a critical "
            "XID, kept until the GPU is reset (a new bootId, or clearGpuHealth). Empty when healthy."
        )
    )
    # The record's holding shard, read with the GPU: a plain field, not a
    # resolver call per GPU.
    shard: Allocation | None = strawberry.field(name="allocation", description="Null when free.")
    cordon_reason: str | None = strawberry.field(
        default=None,
        description=(
            "Why an operator took this one GPU out of placement; null when it is not cordoned. "
            "Survives re-registration."
        ),
    )
    sticky_reasons: list[str] = strawberry.field(
        default_factory=list,
        description=(
            "The healthReasons that outlive healthy reports (xid_<n>: a critical XID) until the "
            "GPU is reset: a new bootId, or clearGpuHealth."
        ),
    )
    # Topology (contract-topology.graphql): null is "the agent did not say".
    numa_node: int | None
    nvlink_peers: list[int] | None = strawberry.field(
        description="GPUs of this node reached over NVLink; empty: none (PCIe only); null: unknown."
    )
    nvlink_group: int | None = strawberry.field(
        description=(
            "The lowest index among the GPUs this one is connected to over NVLink on its node, "
            "itself included. Null when unknown."
        )
    )
    nvlink_domain: str | None = strawberry.field(
        description="The multi-node NVLink domain ('uuid/clique'); null: none or unknown."
    )
    near_hcas: list[str] | None = strawberry.field(
        description="Adapters under the GPU's PCIe switch (its rail-aligned HCAs); null: unknown."
    )
    taints: list[Taint] = strawberry.field(
        default_factory=list,
        description="The GPU's own taints (its node's are Node.taints); a cordon shows as one.",
    )
    recovery_action: DriverRecoveryAction | None = strawberry.field(
        default=None,
        description="The driver's recovery action as the agent last read it; null: unknown.",
    )
    recommended_action: RemediationAction = strawberry.field(
        default=RemediationAction.NONE,
        description=(
            "The action NVIDIA's XID catalog (or the driver's recovery action) recommends for "
            "this GPU's sticky faults; NONE when it has none."
        ),
    )


@strawberry.type
class FabricAttachment:
    """Served by service.fleet.node_details.FabricRecord itself (see SERVED_BY_RECORDS)."""

    fabric: str
    hcas: list[str]
    rate_gbps: int


@strawberry.type
class Filesystem:
    """Served by service.fleet.node_details.FilesystemRecord itself (see SERVED_BY_RECORDS)."""

    id: str = strawberry.field(
        description="Stable id of the filesystem on its node (e.g. its device number or fsid)."
    )
    mount_point: str
    fs_type: str | None
    shared: bool
    free_bytes: Bytes
    total_bytes: Bytes
    directories: list[str] = strawberry.field(
        description="The configured model directories that live on it."
    )


strawberry.enum(
    HcaDiscovery,
    description=(
        "Whether the agent looked for InfiniBand adapters: LOOKED (it was configured with "
        "fabrics and read /sys/class/infiniband), NO_INFINIBAND (configured, but the kernel "
        "shows no InfiniBand: no driver or no adapter), NOT_ASKED (no fabrics configured: the "
        "node's HCAs are unknown, and drift does not call them missing)."
    ),
)


# The domain's enum, registered as the GraphQL enum of the same name (its
# member names are the GraphQL values).
strawberry.enum(
    WeightsState,
    description=(
        "Where weights on a node stand, as its agent saw them (docs/scheduler/weights.md): "
        "DOWNLOADING (incomplete or still growing), READY (complete and verified), EVICTING "
        "(being deleted), FAILED (complete but its digest does not match)."
    ),
)


@strawberry.type
class Weights:
    """Served by service.fleet.node_details.WeightsRecord itself (see SERVED_BY_RECORDS)."""

    path: str
    size_bytes: Bytes | None = strawberry.field(description="Bytes present.")
    revision: str | None
    state: WeightsState | None = strawberry.field(
        description="Null: the agent did not say (present, state unknown)."
    )
    total_bytes: Bytes | None = strawberry.field(description="Bytes when complete.")
    digest: str | None
    observed_at: datetime | None = strawberry.field(
        description="When the agent saw the weights as they are (on the service's clock)."
    )
    pinned_by: list[str] = strawberry.field(
        description=(
            "Replica ids placed with these weights that have a shard on this node: the weights "
            "must stay until they are released."
        )
    )


def _as_loaded(records: list[Any]) -> list[Any]:
    # The records themselves: their types are served by records (SERVED_BY_RECORDS).
    return records


# By value, as NodeState(value) finds it without the enum's call on every
# heartbeat; an unknown value is a KeyError there.
_NODE_STATES: Final = {state.value: state for state in NodeState}
_HCA_DISCOVERY: Final = {d.value: d for d in HcaDiscovery}

# Each plain field of Node, by its Python name, as read from a NodeRecord: the
# one definition Node.of builds a Node from, and Node.read gives one of them
# to a caller that needs a few fields without building the rest (a node's
# labels, engine versions and disks were a twentieth of a heartbeat's CPU).
# Node.of fails on a field left out here.
_NODE_FIELDS: Final[dict[str, Callable[[NodeRecord], Any]]] = {
    # strawberry.ID is a NewType: the str itself, without a call.
    "id": attrgetter("id"),
    "hostname": attrgetter("hostname"),
    "mgmt_addr": attrgetter("mgmt_addr"),
    "labels": lambda node: key_values(node.labels),
    "memory_total_mb": attrgetter("memory_total_mb"),
    "state": lambda node: _NODE_STATES[node.state],
    "state_reason": attrgetter("state_reason"),
    "schedulable": attrgetter("schedulable"),
    "last_seen": attrgetter("last_seen"),
    "agent_version": attrgetter("agent_version"),
    "engine_versions": lambda node: key_values(node.engine_versions),
    "local_disk": lambda node: Disk.of(node.local_disk),
    "shared_disk": lambda node: Disk.of(node.shared_disk),
    "knows_its_weights": attrgetter("knows_its_weights"),
    "state_changed_by": attrgetter("state_actor"),
    "registered_at": attrgetter("registered_at"),
    "boot_id": attrgetter("boot_id"),
    "incarnation": attrgetter("incarnation"),
    "gpus_observed_at": attrgetter("gpus_observed_at"),
    "fabrics_observed_at": attrgetter("fabrics_observed_at"),
    "storage_observed_at": attrgetter("storage_observed_at"),
    "observed_at_correction": attrgetter("observed_at_correction"),
    "hca_discovery": lambda node: _HCA_DISCOVERY.get(node.hca_discovery or ""),
}


@strawberry.type
class Node:
    id: strawberry.ID
    hostname: str
    mgmt_addr: str
    labels: list[KeyValue]
    memory_total_mb: int | None = strawberry.field(
        description="RAM in MiB; null when the agent did not report it (no constraint)."
    )
    state: NodeState
    state_reason: str | None = strawberry.field(
        description="Why an operator cordoned or drained it, or why it became unreachable or lost."
    )
    schedulable: bool
    last_seen: datetime
    agent_version: str | None
    engine_versions: list[KeyValue]
    local_disk: Disk | None = strawberry.field(
        description=(
            "Space on filesystems this node fills itself (shared ones left out); "
            "null when nothing is known."
        )
    )
    shared_disk: Disk | None = strawberry.field(
        description="Space on shared filesystems this node mounts, reported apart; null when there are none."
    )
    knows_its_weights: bool = strawberry.field(
        description="False when the node was not asked to look for weights: it then constrains nothing."
    )
    state_changed_by: str | None = strawberry.field(
        description="Who cordoned or drained it, when an operator did."
    )
    registered_at: datetime
    boot_id: str | None = None
    gpus_observed_at: datetime | None = strawberry.field(
        default=None,
        description=(
            "When the agent last observed the GPUs, on the service's clock "
            "(see observedAtCorrection): what maxAge compares."
        ),
    )
    fabrics_observed_at: datetime | None = strawberry.field(
        default=None,
        description="When the agent last observed the fabrics, on the service's clock.",
    )
    storage_observed_at: datetime | None = strawberry.field(
        default=None, description="When the agent last observed storage, on the service's clock."
    )
    hca_discovery: HcaDiscovery | None = strawberry.field(
        default=None,
        description=(
            "Whether the agent looked for InfiniBand adapters. NOT_ASKED: the node's HCAs are "
            "unknown, so a hardware profile's hcaCount is not compared (no HCA_MISSING in drift). "
            "Null: an agent that does not say; its HCAs count as looked for only when it reports "
            "at least one."
        ),
    )
    observed_at_correction: str | None = strawberry.field(
        default=None,
        description=(
            "Why the last report's observedAt times were not taken as sent: the agent's clock "
            "differed from the service's by more than INVENTORY_CLOCK_SKEW (its sentAt shows by "
            "how much), and the times were shifted by that. Null: taken as sent."
        ),
    )

    @strawberry.field(
        description=(
            "What this node's engines must stop: of the runningShards the heartbeat or "
            "registerNode of this request sent, those the inventory does not hold for this node "
            "with that fence. Empty when none were sent."
        )
    )
    def shards_to_stop(self, info: Info) -> list[ShardToStop]:
        return [ShardToStop.of(s) for s in info.context.shards_to_stop.get(str(self.id), ())]

    @strawberry.field(
        graphql_type=list[Taint],
        description="The node's own taints, on all its GPUs; a cordon or drain shows as one.",
    )
    def taints(self, info: Info) -> Any:
        return node_taints(str(self.id), info)

    @strawberry.field(
        graphql_type=list[ValidationRequest],
        description=(
            "Validations the agent should run now (after a remediation), by test name: each test "
            "the policy requires that has not passed since the remediation began waiting."
        ),
    )
    def validations_to_run(self, info: Info) -> Any:
        return validations_to_run(str(self.id), info)

    @strawberry.field(
        graphql_type=list[DriftFinding],
        description=(
            "Where the node's report differs from its hardware profile; empty when it matches "
            "or no profile applies. What the report leaves unknown is not compared: HCAs when "
            "hcaDiscovery is NOT_ASKED, NVLink groups without peers, an unreported memory size."
        ),
    )
    def drift(self, info: Info) -> Any:
        return node_drift(str(self.id), info)

    @strawberry.field(
        graphql_type=list[Remediation],
        description=(
            "The node's open remediations (PENDING, IN_PROGRESS, AWAITING_VALIDATION), by id: "
            "gpuIndices says which of its GPUs each one is for."
        ),
    )
    def remediations(self, info: Info) -> Any:
        return open_remediations(str(self.id), info)

    incarnation: int = strawberry.field(
        default=1,
        description=(
            "Which life of the node this is: one more each time it comes back from LOST or "
            "reports a new bootId. Its agent sends the one it last saw with each heartbeat "
            "and report."
        ),
    )

    @classmethod
    def of(cls, node: NodeRecord) -> Node:
        return cls(**{name: read(node) for name, read in _NODE_FIELDS.items()})

    @staticmethod
    def read(python_name: str) -> Callable[[NodeRecord], Any] | None:
        """How Node.of reads one plain field from a record (None: not a plain field)."""
        return _NODE_FIELDS.get(python_name)

    # The detail fields answer synchronously from the request's loaders when
    # the root field prefetched them (loaders.prefetch_nodes), and return an
    # awaitable otherwise: graphql-core awaits only what is awaitable, and a
    # task per node on a 1,000-node page cost more than the page itself.

    @strawberry.field(graphql_type=list[Gpu])
    def gpus(self, info: Info) -> Any:
        return now_or_later(info.context.loaders.gpus, str(self.id), _as_loaded)

    @strawberry.field(
        description=(
            "GPUs a scheduler may take now (healthy, not cordoned, not held), "
            "optionally of one class."
        ),
        graphql_type=list[Gpu],
    )
    def free_gpus(self, info: Info, gpu_class: str | None = None) -> Any:
        def free(gpus: list[GpuRecord]) -> list[GpuRecord]:
            return [
                g for g in gpus if is_free(g) and (gpu_class is None or g.gpu_class == gpu_class)
            ]

        return now_or_later(info.context.loaders.gpus, str(self.id), free)

    @strawberry.field(
        description=(
            "The most free GPUs that lie in one NVLink group: the widest tensor-parallel shard "
            "this node can take now. Null when its topology is unknown."
        ),
        graphql_type=int | None,
    )
    def largest_free_nvlink_group(self, info: Info) -> Any:
        return now_or_later(info.context.loaders.gpus, str(self.id), topology.largest_free_group)

    @strawberry.field(
        description=(
            "The node's NVLink groups in words: 'NVLink 8' (one NVSwitch board), 'NVLink 2x4' "
            "(bridged pairs), 'none' (PCIe only), 'unknown' (not reported)."
        ),
        graphql_type=str,
    )
    def nvlink_groups(self, info: Info) -> Any:
        def words(gpus: list[GpuRecord]) -> str:
            return topology.describe_groups(topology.group_sizes(gpus))

        return now_or_later(info.context.loaders.gpus, str(self.id), words)

    @strawberry.field(graphql_type=list[FabricAttachment])
    def fabrics(self, info: Info) -> Any:
        return now_or_later(info.context.loaders.fabrics, str(self.id), _as_loaded)

    @strawberry.field(
        description="The adapters attached to one fabric: a shard is handed only these.",
        graphql_type=list[str],
    )
    def hcas_for(self, info: Info, fabric: str) -> Any:
        def hcas(attachments: list[FabricRecord]) -> list[str]:
            for attachment in attachments:
                if attachment.fabric == fabric:
                    return list(attachment.hcas)
            return []

        return now_or_later(info.context.loaders.fabrics, str(self.id), hcas)

    @strawberry.field(
        description="One entry per filesystem, not per directory.",
        graphql_type=list[Filesystem],
    )
    def storage(self, info: Info) -> Any:
        return now_or_later(info.context.loaders.filesystems, str(self.id), _as_loaded)

    @strawberry.field(graphql_type=list[Weights])
    def weights(self, info: Info) -> Any:
        return now_or_later(info.context.loaders.weights, str(self.id), _as_loaded)

    @strawberry.field(
        description=(
            "Exact path match. False for a node that was not asked to look; see knowsItsWeights."
        ),
        graphql_type=bool,
    )
    def has_weights(self, info: Info, source: str) -> Any:
        def has(weights: list[WeightsRecord]) -> bool:
            return any(w.path == source for w in weights)

        return now_or_later(info.context.loaders.weights, str(self.id), has)

    @strawberry.field(graphql_type=list[Allocation])
    def allocations(self, info: Info) -> Any:
        return now_or_later(info.context.loaders.shards_on_node, str(self.id), _as_loaded)


# GraphQL types whose values are the domain's records as they are: every field
# of the type is an attribute of the record under the field's Python name
# (tests/fast_path/test_plain_field_completion.py checks it), so nothing is copied.
SERVED_BY_RECORDS: dict[type, type] = {
    Gpu: GpuRecord,
    Allocation: ShardRecord,
    FabricAttachment: FabricRecord,
    Filesystem: FilesystemRecord,
    Weights: WeightsRecord,
    Taint: TaintRecord,
}
