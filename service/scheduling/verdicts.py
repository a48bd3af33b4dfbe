"""Whether one node can take a placement, and if not, the first reason in words.

The same function decides for place() and explains for explainPlacement, so
the explanation can never disagree with the decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from service.node_states import state_phrase
from service.scheduling.availability import is_schedulable
from service.scheduling.freshness import is_fresh, stale_detail
from service.scheduling.place_request import PlaceRequest
from service.scheduling.rejections import index_ranges, shown
from service.scheduling.taints import TaintEffect, label
from service.scheduling.weights_lifecycle import is_ready, rank, readiness_phrase


class VerdictCode(Enum):
    FITS = "FITS"
    NOT_SCHEDULABLE = "NOT_SCHEDULABLE"
    NOT_ENOUGH_GPUS = "NOT_ENOUGH_GPUS"
    NOT_ON_FABRIC = "NOT_ON_FABRIC"
    LABEL_MISMATCH = "LABEL_MISMATCH"
    LOCAL_DISK_TOO_SMALL = "LOCAL_DISK_TOO_SMALL"
    NO_WEIGHTS = "NO_WEIGHTS"
    # Topology (service.scheduling.topology_fit): each says which group, domain or HCA.
    NVLINK_GROUP_TOO_SMALL = "NVLINK_GROUP_TOO_SMALL"
    TOPOLOGY_UNKNOWN = "TOPOLOGY_UNKNOWN"
    NOT_IN_NVLINK_DOMAIN = "NOT_IN_NVLINK_DOMAIN"
    NO_RAIL_ALIGNED_HCA = "NO_RAIL_ALIGNED_HCA"
    # Freshness (service.scheduling.freshness): GPU facts older than maxAge.
    FACTS_STALE = "FACTS_STALE"
    # A NO_SCHEDULE or NO_EXECUTE taint the request does not tolerate keeps
    # the GPUs it needs (service/scheduling/taints.py); the detail names it.
    TAINTED = "TAINTED"
    # weightsReady: the node's copy of the weights is not READY (service/scheduling/weights_lifecycle.py).
    WEIGHTS_NOT_READY = "WEIGHTS_NOT_READY"
    # The node has room, but the tenant's limit for the class does not
    # (service/scheduling/tenancy/): what place, fit and explainPlacement say
    # of the nodes that would fit otherwise.
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    # A maintenance window in force on the node (draining or started) that
    # the request's `until` does not end before (service/scheduling/maintenance_rule.py).
    MAINTENANCE = "MAINTENANCE"
    # The node would have room but for GPUs set aside for a reservation the
    # request may not use (service/scheduling/reservations/).
    RESERVED = "RESERVED"


@dataclass(frozen=True)
class TopologyFacts:
    """A node's topology for one request, from service.scheduling.topology_fit.facts_column.

    known: some GPU of the class reported what the request needs (peers for
    nvlinkShards, near HCAs for railAligned). groups: free GPUs per NVLink
    group, largest first. usable: free GPUs the request may use, whole shards
    only (the fit order's length). unaligned: free GPUs with no near HCA on
    the fabric. domain: the node's one NVLink domain, if any.
    """

    known: bool
    groups: tuple[int, ...]
    usable: int
    unaligned: tuple[int, ...]
    domain: str | None

    @classmethod
    def of(cls, value: Any) -> TopologyFacts | None:
        if value is None:
            return None
        return cls(
            known=bool(value["known"]),
            groups=tuple(value["groups"] or ()),
            usable=int(value["usable"]),
            unaligned=tuple(value["unaligned"] or ()),
            domain=value["domain"],
        )


@dataclass(frozen=True)
class WeightsCopy:
    """A node's weights row for the requested path, as placement reads it (placement/weights.py)."""

    state: str | None
    size_bytes: int | None
    total_bytes: int | None

    @classmethod
    def of(cls, value: Any) -> WeightsCopy | None:
        if value is None:
            return None
        return cls(state=value["state"], size_bytes=value["size"], total_bytes=value["total"])


@dataclass(frozen=True)
class WithholdingTaint:
    """The taint a TAINTED verdict names (taints.first_taint, through availability.pool_withholding_taint)."""

    key: str
    value: str | None
    effect: str
    source: str
    reason: str
    # None: a taint on the node.
    gpu: int | None

    @classmethod
    def of(cls, value: Any) -> WithholdingTaint | None:
        if value is None:
            return None
        return cls(
            key=value["key"],
            value=value["value"],
            effect=value["effect"],
            source=value["source"],
            reason=value["reason"],
            gpu=value["gpu"],
        )

    def describe(self) -> str:
        where = "the node" if self.gpu is None else f"GPU {self.gpu}"
        return f"{label(self.key, self.value, TaintEffect(self.effect))} on {where} ({self.source}: {shown(self.reason, 120)})"


@dataclass(frozen=True)
class MaintenanceFact:
    """The window a MAINTENANCE verdict names (maintenance_rule.maintenance_json)."""

    window_id: str
    start: str
    end: str
    reason: str

    @classmethod
    def of(cls, value: Any) -> MaintenanceFact | None:
        if value is None:
            return None
        return cls(
            window_id=value["id"],
            start=str(value["start"]),
            end=str(value["end"]),
            reason=value["why"],
        )

    def describe(self) -> str:
        return (
            f"maintenance {shown(self.window_id)} from {self.start} to {self.end} "
            f"({shown(self.reason, 120)}); a replica placed with `until` at or before its start "
            "may use the node"
        )


@dataclass(frozen=True)
class NodeFacts:
    """What placement needs to know about one node and one GPU class, read in one statement."""

    node_id: str
    state: str
    state_reason: str | None
    free: int
    local_disk_free: int | None
    local_disk_total: int | None
    knows_its_weights: bool
    holds_weights: bool
    fabrics: tuple[str, ...]
    label_value: str | None
    # Read only when the request needs topology.
    topology: TopologyFacts | None = None
    # Seconds since the node's GPUs were observed (freshness.gpu_facts_age).
    gpus_facts_age: float | None = None
    # The link rate (Gb/s) of each of `fabrics`, in the same order.
    fabric_rates: tuple[int, ...] = ()
    # Usable, unheld GPUs of the class a taint withholds from the request
    # (not in `free`), and the first such taint; of `free`, how many a
    # PREFER_NO_SCHEDULE taint the request does not tolerate sends last.
    withheld: int = 0
    taint: WithholdingTaint | None = None
    last_resort: int = 0
    # A maintenance window in force on the node that the request's `until`
    # does not end before (service/scheduling/maintenance_rule.py).
    maintenance: MaintenanceFact | None = None
    # Usable, unheld, untainted GPUs of the class set aside for reservations
    # the request may not use (availability.gpu_admitted; not in `free`).
    reserved: int = 0

    def rate_on(self, fabric: str) -> int:
        """The node's link rate on `fabric` (one of its fabrics), in Gb/s."""
        return self.fabric_rates[self.fabrics.index(fabric)]

    # The node's copy of the requested weights; None when it has none.
    weights_copy: WeightsCopy | None = None

    @property
    def weights_rank(self) -> int:
        """weights_lifecycle.rank of the node's copy: lower is preferred."""
        copy = self.weights_copy
        return rank(copy is not None, None if copy is None else copy.state)

    def room(self, request: PlaceRequest) -> int:
        """How many of the request's shards this node can take now."""
        if request.needs_topology:
            return self.topology.usable // request.gpus_per_shard if self.topology else 0
        return self.free // request.gpus_per_shard


@dataclass(frozen=True)
class Verdict:
    node_id: str
    code: VerdictCode
    detail: str

    @property
    def fits(self) -> bool:
        return self.code is VerdictCode.FITS


_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")


def format_bytes(count: int) -> str:
    """Decimal units, as disks are sold and `df -H` prints: 20.1 GB, 1.8 TB, 40 GB."""
    value = float(count)
    unit = 0
    while value >= 999.95 and unit < len(_UNITS) - 1:
        value /= 1000
        unit += 1
    text = f"{value:.1f}".removesuffix(".0") if unit else str(count)
    return f"{text} {_UNITS[unit]}"


def judge(node: NodeFacts, request: PlaceRequest) -> Verdict:
    """The first check the node fails, in a fixed order, or FITS.

    Order: state, maintenance, freshness, GPUs, fabric, label, local disk, weights: the
    hard facts about the machine first (counting GPUs from facts too old to
    trust says nothing), the things an operator can change later.
    """

    def no(code: VerdictCode, detail: str) -> Verdict:
        return Verdict(node.node_id, code, detail)

    if not is_schedulable(node.state):
        detail = state_phrase(node.state, node.state_reason)
        return no(VerdictCode.NOT_SCHEDULABLE, detail)
    if node.maintenance is not None:
        return no(VerdictCode.MAINTENANCE, node.maintenance.describe())
    if not is_fresh(node.gpus_facts_age, request.max_age):
        assert request.max_age is not None
        return no(
            VerdictCode.FACTS_STALE, stale_detail(node.gpus_facts_age or 0.0, request.max_age)
        )
    per_shard = request.gpus_per_shard
    if node.free < per_shard <= node.free + node.withheld:
        # The node would have room but for a taint: the verdict says which,
        # so the caller can tolerate it (or the operator lift it).
        taint = node.taint.describe() if node.taint else "a taint"
        return no(
            VerdictCode.TAINTED,
            f"{node.withheld} free {request.gpu_class} tainted, e.g. {taint}; "
            f"{node.free} untainted, needs {per_shard}",
        )
    if node.free < per_shard <= node.free + node.reserved:
        return no(
            VerdictCode.RESERVED,
            f"{node.reserved} free {request.gpu_class} set aside for a reservation; "
            f"{node.free} not, needs {per_shard}",
        )
    if node.free < per_shard:
        return no(
            VerdictCode.NOT_ENOUGH_GPUS,
            f"{node.free} free {request.gpu_class}, needs {per_shard}",
        )
    if request.fabric is not None and request.fabric not in node.fabrics:
        return no(VerdictCode.NOT_ON_FABRIC, f"not on fabric {shown(request.fabric)}")
    if request.label is not None:
        key, value = request.label
        if node.label_value != value:
            have = "no such label" if node.label_value is None else f"it is {node.label_value}"
            return no(VerdictCode.LABEL_MISMATCH, f"label {key}={value} wanted, {have}")
    need = request.min_local_disk_free
    # Unknown disk is not a full disk: an old agent or a node without model
    # directories says nothing, and must not be excluded for it.
    if need is not None and node.local_disk_free is not None and node.local_disk_free < need:
        total = format_bytes(node.local_disk_total or 0)
        return no(
            VerdictCode.LOCAL_DISK_TOO_SMALL,
            f"local disk {format_bytes(node.local_disk_free)} free of {total}, "
            f"needs {format_bytes(need)}",
        )
    # A node that was not asked to look for weights constrains nothing.
    if request.weights is not None and node.knows_its_weights and not node.holds_weights:
        return no(VerdictCode.NO_WEIGHTS, f"does not hold {shown(request.weights, 200)}")
    if request.weights is not None and request.weights_ready:
        copy = node.weights_copy
        if copy is None:
            return no(
                VerdictCode.WEIGHTS_NOT_READY,
                f"{shown(request.weights, 200)} is not reported on this node",
            )
        if not is_ready(copy.state):
            phrase = readiness_phrase(
                shown(request.weights, 200), copy.state, copy.size_bytes, copy.total_bytes
            )
            return no(VerdictCode.WEIGHTS_NOT_READY, phrase)
    if request.needs_topology:
        misfit = _topology_misfit(node, request)
        if misfit is not None:
            return no(*misfit)
    room = node.room(request)
    holds = ""
    if request.weights is not None and node.holds_weights:
        state = node.weights_copy.state if node.weights_copy is not None else None
        holds = ", holds the weights" + (f" ({state.upper()})" if state else "")
    plural = "" if room == 1 else "s"
    return no(
        VerdictCode.FITS,
        f"{node.free} free {request.gpu_class}, room for {room} shard{plural}{holds}",
    )


def _topology_misfit(node: NodeFacts, request: PlaceRequest) -> tuple[VerdictCode, str] | None:
    """Why the node's topology cannot take one shard of the request, or None.

    Unknown is not zero: a node that reported none of what the request needs
    is TOPOLOGY_UNKNOWN, not "no NVLink".
    """
    t = node.topology
    per = request.gpus_per_shard
    if t is None or not t.known:
        needs = [
            what
            for what, asked in (
                ("NVLink peers", request.nvlink_shards),
                ("near HCAs", request.rail_aligned),
            )
            if asked
        ]
        return VerdictCode.TOPOLOGY_UNKNOWN, f"its agent reported no {' or '.join(needs)}"
    if request.same_nvlink_domain and t.domain is None:
        return (
            VerdictCode.NOT_IN_NVLINK_DOMAIN,
            f"its {request.gpu_class} GPUs are in no single NVLink domain",
        )
    if request.nvlink_shards and not any(size >= per for size in t.groups):
        largest = t.groups[0] if t.groups else 0
        return (
            VerdictCode.NVLINK_GROUP_TOO_SMALL,
            f"largest free NVLink group has {largest} {request.gpu_class}, needs {per}",
        )
    if t.usable >= per:
        return None
    aligned = node.free - len(t.unaligned)
    if request.rail_aligned and aligned < per:
        fabric = shown(request.fabric or "")
        return (
            VerdictCode.NO_RAIL_ALIGNED_HCA,
            f"{aligned} free {request.gpu_class} have a near HCA on fabric {fabric}, needs {per}; "
            f"no near HCA on {fabric} for GPU {index_ranges(t.unaligned)}",
        )
    return (
        VerdictCode.NVLINK_GROUP_TOO_SMALL,
        f"no NVLink group has {per} free {request.gpu_class} with a near HCA on fabric "
        f"{shown(request.fabric or '')}",
    )
