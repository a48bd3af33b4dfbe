"""Whether one node can take a placement, and if not, the first reason in words.

The same function decides for place() and explains for explainPlacement, so
the explanation can never disagree with the decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from service.availability import is_schedulable
from service.rejections import shown


class VerdictCode(Enum):
    FITS = "FITS"
    NOT_SCHEDULABLE = "NOT_SCHEDULABLE"
    NOT_ENOUGH_GPUS = "NOT_ENOUGH_GPUS"
    NOT_ON_FABRIC = "NOT_ON_FABRIC"
    LABEL_MISMATCH = "LABEL_MISMATCH"
    LOCAL_DISK_TOO_SMALL = "LOCAL_DISK_TOO_SMALL"
    NO_WEIGHTS = "NO_WEIGHTS"


@dataclass(frozen=True)
class PlaceRequest:
    replica_id: str
    gpu_class: str
    gpus_per_shard: int
    shards: int = 1
    fabric: str | None = None
    weights: str | None = None
    min_local_disk_free: int | None = None
    label: tuple[str, str] | None = None

    @property
    def gpus(self) -> int:
        return self.shards * self.gpus_per_shard


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

    Order: state, GPUs, fabric, label, local disk, weights: the hard facts
    about the machine first, the things an operator can change later.
    """

    def no(code: VerdictCode, detail: str) -> Verdict:
        return Verdict(node.node_id, code, detail)

    if not is_schedulable(node.state):
        detail = f"{node.state}: {node.state_reason}" if node.state_reason else node.state
        return no(VerdictCode.NOT_SCHEDULABLE, detail)
    per_shard = request.gpus_per_shard
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
    room = node.free // per_shard
    holds = ", holds the weights" if request.weights is not None and node.holds_weights else ""
    plural = "" if room == 1 else "s"
    return no(
        VerdictCode.FITS,
        f"{node.free} free {request.gpu_class}, room for {room} shard{plural}{holds}",
    )
