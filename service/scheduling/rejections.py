"""Why an allocation was refused: a code a program can switch on and a sentence a person can act on.

Rejections are answers, not errors: a scheduler that loses a race for a GPU
is doing its job, and it needs to know which GPU and who holds it, not a
stack trace or a serialization failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

# How a message repeats an id or a text a caller sent has one home
# (service/errors.py); imported from here by the scheduling modules.
from service.errors import shown as shown
from service.errors import shown_value
from service.scheduling.tenancy.charges import QuotaShortfall, Refusal, UnknownTenant


class RejectionCode(Enum):
    GPU_TAKEN = "GPU_TAKEN"
    GPU_UNHEALTHY = "GPU_UNHEALTHY"
    GPU_CORDONED = "GPU_CORDONED"
    # A NO_SCHEDULE or NO_EXECUTE taint on the GPU or its node that the
    # request does not tolerate (service/scheduling/taints.py).
    GPU_TAINTED = "GPU_TAINTED"
    NO_SUCH_GPU = "NO_SUCH_GPU"
    NO_SUCH_NODE = "NO_SUCH_NODE"
    NODE_NOT_SCHEDULABLE = "NODE_NOT_SCHEDULABLE"
    FABRIC_MISMATCH = "FABRIC_MISMATCH"
    DUPLICATE_SHARD = "DUPLICATE_SHARD"
    INVALID = "INVALID"
    # The request named a generation of the replica that is not its current
    # one (service/scheduling/generations.py).
    GENERATION_CONFLICT = "GENERATION_CONFLICT"
    # An id already in use for something else: a placement group placed
    # with other roles, shapes or locality (service/scheduling/groups/).
    CONFLICT = "CONFLICT"
    # placeGroup's search for a plan reached its bound (groups/planning.py
    # SEARCH_BOUND) before it found one or proved there is none: nothing
    # held, and not "no room" (issue 44).
    SEARCH_BOUND = "SEARCH_BOUND"
    # The tenant's limit for a class refused it (service/scheduling/tenancy/).
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    # A maintenance window in force on a node asked for keeps the replica off
    # it (service/scheduling/maintenance_rule.py; place's verdict MAINTENANCE).
    MAINTENANCE = "MAINTENANCE"


@dataclass(frozen=True)
class Rejection:
    code: RejectionCode
    message: str
    node_id: str | None = None
    gpu_index: int | None = None
    held_by: str | None = None
    # QUOTA_EXCEEDED: the numbers.
    quota: QuotaShortfall | None = None


def invalid(message: str, node_id: str | None = None, gpu_index: int | None = None) -> Rejection:
    return Rejection(RejectionCode.INVALID, message, node_id=node_id, gpu_index=gpu_index)


def invalid_field(field: str, value: object, why: str) -> Rejection:
    """INVALID naming the field and its value: a text quoted (and cut when long), a number as it is."""
    return invalid(f"{field}={shown_value(value)}: {why}")


def in_maintenance(node_id: str, window: dict[str, Any]) -> Rejection:
    """MAINTENANCE naming the node and the window (maintenance_rule.maintenance_json's object)."""
    return Rejection(
        RejectionCode.MAINTENANCE,
        f"node {shown(node_id)} is in maintenance window {shown(window['id'])} "
        f"({shown(window['why'], 120)}), from {window['start']} to {window['end']}: from its "
        "drain to its end it takes no new replica unless the replica's `until` is at or before "
        "the window's start",
        node_id=node_id,
    )


def refused_for_charge(refusal: Refusal) -> Rejection:
    """allocate()'s answer to a claim its charge refused: QUOTA_EXCEEDED, or INVALID for no such tenant.

    A QuotaBusy is never answered: only a claim that must not wait gets it,
    and its caller claims again in a transaction of its own.
    """
    if isinstance(refusal, QuotaShortfall):
        return Rejection(RejectionCode.QUOTA_EXCEEDED, refusal.sentence(), quota=refusal)
    assert isinstance(refusal, UnknownTenant), refusal
    return invalid(refusal.sentence())


def index_ranges(indices: Iterable[int]) -> str:
    """0,1,2,3,6 -> '0-3, 6': how a person reads a node's GPUs."""
    ordered = sorted(set(indices))
    if not ordered:
        return "none"
    parts: list[str] = []
    start = prev = ordered[0]
    for i in ordered[1:]:
        if i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts)
