"""The node's report: everything discovered, as the contract's `NodeInput`.

"Nothing reported" means "unknown" to the service, so this module leaves a
field out rather than send an empty or zero stand-in: no model directories
means no storage and no weights (the node was not asked to look), while
directories that exist but hold no models send `weights: []` (it looked and
found none).
"""

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

from agent import __version__
from agent.config import AgentConfig
from agent.discovery.engines import engine_versions
from agent.discovery.fabrics import discover_fabrics, hca_discovery
from agent.discovery.gpu_file import GpuFile
from agent.discovery.gpus import Gpu, discover_gpus, load_nvml
from agent.discovery.identity import BOOT_ID, read_boot_id
from agent.discovery.memory import read_meminfo
from agent.discovery.resets import ResetWatch
from agent.discovery.rootfs import host_path
from agent.discovery.storage import (
    DeviceFigures,
    SpaceFigures,
    discover_storage,
    present_model_dirs,
)
from agent.discovery.topology import discover_topology
from agent.discovery.weights import Weights, WeightsScanner
from agent.discovery.weights_state import WeightsStatus

FREE_SPACE_STEP = 1 << 30
# When each block was observed (the agent's clock): not content. The same
# hardware seen a minute later is the same report, and goes out with the
# periodic full report, which carries the newer times.
OBSERVED_AT = ("gpusObservedAt", "fabricsObservedAt", "storageObservedAt")


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Host:
    """The process edges discovery reads through, other than files under the root."""

    # The pynvml module, a stand-in with its names, or None (not installed).
    nvml: Any | None
    statvfs: Callable[[str], SpaceFigures] = os.statvfs
    stat: Callable[[str], DeviceFigures] = os.stat
    version_of: Callable[[str], str] = version
    # The wall clock observedAt times are read from.
    clock: Callable[[], datetime] = utc_now
    # GPU resets seen between scans, owed to the service (agent/discovery/resets.py).
    resets: ResetWatch = field(default_factory=ResetWatch)

    @classmethod
    def this_machine(cls) -> "Host":
        return cls(nvml=load_nvml())


