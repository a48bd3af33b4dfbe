"""GraphQL inputs and their translation into the domain's report."""

from __future__ import annotations

from datetime import datetime

import strawberry

from service.fleet.health.policy import DriverRecoveryAction
from service.fleet.node_reads import NodeFilter as NodeFilterRecord
from service.fleet.reports import (
    FabricReport,
    FilesystemReport,
    GpuReport,
    HcaDiscovery,
    NodeReport,
    WeightsReport,
)
from service.scheduling.weights_lifecycle import WeightsState

from .scalars import Bytes
from .types import NodeState


@strawberry.input
class KeyValueInput:
    key: str
    value: str


@strawberry.input
class GpuInput:
    index: int
    uuid: str | None = None
    pci_bus_id: str | None = strawberry.field(
        default=None, description="The driver's PCI bus id, e.g. 00000000:18:00.0."
    )
    name: str
    gpu_class: str | None = strawberry.field(
        default=None, description="Optional override; derived from name and memory when absent."
    )
    memory_mb: int | None = None
    healthy: bool = strawberry.field(
        description=(
            "False when the GPU must not be scheduled. true with any healthReasons is refused "
            "(BAD_INPUT naming healthReasons): a report cannot be healthy and faulty at once."
        )
    )
    health_reasons: list[str] | None = strawberry.field(
        default=None,
        description=(
            "Why the GPU is unhealthy (only with healthy: false), e.g. ecc_uncorrected, "
            "row_remap_pending, row_remap_failed, retired_pages_pending, foreign_process, "
            "nvml_error. Open text: a reason this service does not know is stored as sent, "
            "because a newer agent may know more faults than the service."
        ),
    )
    xids: list[int] | None = strawberry.field(
        default=None,
        description="Critical XID errors the driver raised for this GPU since the last report.",
    )
    # Topology (contract-topology.graphql); null is "unknown", never "none".
    numa_node: int | None = strawberry.field(
        default=None, description="The NUMA node the GPU is attached to."
    )
    nvlink_peers: list[int] | None = strawberry.field(
        default=None,
        description=(
            "Indices of the GPUs on this node that this one reaches over NVLink, directly or "
            "through NVSwitch. Null: unknown; empty: none (PCIe only)."
        ),
    )
    nvlink_domain: str | None = strawberry.field(
        default=None,
        description=(
            "The multi-node NVLink domain the GPU belongs to (NVML GPU fabric info: cluster UUID "
            "and clique id, written 'uuid/clique'). Null: none or unknown."
        ),
    )
    near_hcas: list[str] | None = strawberry.field(
        default=None,
        description=(
            "The node's adapters under the same PCIe switch as this GPU (nvidia-smi topo PIX or "
            "PXB): its rail-aligned HCAs. Null: unknown."
        ),
    )
    recovery_action: DriverRecoveryAction | None = strawberry.field(
        default=None,
        description=(
            "The driver's recovery action (NVML field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): what "
            "an XID 154 asks for. Null: unknown (an older driver or agent)."
        ),
    )
    reset_seen: str | None = strawberry.field(
        default=None,
        description=(
            'How the agent saw this GPU reset since its last report (e.g. "the pending row '
            'remap was applied"); null: it saw none. Like a reboot for the whole node, it '
            "carries out the GPU's open RESET_GPU remediations: they wait for validation."
        ),
    )


@strawberry.input
class FabricInput:
    fabric: str
    hcas: list[str]
    rate_gbps: int


@strawberry.input
class FilesystemInput:
    id: str
    mount_point: str
    fs_type: str | None = None
    shared: bool
    free_bytes: Bytes
    total_bytes: Bytes
    directories: list[str] | None = None


@strawberry.input
class WeightsInput:
    path: str = strawberry.field(description="Absolute path of the weights directory.")
    size_bytes: Bytes | None = strawberry.field(default=None, description="Bytes present.")
    revision: str | None = None
    state: WeightsState | None = strawberry.field(
        default=None, description="Null: present, state unknown (an agent that does not say)."
    )
    total_bytes: Bytes | None = strawberry.field(
        default=None, description="Bytes when complete; sizeBytes may not exceed it."
    )
    digest: str | None = strawberry.field(default=None, description="sha256:<64 hex>.")
    observed_at: datetime | None = strawberry.field(
        default=None,
        description=(
            "When the agent saw the weights so (its clock, with a UTC offset). Later than the "
            "service's receive time by more than INVENTORY_CLOCK_SKEW: BAD_INPUT."
        ),
    )


