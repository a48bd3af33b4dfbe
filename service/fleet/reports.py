"""A node's report as an agent sends it, and the checks it must pass before anything is written.

Field names in error messages are the API's (`gpus[2].index`), because that is
what the person reading the error sent.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields, is_dataclass, replace
from datetime import datetime
from enum import Enum
from typing import Any

from service.bounds import (
    MAX_BYTES,
    MAX_DIRECTORIES,
    MAX_ENGINE_VERSIONS,
    MAX_FABRICS,
    MAX_FILESYSTEMS,
    MAX_GPUS,
    MAX_HCAS,
    MAX_HEALTH_REASONS,
    MAX_ID_LENGTH,
    MAX_LABELS,
    MAX_MEMORY_MB,
    MAX_PATH_LENGTH,
    MAX_RATE_GBPS,
    MAX_TEXT_LENGTH,
    MAX_WEIGHTS,
    MAX_XIDS,
)
from service.errors import InvalidInput, TooManyEntries
from service.fleet import observed_at
from service.fleet.gpu_class import derive_gpu_class
from service.fleet.health.policy import RECOVERY_ACTIONS
from service.fleet.observed_at import AgentClock
from service.fleet.topology import check_topology
from service.scheduling.weights_lifecycle import DIGEST, STATES
from service.stored_text import text_problem


@dataclass(frozen=True)
class GpuReport:
    index: int
    name: str
    healthy: bool
    uuid: str | None = None
    pci_bus_id: str | None = None
    gpu_class: str | None = None
    memory_mb: int | None = None
    health_reasons: tuple[str, ...] = ()
    # Critical XIDs the driver raised since the last report (service/fleet/gpu_health.py).
    xids: tuple[int, ...] = ()
    # Topology (service.fleet.topology): None is "the agent did not say".
    numa_node: int | None = None
    nvlink_peers: tuple[int, ...] | None = None
    nvlink_domain: str | None = None
    near_hcas: tuple[str, ...] | None = None
    # The driver's recovery action (NVML: GPU_RESET, NODE_REBOOT...), None
    # when unknown: what an XID 154 asks for (service/fleet/health/policy.py).
    recovery_action: str | None = None
    # How the agent saw this GPU reset since its last report (None: it did
    # not): carries out its RESET_GPU remediations (service/fleet/gpu_health.py).
    reset_seen: str | None = None


class HcaDiscovery(Enum):
    """Whether the agent looked for InfiniBand adapters (NodeInput.hcaDiscovery).

    What drift may conclude from a report without HCAs (drift.findings):
    LOOKED (it was configured with fabrics and read /sys/class/infiniband)
    and NO_INFINIBAND (configured, but the kernel shows no InfiniBand at
    all) mean the adapters it did not report are not there; NOT_ASKED (no
    fabrics configured) means they are unknown.
    """

    LOOKED = "LOOKED"
    NO_INFINIBAND = "NO_INFINIBAND"
    NOT_ASKED = "NOT_ASKED"


@dataclass(frozen=True)
class FabricReport:
    fabric: str
    hcas: tuple[str, ...]
    rate_gbps: int


@dataclass(frozen=True)
class FilesystemReport:
    id: str
    mount_point: str
    shared: bool
    free_bytes: int
    total_bytes: int
    fs_type: str | None = None
    directories: tuple[str, ...] = ()


@dataclass(frozen=True)
class WeightsReport:
    path: str
    # Bytes present on disk.
    size_bytes: int | None = None
    revision: str | None = None
    # A WeightsState value ("ready", ...); None: the agent did not say
    # (present, state unknown).
    state: str | None = None
    # Bytes when complete.
    total_bytes: int | None = None
    # sha256:<64 hex>
    digest: str | None = None
    # When the agent saw the weights so: on the service's clock once settled
    # (settle_observed_at); not content, see _NOT_CONTENT.
    observed_at: datetime | None = None


@dataclass(frozen=True)
class NodeReport:
    id: str
    hostname: str
    mgmt_addr: str
    gpus: tuple[GpuReport, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    memory_total_mb: int | None = None
    fabrics: tuple[FabricReport, ...] = ()
    storage: tuple[FilesystemReport, ...] = ()
    weights: tuple[WeightsReport, ...] = ()
    agent_version: str | None = None
    engine_versions: tuple[tuple[str, str], ...] = ()
    # /proc/sys/kernel/random/boot_id: a new one says the node's GPUs were reset.
    boot_id: str | None = None
    # Whether the agent looked for HCAs (an HcaDiscovery value, kept as text
    # like every leaf of the digest); None from an agent that does not say.
    hca_discovery: str | None = None
    # When the agent sent the report and observed each block, by its clock;
    # when the service received it, by the service's, and the skew allowed
    # between the two (service/fleet/observed_at.py).
    sent_at: datetime | None = None
    gpus_observed_at: datetime | None = None
    fabrics_observed_at: datetime | None = None
    storage_observed_at: datetime | None = None
    received_at: datetime = field(default_factory=observed_at.now, compare=False)
    clock_skew: float = observed_at.DEFAULT_SKEW

    def digest(self) -> str:
        """Identifies the report's content, to skip rewriting a node that did not change."""
        canonical = json.dumps(_plain(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def fact_times(self) -> FactTimes:
        """When each block was observed, on the service's clock; raises InvalidInput (observed_at)."""
        clock = observed_at.agent_clock(self.sent_at, self.received_at, self.clock_skew)
        return FactTimes(
            gpus=clock.settle("input.gpusObservedAt", self.gpus_observed_at),
            fabrics=clock.settle("input.fabricsObservedAt", self.fabrics_observed_at),
            storage=clock.settle("input.storageObservedAt", self.storage_observed_at),
            correction=clock.correction,
        )


@dataclass(frozen=True)
class FactTimes:
    gpus: datetime
    fabrics: datetime
    storage: datetime
    # Why the agent's times were shifted (observed_at.AgentClock.correction); None: they were not.
    correction: str | None


def _plain(value: Any) -> Any:
    """The JSON-ready form dataclasses.asdict gives a report (so stored digests stay valid).

    asdict deep-copies every leaf on the way, which made the digest a tenth
    of a registration's CPU; a report holds only dataclasses, tuples and
    immutable leaves, so nothing needs copying. The field names of each
    report class are looked up once: is_dataclass and fields() per value were
    most of what was left.
    """
    kind = type(value)
    if kind in _LEAVES:
        return value
    if kind is tuple:
        return [_plain(item) for item in value]
    names = _FIELD_NAMES.get(kind)
    if names is None:
        if not is_dataclass(value) or isinstance(value, type):
            return [_plain(item) for item in value] if isinstance(value, tuple) else value
        names = _FIELD_NAMES[kind] = tuple(
            f.name for f in fields(value) if f.name not in _NOT_CONTENT
        )
    return {name: _plain(getattr(value, name)) for name in names}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
# What a report says happened rather than what the node is: XIDs are events
# (service/fleet/gpu_health.py handles them whatever the digest says), and the boot
# id is written with the node's row on every report. Left out, they do not
# make an otherwise unchanged report rewrite the node's hardware.
# Times (when the facts were observed, sent, received) are not content either:
# the same hardware observed a minute later is the same hardware.
_NOT_CONTENT = frozenset(
    {
        "xids",
        # A reset is an event like an XID.
        "reset_seen",
        "boot_id",
        "sent_at",
        "gpus_observed_at",
        "fabrics_observed_at",
        "storage_observed_at",
        "received_at",
        "clock_skew",
        # When weights were seen is not what they are: weights seen again
        # unchanged add nothing (their stored observedAt is when the agent
        # saw them as they are).
        "observed_at",
    }
)
_LEAVES = frozenset({str, int, bool, float, type(None)})


@dataclass(frozen=True)
class Disk:
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class DiskSums:
    """Local and shared space summed apart; None where nothing was reported."""

    local: Disk | None
    shared: Disk | None


def sum_disks(storage: tuple[FilesystemReport, ...]) -> DiskSums:
    # Shared filesystems never count as the node's own: twenty nodes mounting
    # one filer would each claim its free terabyte, and a scheduler would
    # place twenty models into room for one.
    local = [fs for fs in storage if not fs.shared]
    shared = [fs for fs in storage if fs.shared]

    def total(group: list[FilesystemReport]) -> Disk | None:
        if not group:
            return None
        return Disk(sum(fs.free_bytes for fs in group), sum(fs.total_bytes for fs in group))

    return DiskSums(local=total(local), shared=total(shared))


def _check_id(field_name: str, value: str) -> None:
    if not value or not value.strip():
        raise InvalidInput(field_name, value, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidInput(field_name, value, f"longer than {MAX_ID_LENGTH} characters")
    if value != value.strip():
        raise InvalidInput(field_name, value, "must not start or end with white space")


def _check_text(field_name: str, value: str, limit: int = MAX_TEXT_LENGTH) -> None:
    if len(value) > limit:
        raise InvalidInput(field_name, value, f"longer than {limit} characters")
    problem = text_problem(value)
    if problem is not None:
        raise InvalidInput(field_name, value, problem)


def _check_path(field_name: str, value: str) -> None:
    if not value.strip():
        raise InvalidInput(field_name, value, "must not be empty")
    _check_text(field_name, value, MAX_PATH_LENGTH)


def _check_count(field_name: str, items: tuple[Any, ...], limit: int) -> None:
    if len(items) > limit:
        raise TooManyEntries(field_name, len(items), limit)


def _check_range(field_name: str, value: int, low: int, high: int) -> None:
    if value < low:
        raise InvalidInput(field_name, value, f"must be at least {low}")
    if value > high:
        raise InvalidInput(field_name, value, f"must be at most {high}")


def _check_pairs(field_name: str, pairs: tuple[tuple[str, str], ...], limit: int) -> None:
    _check_count(field_name, pairs, limit)
    seen: set[str] = set()
    for i, (key, value) in enumerate(pairs):
        _check_id(f"{field_name}[{i}].key", key)
        _check_text(f"{field_name}[{i}].value", value)
        if key in seen:
            raise InvalidInput(f"{field_name}[{i}].key", key, "appears twice")
        seen.add(key)


def _check_health_agrees(where: str, gpu: GpuReport) -> None:
    """A GPU is healthy with no reasons, or unhealthy with any (or none); never healthy *and* faulty.

    `healthy: true` with ["ecc_uncorrected"] was stored as healthy and offered
    to schedulers, so a model landed on a GPU its own agent said was broken.
    Which of the two the agent meant cannot be guessed, so the report is
    refused. Reasons themselves are open text: a newer agent may know a fault
    this service does not, and on an unhealthy GPU it is accepted as sent.
    """
    if gpu.healthy and gpu.health_reasons:
        raise InvalidInput(
            f"{where}.healthReasons",
            list(gpu.health_reasons),
            "a GPU reported healthy: true cannot have health reasons; "
            "send healthy: false with the reasons, or healthy: true without any",
        )


def _check_weights(where: str, w: WeightsReport) -> None:
    """One weights entry: an absolute path, a known state, sizes that add up, a sha256 digest."""
    if not w.path.startswith("/"):
        raise InvalidInput(f"{where}.path", w.path, "must be an absolute path")
    if w.size_bytes is not None:
        _check_range(f"{where}.sizeBytes", w.size_bytes, 0, MAX_BYTES)
    if w.total_bytes is not None:
        _check_range(f"{where}.totalBytes", w.total_bytes, 0, MAX_BYTES)
        if w.size_bytes is not None and w.size_bytes > w.total_bytes:
            raise InvalidInput(
                f"{where}.sizeBytes", w.size_bytes, f"exceeds totalBytes={w.total_bytes}"
            )
    if w.state is not None and w.state not in STATES:
        raise InvalidInput(
            f"{where}.state", w.state, f"must be one of {', '.join(s.upper() for s in STATES)}"
        )
    if w.revision is not None:
        _check_id(f"{where}.revision", w.revision)
    if w.digest is not None and not DIGEST.fullmatch(w.digest):
        raise InvalidInput(f"{where}.digest", w.digest, "must be sha256:<64 lowercase hex digits>")


def settle_observed_at(report: NodeReport, clock: AgentClock) -> NodeReport:
    """The report with each weights entry's observedAt on the service's clock (observed_at.py's rule).

    Raises InvalidInput (naming `input.weights[i].observedAt`) for a time in
    the future beyond the skew; nothing is stored then.
    """
    if not report.weights:
        return report
    weights = tuple(
        replace(w, observed_at=clock.settle(f"input.weights[{i}].observedAt", w.observed_at))
        for i, w in enumerate(report.weights)
    )
    return replace(report, weights=weights)


def validate_report(report: NodeReport) -> None:
    """Raise InvalidInput for the first unusable field; a report is stored whole or not at all."""
    _check_id("input.id", report.id)
    _check_id("input.hostname", report.hostname)
    _check_id("input.mgmtAddr", report.mgmt_addr)
    if report.memory_total_mb is not None:
        _check_range("input.memoryTotalMb", report.memory_total_mb, 0, MAX_MEMORY_MB)
    if report.agent_version is not None:
        _check_text("input.agentVersion", report.agent_version, MAX_ID_LENGTH)
    _check_pairs("input.labels", report.labels, MAX_LABELS)
    _check_pairs("input.engineVersions", report.engine_versions, MAX_ENGINE_VERSIONS)
    if report.boot_id is not None:
        _check_id("input.bootId", report.boot_id)
    report.fact_times()

    _check_count("input.gpus", report.gpus, MAX_GPUS)
    indices: set[int] = set()
    for i, gpu in enumerate(report.gpus):
        where = f"input.gpus[{i}]"
        _check_range(f"{where}.index", gpu.index, 0, MAX_GPUS * 16)
        if gpu.index in indices:
            raise InvalidInput(f"{where}.index", gpu.index, "appears twice in this report")
        indices.add(gpu.index)
        _check_id(f"{where}.name", gpu.name)
        if gpu.uuid is not None:
            _check_id(f"{where}.uuid", gpu.uuid)
        if gpu.pci_bus_id is not None:
            _check_id(f"{where}.pciBusId", gpu.pci_bus_id)
        if gpu.gpu_class is not None:
            _check_id(f"{where}.gpuClass", gpu.gpu_class)
        if gpu.memory_mb is not None:
            _check_range(f"{where}.memoryMb", gpu.memory_mb, 0, MAX_MEMORY_MB)
        _check_count(f"{where}.healthReasons", gpu.health_reasons, MAX_HEALTH_REASONS)
        for j, reason in enumerate(gpu.health_reasons):
            _check_id(f"{where}.healthReasons[{j}]", reason)
        _check_health_agrees(where, gpu)
        _check_count(f"{where}.xids", gpu.xids, MAX_XIDS)
        for j, xid in enumerate(gpu.xids):
            if xid < 1:
                raise InvalidInput(f"{where}.xids[{j}]", xid, "an XID is a positive integer")
        if gpu.recovery_action is not None and gpu.recovery_action not in RECOVERY_ACTIONS:
            raise InvalidInput(
                f"{where}.recoveryAction",
                gpu.recovery_action,
                f"not a recovery action ({', '.join(RECOVERY_ACTIONS)})",
            )
        if gpu.reset_seen is not None:
            if not gpu.reset_seen.strip():
                raise InvalidInput(
                    f"{where}.resetSeen", gpu.reset_seen, "say how the reset was seen, or null"
                )
            _check_text(f"{where}.resetSeen", gpu.reset_seen)

    _check_count("input.fabrics", report.fabrics, MAX_FABRICS)
    fabrics: set[str] = set()
    for i, fabric in enumerate(report.fabrics):
        where = f"input.fabrics[{i}]"
        _check_id(f"{where}.fabric", fabric.fabric)
        if fabric.fabric in fabrics:
            raise InvalidInput(f"{where}.fabric", fabric.fabric, "appears twice in this report")
        fabrics.add(fabric.fabric)
        _check_range(f"{where}.rateGbps", fabric.rate_gbps, 0, MAX_RATE_GBPS)
        _check_count(f"{where}.hcas", fabric.hcas, MAX_HCAS)
        for j, hca in enumerate(fabric.hcas):
            _check_id(f"{where}.hcas[{j}]", hca)

    _check_count("input.storage", report.storage, MAX_FILESYSTEMS)
    filesystems: set[str] = set()
    for i, fs in enumerate(report.storage):
        where = f"input.storage[{i}]"
        _check_id(f"{where}.id", fs.id)
        # One filesystem listed twice would count its space twice: the very
        # mistake reporting per filesystem exists to prevent.
        if fs.id in filesystems:
            raise InvalidInput(f"{where}.id", fs.id, "appears twice in this report")
        filesystems.add(fs.id)
        _check_path(f"{where}.mountPoint", fs.mount_point)
        if fs.fs_type is not None:
            _check_text(f"{where}.fsType", fs.fs_type, MAX_ID_LENGTH)
        _check_range(f"{where}.totalBytes", fs.total_bytes, 0, MAX_BYTES)
        _check_range(f"{where}.freeBytes", fs.free_bytes, 0, MAX_BYTES)
        if fs.free_bytes > fs.total_bytes:
            raise InvalidInput(
                f"{where}.freeBytes", fs.free_bytes, f"exceeds totalBytes={fs.total_bytes}"
            )
        _check_count(f"{where}.directories", fs.directories, MAX_DIRECTORIES)
        for j, directory in enumerate(fs.directories):
            _check_path(f"{where}.directories[{j}]", directory)
    sums = sum_disks(report.storage)
    for disk in (sums.local, sums.shared):
        if disk is not None and disk.total_bytes > MAX_BYTES:
            raise InvalidInput("input.storage", disk.total_bytes, "sums past 2^63-1 bytes")

    _check_count("input.weights", report.weights, MAX_WEIGHTS)
    paths: set[str] = set()
    for i, w in enumerate(report.weights):
        where = f"input.weights[{i}]"
        _check_path(f"{where}.path", w.path)
        if w.path in paths:
            raise InvalidInput(f"{where}.path", w.path, "appears twice in this report")
        paths.add(w.path)
        _check_weights(where, w)
    check_topology(report.gpus, (hca for fabric in report.fabrics for hca in fabric.hcas))


def gpu_class_of(gpu: GpuReport) -> str:
    """The class the agent gave, or the one derived from the driver's name and memory."""
    return gpu.gpu_class or derive_gpu_class(gpu.name, gpu.memory_mb)
