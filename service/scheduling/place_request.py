"""PlaceRequest: a replica as place(), fit() and explainPlacement are asked for it.

Its own home (it was defined in verdicts.py and imported from there by every
reader of a request): the shape (class, shards, GPUs per shard), the node
checks (fabric, weights, disk, label, freshness), topology, tolerations,
and the charge (tenant, priority, deployment) with its preemption policy.
What each option means for the SQL is placement/statements.py's, for one
node verdicts.judge's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from service.scheduling.availability import ADMITS_AT, ADMITS_INTO, ADMITS_NONE, ADMITS_UNTIL
from service.scheduling.taints import Toleration
from service.scheduling.tenancy.charges import UNNAMED, Charge, PreemptionPolicy


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
    nvlink_shards: bool = False
    same_nvlink_domain: bool = False
    rail_aligned: bool = False
    # Seconds: only nodes whose GPU facts are at most this old (None: any age).
    max_age: int | None = None
    # Only nodes whose copy of `weights` is READY.
    weights_ready: bool = False
    # The taints the request tolerates (service/scheduling/taints.py): every
    # reader that takes a request (place, allocate, fit, explainPlacement)
    # offers it the same GPUs (availability.gpu_offered, PoolOffer).
    tolerations: tuple[Toleration, ...] = ()
    # Who the replica is charged to (service/scheduling/tenancy/): the claim
    # checks the tenant's limit; fit and explainPlacement count within it.
    charge: Charge = UNNAMED
    # LOWER_PRIORITY: a place that does not fit on free GPUs may stop replicas
    # of lower priority, and reclaim what other tenants borrowed.
    preemption: PreemptionPolicy = PreemptionPolicy.NEVER
    # The replica promises to be released by then (PlaceInput.until): it may
    # use GPUs set aside for a window that starts at or after it, and is told
    # to stop at that start if still placed (issue 47). Stored on its shards.
    # Maintenance windows read it too: such a replica may use nodes whose
    # maintenance starts at or after it (maintenance_rule.py).
    until: datetime | None = None
    # Place into this reservation (its tenant only, while ACTIVE or DEGRADED):
    # only its GPUs are used (service/scheduling/reservations/).
    reservation: str | None = None
    # fit, fitGroup and freeGpus asked of a later instant (`at`): what an
    # ordinary place would be offered then (availability.gpu_offered_at).
    # Never set on a place.
    at: datetime | None = None

    @property
    def gpus(self) -> int:
        return self.shards * self.gpus_per_shard

    @property
    def tolerating(self) -> bool:
        return bool(self.tolerations)

    @property
    def admitting(self) -> str:
        """Which GPUs set aside the request may use (availability.gpu_admitted)."""
        if self.at is not None:
            return ADMITS_AT
        if self.reservation is not None:
            return ADMITS_INTO
        if self.until is not None:
            return ADMITS_UNTIL
        return ADMITS_NONE

    @property
    def needs_topology(self) -> bool:
        return self.nvlink_shards or self.same_nvlink_domain or self.rail_aligned