@strawberry.input
class NodeInput:
    id: strawberry.ID
    hostname: str
    mgmt_addr: str
    labels: list[KeyValueInput] | None = None
    memory_total_mb: int | None = None
    gpus: list[GpuInput]
    fabrics: list[FabricInput] | None = None
    storage: list[FilesystemInput] | None = strawberry.field(
        default=None,
        description="Null or empty: nothing known about disk (an old agent, or no model directories).",
    )
    weights: list[WeightsInput] | None = strawberry.field(
        default=None, description="Null or empty: the node was not asked to look."
    )
    agent_version: str | None = None
    engine_versions: list[KeyValueInput] | None = None
    boot_id: str | None = strawberry.field(
        default=None,
        description=(
            "The kernel's boot id (/proc/sys/kernel/random/boot_id). A new one means the node "
            "rebooted, so its GPUs were reset."
        ),
    )
    hca_discovery: HcaDiscovery | None = strawberry.field(
        default=None,
        description=(
            "Whether the agent looked for InfiniBand adapters (LOOKED, NO_INFINIBAND) or was not "
            "asked to (NOT_ASKED: its HCAs are unknown, not missing). Null: an agent that does "
            "not say; its HCAs count as looked for only when it reports at least one."
        ),
    )
    sent_at: datetime | None = strawberry.field(
        default=None,
        description=(
            "When the agent sent this report, by its clock. Differing from the service's receive "
            "time by more than INVENTORY_CLOCK_SKEW, it shifts every observedAt by the difference "
            "(Node.observedAtCorrection says so)."
        ),
    )
    gpus_observed_at: datetime | None = strawberry.field(
        default=None,
        description=(
            "When the agent observed the GPUs, by its clock (corrected by sentAt). Later than "
            "the service's receive time by more than the skew: BAD_INPUT. Null: the receive time."
        ),
    )
    fabrics_observed_at: datetime | None = strawberry.field(
        default=None, description="When the agent observed the fabrics; as gpusObservedAt."
    )
    storage_observed_at: datetime | None = strawberry.field(
        default=None, description="When the agent observed storage; as gpusObservedAt."
    )

    def to_report(self, clock_skew: float) -> NodeReport:
        return NodeReport(
            id=str(self.id),
            hostname=self.hostname,
            mgmt_addr=self.mgmt_addr,
            labels=tuple((kv.key, kv.value) for kv in self.labels or ()),
            memory_total_mb=self.memory_total_mb,
            gpus=tuple(
                GpuReport(
                    index=g.index,
                    uuid=g.uuid,
                    pci_bus_id=g.pci_bus_id,
                    name=g.name,
                    gpu_class=g.gpu_class,
                    memory_mb=g.memory_mb,
                    healthy=g.healthy,
                    health_reasons=tuple(g.health_reasons or ()),
                    numa_node=g.numa_node,
                    nvlink_peers=None if g.nvlink_peers is None else tuple(g.nvlink_peers),
                    nvlink_domain=g.nvlink_domain,
                    near_hcas=None if g.near_hcas is None else tuple(g.near_hcas),
                    xids=tuple(g.xids or ()),
                    recovery_action=None if g.recovery_action is None else g.recovery_action.value,
                    reset_seen=g.reset_seen,
                )
                for g in self.gpus
            ),
            fabrics=tuple(
                FabricReport(fabric=f.fabric, hcas=tuple(f.hcas), rate_gbps=f.rate_gbps)
                for f in self.fabrics or ()
            ),
            storage=tuple(
                FilesystemReport(
                    id=fs.id,
                    mount_point=fs.mount_point,
                    fs_type=fs.fs_type,
                    shared=fs.shared,
                    free_bytes=fs.free_bytes,
                    total_bytes=fs.total_bytes,
                    directories=tuple(fs.directories or ()),
                )
                for fs in self.storage or ()
            ),
            weights=tuple(
                WeightsReport(
                    path=w.path,
                    size_bytes=w.size_bytes,
                    revision=w.revision,
                    state=None if w.state is None else w.state.value,
                    total_bytes=w.total_bytes,
                    digest=w.digest,
                    observed_at=w.observed_at,
                )
                for w in self.weights or ()
            ),
            agent_version=self.agent_version,
            engine_versions=tuple((kv.key, kv.value) for kv in self.engine_versions or ()),
            boot_id=None if self.boot_id is None else str(self.boot_id),
            hca_discovery=None if self.hca_discovery is None else self.hca_discovery.value,
            sent_at=self.sent_at,
            gpus_observed_at=self.gpus_observed_at,
            fabrics_observed_at=self.fabrics_observed_at,
            storage_observed_at=self.storage_observed_at,
            clock_skew=clock_skew,
        )


@strawberry.input
class NodeFilter:
    state: NodeState | None = None
    schedulable: bool | None = None
    fabric: str | None = None
    gpu_class: str | None = None
    label: KeyValueInput | None = None
    has_weights: str | None = strawberry.field(
        default=None,
        description=(
            "Nodes that hold exactly this weights path. A node that was not asked to look "
            "(no weights reported) is not excluded."
        ),
    )
    min_local_disk_free: Bytes | None = strawberry.field(
        default=None,
        description=(
            "Nodes whose local disk has at least this much free. A node whose disk is "
            "unknown is not excluded."
        ),
    )

    def to_record(self) -> NodeFilterRecord:
        return NodeFilterRecord(
            state=self.state.value if self.state is not None else None,
            schedulable=self.schedulable,
            fabric=self.fabric,
            gpu_class=self.gpu_class,
            label=(self.label.key, self.label.value) if self.label is not None else None,
            has_weights=self.has_weights,
            min_local_disk_free=self.min_local_disk_free,
        )