@dataclass(frozen=True)
class Report:
    # The registerNode input, with the contract's field names.
    node_input: dict[str, Any]
    # What discovery could not see, for the operator.
    warnings: tuple[str, ...] = field(default=())

    @property
    def digest(self) -> str:
        """A hash of everything in the report but free space (`changed_since` weighs it) and times."""
        steady = json.loads(json.dumps(self.node_input))
        for key in OBSERVED_AT:
            steady.pop(key, None)
        for fs in steady.get("storage", []):
            fs.pop("freeBytes", None)
        # When weights were seen is not what they are: unchanged weights seen
        # again add nothing (the next full report carries the new time).
        for w in steady.get("weights", []):
            w.pop("observedAt", None)
        text = json.dumps(steady, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def free_bytes(self) -> dict[str, int]:
        return {fs["id"]: fs["freeBytes"] for fs in self.node_input.get("storage", [])}

    def changed_since(self, sent: "Report | None") -> bool:
        """Whether this report says something `sent` did not, worth sending at once.

        Free space counts only when it moved by FREE_SPACE_STEP since it was
        sent: logs and caches move it by a few bytes every minute, and
        re-sending every node's report for that would load the service for
        nothing. A model downloaded or deleted moves it by gigabytes and goes
        out at once; the periodic full report carries the exact figure anyway.
        """
        if sent is None or self.digest != sent.digest:
            return True
        before = sent.free_bytes()
        return any(
            abs(free - before.get(fs_id, free)) >= FREE_SPACE_STEP
            for fs_id, free in self.free_bytes().items()
        )


def _weights_input(w: Weights, status: WeightsStatus, observed_at: str) -> dict[str, Any]:
    """A WeightsInput: what is not known is left out, which the service reads as unknown."""
    entry: dict[str, Any] = {"path": w.path, "sizeBytes": w.size_bytes}
    for key, value in (
        ("state", status.state),
        ("revision", status.revision),
        ("totalBytes", status.total_bytes),
        ("digest", status.digest),
    ):
        if value is not None:
            entry[key] = value
    entry["observedAt"] = observed_at
    return entry


def _gpu_input(gpu: Gpu, gpu_class: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": gpu.index, "name": gpu.name}
    if gpu.uuid is not None:
        entry["uuid"] = gpu.uuid
    if gpu.pci_bus_id is not None:
        entry["pciBusId"] = gpu.pci_bus_id
    # The service derives the class from name and memory; only an operator's
    # override is sent, so the mapping lives in one place.
    if gpu_class is not None:
        entry["gpuClass"] = gpu_class
    if gpu.memory_mb is not None:
        entry["memoryMb"] = gpu.memory_mb
    entry["healthy"] = gpu.healthy
    entry["healthReasons"] = list(gpu.health_reasons)
    # Topology: left out when unknown, which the service reads as unknown.
    if gpu.numa_node is not None:
        entry["numaNode"] = gpu.numa_node
    if gpu.nvlink_peers is not None:
        entry["nvlinkPeers"] = list(gpu.nvlink_peers)
    if gpu.nvlink_domain is not None:
        entry["nvlinkDomain"] = gpu.nvlink_domain
    if gpu.near_hcas is not None:
        entry["nearHcas"] = list(gpu.near_hcas)
    if gpu.recovery_action is not None:
        entry["recoveryAction"] = gpu.recovery_action
    return entry


def build_report(config: AgentConfig, host: Host, weights: WeightsScanner) -> Report:
    """Discover the node now. Never raises for what the node lacks: that becomes a warning."""
    warnings: list[str] = []
    warn = warnings.append
    root = config.root

    report: dict[str, Any] = {
        "id": config.node_id,
        "hostname": config.hostname,
        "mgmtAddr": config.mgmt_addr,
        "labels": [{"key": k, "value": v} for k, v in sorted(config.labels.items())],
    }
    boot_id = read_boot_id(root)
    if boot_id is None:
        warn(f"cannot read {BOOT_ID}: a reboot will not clear the GPUs' XID health")
    else:
        report["bootId"] = boot_id
    memory = read_meminfo(root)
    if memory is None:
        warn("cannot read MemTotal from /proc/meminfo: RAM not reported")
    else:
        report["memoryTotalMb"] = memory

    # Read before discovery starts: the facts found are at least this recent,
    # never stamped later than they were seen.
    hardware_seen = host.clock().isoformat()
    if isinstance(config.gpu_source, GpuFile):
        # NVML is not asked at all: the file replaces the driver, not adds to it.
        warn(config.gpu_source.warning())
        gpus = list(config.gpu_source.gpus)
    else:
        gpus = discover_gpus(host.nvml, root, config.engine_processes, warn)
        host.resets.observe((g.uuid, g.reset_marks) for g in gpus if g.reset_marks is not None)
    if isinstance(config.gpu_source, GpuFile) and config.gpu_source.fabrics is not None:
        # A demo or lab node: the file declares the adapters and their rate.
        fabrics = list(config.gpu_source.fabrics)
        report["hcaDiscovery"] = "LOOKED"
    else:
        fabrics = discover_fabrics(root, config.fabrics, warn)
        report["hcaDiscovery"] = hca_discovery(root, config.fabrics)
    if not isinstance(config.gpu_source, GpuFile):
        # Near HCAs are looked for among the adapters reported below only.
        hcas = [hca for a in fabrics for hca in a.hcas]
        gpus = discover_topology(host.nvml, root, gpus, hcas, warn)
    report["gpus"] = [_gpu_input(gpu, config.gpu_class) for gpu in gpus]
    report["gpusObservedAt"] = hardware_seen

    report["fabrics"] = [
        {"fabric": a.fabric, "hcas": list(a.hcas), "rateGbps": a.rate_gbps} for a in fabrics
    ]
    report["fabricsObservedAt"] = hardware_seen

    present = present_model_dirs(root, config.model_dirs, warn)
    if present:
        storage_seen = host.clock().isoformat()
        filesystems = discover_storage(
            root, present, config.shared_fs_types, warn, statvfs=host.statvfs, stat=host.stat
        )
        if filesystems:
            report["storage"] = [
                {
                    "id": fs.id,
                    "mountPoint": fs.mount_point,
                    "fsType": fs.fs_type,
                    "shared": fs.shared,
                    "freeBytes": fs.free_bytes,
                    "totalBytes": fs.total_bytes,
                    "directories": list(fs.directories),
                }
                for fs in filesystems
            ]
            report["storageObservedAt"] = storage_seen
        # Only directories that exist were looked in: with none of them
        # there, the node could not look, which is "unknown", not "none".
        found = weights.scan(present, warn)
        statuses = weights.judge.judge_all(
            [(w.path, str(host_path(root, w.path)), w.size_bytes) for w in found], warn
        )
        observed_at = datetime.now(UTC).isoformat()
        report["weights"] = [
            _weights_input(w, status, observed_at)
            for w, status in zip(found, statuses, strict=True)
        ]

    report["agentVersion"] = __version__
    report["engineVersions"] = [
        {"key": k, "value": v} for k, v in sorted(engine_versions(host.version_of).items())
    ]
    return Report(report, tuple(warnings))
