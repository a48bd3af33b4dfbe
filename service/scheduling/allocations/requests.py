"""An allocation as a scheduler asks for it, and the checks that need no database."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from service.bounds import MAX_GPUS_PER_SHARD, MAX_ID_LENGTH, MAX_SHARDS
from service.scheduling.rejections import Rejection, invalid, invalid_field, shown
from service.scheduling.taints import Toleration, toleration_problem
from service.scheduling.tenancy.charges import UNNAMED, Charge, charge_problem
from service.stored_text import text_problem


@dataclass(frozen=True)
class ShardRequest:
    shard_id: str
    node_id: str
    gpu_indices: tuple[int, ...]
    # The adapters this shard is handed, when place() chose them (railAligned:
    # exactly its GPUs' near HCAs); None: every adapter of the node on the fabric.
    hcas: tuple[str, ...] | None = None


@dataclass(frozen=True)
class AllocationRequest:
    replica_id: str
    shards: tuple[ShardRequest, ...]
    # The replica's generation the caller last saw, when it adds shards to
    # it: refused with GENERATION_CONFLICT when the replica changed since.
    generation: int | None = None
    # The weights path the replica was placed with (place's `weights`): its
    # shards pin it on their nodes (service/scheduling/weights_lifecycle.pinned_by).
    weights: str | None = None
    # The taints the replica tolerates (service/scheduling/taints.py): a
    # withheld GPU is allocated only when every taint withholding it is
    # tolerated.
    tolerations: tuple[Toleration, ...] = ()
    # Who it is charged to (service/scheduling/tenancy/): the claim checks the
    # tenant's limit and records the charge on the shards.
    charge: Charge = UNNAMED
    # The replica's promise to be gone by then, and the reservation it is
    # placed into (PlaceRequest's; availability.gpu_admitted): which GPUs
    # set aside it may hold.
    until: datetime | None = None
    reservation: str | None = None


def _check_id(what: str, value: str) -> Rejection | None:
    if not value:
        return invalid(f"{what} is empty")
    if len(value) > MAX_ID_LENGTH:
        return invalid(f"{what} {shown(value)!r} is longer than {MAX_ID_LENGTH} characters")
    problem = text_problem(value)
    if problem is not None:
        # PostgreSQL text cannot hold it; refuse it here rather than as a database error.
        return invalid(f"{what} '{shown(value)}' {problem}")
    return None


def validate_request(request: AllocationRequest) -> Rejection | None:
    """What can be refused without reading the database: nothing is locked or written for it."""
    problem = _check_id("replicaId", request.replica_id)
    if problem:
        return problem
    tolerations = toleration_problem(request.tolerations)
    if tolerations is not None:
        field, value, why = tolerations
        return invalid(f"{field}={shown(str(value))!r}: {why}")
    charge = charge_problem(request.charge)
    if charge is not None:
        return invalid_field(*charge)
    if not request.shards:
        return invalid("shards is empty: a replica needs at least one shard")
    if len(request.shards) > MAX_SHARDS:
        return invalid(
            f"{len(request.shards)} shards asked for; a replica has at most {MAX_SHARDS}"
        )
    seen_shards: set[str] = set()
    holder_of: dict[tuple[str, int], str] = {}
    for shard in request.shards:
        problem = _check_id("shardId", shard.shard_id) or _check_id(
            f"nodeId of shard {shown(shard.shard_id)}", shard.node_id
        )
        if problem:
            return problem
        sid = shown(shard.shard_id)
        if shard.shard_id in seen_shards:
            return invalid(f"shard {sid} appears twice in this request")
        seen_shards.add(shard.shard_id)
        if not shard.gpu_indices:
            return invalid(f"shard {sid} lists no GPUs (gpuIndices is empty)", shard.node_id)
        if len(shard.gpu_indices) > MAX_GPUS_PER_SHARD:
            return invalid(
                f"shard {sid} lists {len(shard.gpu_indices)} GPUs; a shard has at most "
                f"{MAX_GPUS_PER_SHARD}",
                shard.node_id,
            )
        seen_indices: set[int] = set()
        for index in shard.gpu_indices:
            if index < 0:
                return invalid(
                    f"shard {sid} asks for GPU {index}; GPU indices start at 0",
                    shard.node_id,
                    index,
                )
            if index in seen_indices:
                return invalid(f"shard {sid} lists GPU {index} twice", shard.node_id, index)
            seen_indices.add(index)
            other = holder_of.get((shard.node_id, index))
            if other is not None:
                return invalid(
                    f"GPU {index} on node {shown(shard.node_id)} is asked for by both shard "
                    f"{shown(other)} and shard {sid}",
                    shard.node_id,
                    index,
                )
            holder_of[(shard.node_id, index)] = shard.shard_id
    return None
