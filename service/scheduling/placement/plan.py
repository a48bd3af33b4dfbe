"""The plan: where a replica's shards would go on nodes already read, and the checks of a request (no database)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from service.bounds import (
    MAX_GPUS_PER_SHARD,
    MAX_ID_LENGTH,
    MAX_PATH_LENGTH,
    MAX_SHARDS,
    MAX_TEXT_LENGTH,
)
from service.scheduling.fabric_choice import fabric_rank
from service.scheduling.place_request import PlaceRequest
from service.scheduling.ranking import node_rank
from service.scheduling.rejections import Rejection, invalid, invalid_field, shown
from service.scheduling.taints import toleration_problem
from service.scheduling.tenancy.charges import UNNAMED, charge_problem
from service.scheduling.verdicts import NodeFacts, judge
from service.stored_text import storable

SHARD_SUFFIX = "-s{}"
MAX_REPLICA_ID_LENGTH = MAX_ID_LENGTH - len(SHARD_SUFFIX.format(MAX_SHARDS))


@dataclass(frozen=True)
class Plan:
    fabric: str | None
    # (node id, number of shards on it), in the order shards are numbered.
    nodes: tuple[tuple[str, int], ...]
    # sameNvlinkDomain: the NVLink domain every shard is in.
    domain: str | None = None


def shard_ids(request: PlaceRequest) -> list[str]:
    return [request.replica_id + SHARD_SUFFIX.format(i) for i in range(request.shards)]


def validate_place(request: PlaceRequest) -> Rejection | None:
    texts = [request.replica_id, request.gpu_class, request.fabric, request.weights]
    texts += list(request.label or ())
    if any(t is not None and not storable(t) for t in texts):
        # PostgreSQL text cannot hold it; refuse it here rather than as a database error.
        return invalid("a text field contains a NUL character or a lone surrogate")
    if not request.replica_id:
        return invalid("replicaId is empty")
    if len(request.replica_id) > MAX_REPLICA_ID_LENGTH:
        return invalid(
            f"replicaId {shown(request.replica_id)!r} is longer than {MAX_REPLICA_ID_LENGTH} "
            "characters (its shard ids add a suffix)"
        )
    if not request.gpu_class or len(request.gpu_class) > MAX_TEXT_LENGTH:
        return invalid(f"gpuClass {shown(request.gpu_class)!r} is not a GPU class")
    if not 1 <= request.shards <= MAX_SHARDS:
        return invalid(f"shards={request.shards}: a replica has 1 to {MAX_SHARDS} shards")
    if not 1 <= request.gpus_per_shard <= MAX_GPUS_PER_SHARD:
        return invalid(
            f"gpusPerShard={request.gpus_per_shard}: a shard has 1 to {MAX_GPUS_PER_SHARD} GPUs"
        )
    if request.fabric is not None and not 1 <= len(request.fabric) <= MAX_ID_LENGTH:
        return invalid(f"fabric {shown(request.fabric)!r} is not a fabric name")
    if request.weights is not None and not 1 <= len(request.weights) <= MAX_PATH_LENGTH:
        return invalid(f"weights {shown(request.weights)!r} is not a path")
    if request.min_local_disk_free is not None and request.min_local_disk_free < 0:
        return invalid(f"minLocalDiskFree={request.min_local_disk_free} is negative")
    if request.label is not None and not request.label[0]:
        return invalid("label has an empty key")
    if request.max_age is not None and request.max_age < 0:
        return invalid(f"maxAge={request.max_age}: an age in seconds is 0 or more")
    if request.rail_aligned and request.fabric is None:
        return invalid("railAligned needs fabric: the HCAs a shard is handed are on one fabric")
    if request.weights_ready and request.weights is None:
        return invalid("weightsReady needs weights: the path whose copy must be READY")
    problem = toleration_problem(request.tolerations)
    if problem is not None:
        field, value, why = problem
        return invalid(f"{field}={shown(str(value))!r}: {why}")
    charge = charge_problem(request.charge)
    if charge is not None:
        return invalid_field(*charge)
    if request.until is not None and request.until <= datetime.now(UTC):
        return invalid_field(
            "until", request.until.isoformat(), "is in the past: a promise to be released by then"
        )
    return None


def plan_placement(facts: Sequence[NodeFacts], request: PlaceRequest) -> Plan | None:
    """Where the shards would go on these nodes, or None when they do not fit.

    Deterministic: nodes are taken in service/scheduling/ranking.py's order,
    so fit, which calls this on the same facts, counts what place does.
    """
    fitting = [f for f in facts if judge(f, request).fits]
    per_shard = request.gpus_per_shard

    def rank(f: NodeFacts, need: int) -> tuple[int, int, int, int, str]:
        return node_rank(f, request, need)

    whole = [f for f in fitting if f.room(request) >= request.shards]
    if whole:
        best = min(whole, key=lambda f: rank(f, request.gpus))
        return Plan(None, ((best.node_id, request.shards),), _domain_of(best, request))
    if request.shards == 1:
        return None
    # Spread over one fabric (and, sameNvlinkDomain, one NVLink domain).
    # Among those that can take the replica: the most shards on weight
    # holders, then the fewest nodes, then the least left over on the nodes
    # used, then the fabric as allocate() chooses one (fabric_choice: the
    # fastest slowest link on the nodes used, then the name), then the
    # domain's name.
    fabrics = (
        [request.fabric] if request.fabric else sorted({x for f in fitting for x in f.fabrics})
    )
    domains: list[str | None] = [None]
    if request.same_nvlink_domain:
        domains = [*sorted({d for f in fitting if (d := _domain_of(f, request)) is not None})]
    best_plan: Plan | None = None
    best_key: tuple[int, int, int, tuple[int, str], str] | None = None
    for fabric, domain in ((f, d) for d in domains for f in fabrics):
        left = request.shards
        taken: list[tuple[str, int]] = []
        rates: list[int] = []
        on_holders = leftover = 0
        members = (
            f
            for f in fitting
            if fabric in f.fabrics and (domain is None or _domain_of(f, request) == domain)
        )
        for f in sorted(members, key=lambda f: rank(f, per_shard)):
            k = min(f.room(request), left)
            taken.append((f.node_id, k))
            rates.append(f.rate_on(fabric))
            left -= k
            leftover += f.free - k * per_shard
            on_holders += k if f.holds_weights else 0
            if left == 0:
                break
        if left:
            continue
        key = (-on_holders, len(taken), leftover, fabric_rank(fabric, rates), domain or "")
        if best_key is None or key < best_key:
            best_key, best_plan = key, Plan(fabric, tuple(taken), domain)
    return best_plan


def _domain_of(f: NodeFacts, request: PlaceRequest) -> str | None:
    return f.topology.domain if request.same_nvlink_domain and f.topology else None


def same_shape(request: PlaceRequest) -> PlaceRequest | None:
    """What calls placed together by place_several_without_waiting share: all but the replica id and the charge.

    Calls charged to different tenants share a claim statement: it charges
    each call to its own (tenancy/quota_claims.py). None for a request that
    goes one by one: invalid input.
    """
    if validate_place(request) is not None or request.admitting:
        # A request a reservation admits is checked against it first (place()).
        return None
    return replace(request, replica_id="", charge=UNNAMED)


def without_topology(request: PlaceRequest) -> PlaceRequest:
    """The request as judge() checks a picked node: its topology is the claim's to check."""
    return replace(request, nvlink_shards=False, same_nvlink_domain=False, rail_aligned=False)
