"""Why an allocation was refused: a code a program can switch on and a sentence a person can act on.

Rejections are answers, not errors: a scheduler that loses a race for a GPU
is doing its job, and it needs to know which GPU and who holds it, not a
stack trace or a serialization failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

# How a message repeats an id or a text a caller sent has one home
# (service/errors.py); imported from here by the scheduling modules.
from service.errors import shown as shown


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


@dataclass(frozen=True)
class Rejection:
    code: RejectionCode
    message: str
    node_id: str | None = None
    gpu_index: int | None = None
    held_by: str | None = None


def invalid(message: str, node_id: str | None = None, gpu_index: int | None = None) -> Rejection:
    return Rejection(RejectionCode.INVALID, message, node_id=node_id, gpu_index=gpu_index)


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
