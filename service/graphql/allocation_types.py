"""GraphQL types of allocation and placement: results are unions, so a refusal is an answer with a code."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import strawberry

from service.errors import InventoryError
from service.scheduling import place_request, rejections, verdicts
from service.scheduling.allocations import Allocated as AllocatedRecord
from service.scheduling.allocations import AllocationRequest, ShardRequest
from service.scheduling.placement import Explanation
from service.scheduling.placement import Unplaceable as UnplaceableRecord
from service.scheduling.placement.fit import Fit as FitRecord
from service.scheduling.tenancy.charges import PreemptionPolicy

from .health_types import TOLERATIONS, TolerationInput, tolerations_of
from .inputs import KeyValueInput
from .scalars import Bytes, utc
from .tenancy_types import (
    DisruptionBudget,
    Preemption,
    QuotaShortfall,
    charge_of,
)
from .types import Allocation

# The domain's codes, exposed as they are: one list of codes, not two to keep in step.
strawberry.enum(rejections.RejectionCode, name="RejectionCode")

# The charge fields place, allocate and placeGroup share (contract-tenancy.graphql).
TENANT = (
    "Charged to this tenant; a token bound to a tenant may only name its own (or none). Null: "
    "the token's tenant, else default."
)
PRIORITY = "Higher is more important; preemption only takes from lower. From -1000000 to 1000000."
DEPLOYMENT = "Replicas of one deployment share a disruption budget."


@strawberry.type
class AllocationRejected:
    code: rejections.RejectionCode
    message: str = strawberry.field(
        description="A sentence for a person: which node, which GPU, held by which shard."
    )
    node_id: strawberry.ID | None
    gpu_index: int | None
    held_by: strawberry.ID | None = strawberry.field(
        description="The shard that holds the GPU, for GPU_TAKEN."
    )
    quota: QuotaShortfall | None = strawberry.field(
        default=None, description="QUOTA_EXCEEDED: the tenant, class, used, limit and asked."
    )

    @classmethod
    def of(cls, r: rejections.Rejection) -> AllocationRejected:
        return cls(
            code=r.code,
            message=r.message,
            node_id=None if r.node_id is None else strawberry.ID(r.node_id),
            gpu_index=r.gpu_index,
            held_by=None if r.held_by is None else strawberry.ID(r.held_by),
            quota=QuotaShortfall.of(r.quota),
        )


@strawberry.type
class Allocated:
    allocations: list[Allocation]
    preempted: list[Preemption] = strawberry.field(
        description="The replicas stopped to make room for this one; empty on free GPUs."
    )

    @classmethod
    def of(cls, record: AllocatedRecord) -> Allocated:
        return cls(
            allocations=[Allocation.of(s) for s in record.shards],
            preempted=[Preemption.of(p) for p in record.preempted],
        )


AllocateResult = Annotated[Allocated | AllocationRejected, strawberry.union("AllocateResult")]


@strawberry.input
class ShardInput:
    shard_id: strawberry.ID
    node_id: strawberry.ID
    gpu_indices: list[int]


@strawberry.input
class AllocateInput:
    replica_id: strawberry.ID
    shards: list[ShardInput]
    generation: int | None = strawberry.field(
        default=None,
        description=(
            "When adding shards to an existing replica: its generation as last read "
            "(Allocation.generation). A replica that changed since is refused with "
            "GENERATION_CONFLICT, nothing written."
        ),
    )
    tolerations: list[TolerationInput] | None = strawberry.field(
        default=None, description=TOLERATIONS + " A GPU withheld otherwise: GPU_TAINTED."
    )
    tenant: strawberry.ID | None = strawberry.field(default=None, description=TENANT)
    priority: int | None = strawberry.field(default=0, description=PRIORITY)
    deployment: str | None = strawberry.field(default=None, description=DEPLOYMENT)

    def to_request(self) -> AllocationRequest:
        """The request as named; its tenant bound to the caller by the resolver (charges.bind)."""
        return AllocationRequest(
            replica_id=str(self.replica_id),
            shards=tuple(
                ShardRequest(str(s.shard_id), str(s.node_id), tuple(s.gpu_indices))
                for s in self.shards
            ),
            generation=self.generation,
            tolerations=tolerations_of(self.tolerations),
            charge=charge_of(self.tenant, self.priority, self.deployment),
        )


@strawberry.input
class PlaceInput:
    replica_id: strawberry.ID = strawberry.field(
        description="Shards are named <replicaId>-s0, -s1, ..."
    )
    gpu_class: str = strawberry.field(description="As gpuClasses names them, e.g. H100-80GB.")
    shards: int = strawberry.field(default=1, description="How many shards; never split.")
    gpus_per_shard: int
    fabric: str | None = strawberry.field(
        default=None, description="Place only on nodes attached to this fabric."
    )
    weights: str | None = strawberry.field(
        default=None,
        description=(
            "A weights path the nodes must hold; nodes that hold it are preferred (READY, then "
            "present without a state, then DOWNLOADING), nodes that were not asked to look are "
            "not excluded. The replica's shards pin it on their nodes until released."
        ),
    )
    weights_ready: bool | None = strawberry.field(
        default=False,
        description=(
            "Only nodes whose copy of `weights` is READY (verdict WEIGHTS_NOT_READY otherwise). "
            "Needs weights."
        ),
    )
    min_local_disk_free: Bytes | None = strawberry.field(
        default=None, description="A node whose local disk is unknown is not excluded."
    )
    label: KeyValueInput | None = None
    # Topology (contract-topology.graphql); see docs/scheduler/topology.md.
    nvlink_shards: bool | None = strawberry.field(
        default=False,
        description=(
            "Each shard's GPUs must lie in one NVLink group of its node. A node whose topology "
            "is unknown does not qualify."
        ),
    )
    same_nvlink_domain: bool | None = strawberry.field(
        default=False,
        description="Every shard in one multi-node NVLink domain (e.g. one GB200 NVL72 rack).",
    )
    rail_aligned: bool | None = strawberry.field(
        default=False,
        description=(
            "Every GPU of a shard must have a rail-aligned HCA on the chosen fabric; the shard is "
            "handed exactly those HCAs. Needs fabric."
        ),
    )
    max_age: int | None = strawberry.field(
        default=None,
        description=(
            "Seconds: only nodes whose GPU facts (Node.gpusObservedAt) are at most this old; the "
            "others get the verdict FACTS_STALE. Negative: refused."
        ),
    )
    tolerations: list[TolerationInput] | None = strawberry.field(
        default=None, description=TOLERATIONS + " A node short only of withheld GPUs: TAINTED."
    )
    # Tenancy (contract-tenancy.graphql); see docs/scheduler/tenancy.md.
    tenant: strawberry.ID | None = strawberry.field(default=None, description=TENANT)
    priority: int | None = strawberry.field(default=0, description=PRIORITY)
    deployment: str | None = strawberry.field(default=None, description=DEPLOYMENT)
    preemption: PreemptionPolicy | None = strawberry.field(
        default=PreemptionPolicy.NEVER,
        description="Whether replicas may be stopped to make room (see PreemptionPolicy).",
    )
    # Time (contract-time.graphql); see docs/scheduler/reservations.md and
    # docs/operations/maintenance.md.
    reservation: strawberry.ID | None = strawberry.field(
        default=None,
        description=(
            "Place into this reservation (its tenant only; only while it is ACTIVE or DEGRADED)."
        ),
    )
    until: datetime | None = strawberry.field(
        default=None,
        description=(
            "The replica promises to be released by then: it may use GPUs set aside for a later "
            "window or on nodes whose maintenance starts later; if still placed at that time its "
            "shards are told to stop."
        ),
    )

    def to_request(self) -> place_request.PlaceRequest:
        """The request as named; its tenant bound to the caller by the resolver (charges.bind)."""
        return place_request.PlaceRequest(
            replica_id=str(self.replica_id),
            gpu_class=self.gpu_class,
            shards=self.shards,
            gpus_per_shard=self.gpus_per_shard,
            fabric=self.fabric,
            weights=self.weights,
            min_local_disk_free=self.min_local_disk_free,
            label=(self.label.key, self.label.value) if self.label is not None else None,
            # Nullable in the contract: null asks for nothing, like false.
            nvlink_shards=bool(self.nvlink_shards),
            same_nvlink_domain=bool(self.same_nvlink_domain),
            rail_aligned=bool(self.rail_aligned),
            max_age=self.max_age,
            weights_ready=bool(self.weights_ready),
            tolerations=tolerations_of(self.tolerations),
            charge=charge_of(self.tenant, self.priority, self.deployment),
            preemption=self.preemption or PreemptionPolicy.NEVER,
            until=utc(self.until),
            reservation=None if self.reservation is None else str(self.reservation),
        )


strawberry.enum(verdicts.VerdictCode, name="VerdictCode")


@strawberry.type(description="One node's answer: the first check it failed, or FITS.")
class PlacementVerdict:
    node_id: strawberry.ID
    code: verdicts.VerdictCode
    detail: str = strawberry.field(
        description='For a person, e.g. "cordoned: kernel upgrade", "2 free H100-80GB, needs 4".'
    )

    @classmethod
    def of(cls, v: verdicts.Verdict) -> PlacementVerdict:
        return cls(node_id=strawberry.ID(v.node_id), code=v.code, detail=v.detail)


@strawberry.type(description="A placement group's role judged alone (placeGroup's Unplaceable).")
class RoleVerdict:
    role: str
    placeable: bool = strawberry.field(
        description="Whether the role's replicas fit without the group's other roles."
    )
    message: str


@strawberry.type(description="No room now. One verdict per node of the class, by id, bounded.")
class Unplaceable:
    message: str
    verdicts: list[PlacementVerdict]
    verdicts_omitted: int = strawberry.field(
        description="Nodes considered but left out of verdicts to keep the answer bounded."
    )
    roles: list[RoleVerdict] = strawberry.field(
        description=(
            "placeGroup: each role judged alone (verdicts are the failing role's, per node); "
            "empty for place."
        )
    )
    quota: QuotaShortfall | None = strawberry.field(
        description="Set when the tenant's limit is what refused it."
    )
    blocking_budgets: list[DisruptionBudget] = strawberry.field(
        description="The disruption budgets that kept preemption from making room."
    )

    @classmethod
    def of(cls, u: UnplaceableRecord) -> Unplaceable:
        return cls(
            message=u.message,
            verdicts=[PlacementVerdict.of(v) for v in u.verdicts],
            verdicts_omitted=u.omitted,
            roles=[
                RoleVerdict(role=r.role, placeable=r.placeable, message=r.message) for r in u.roles
            ],
            quota=QuotaShortfall.of(u.quota),
            blocking_budgets=[DisruptionBudget.of(b) for b in u.blocking_budgets],
        )


PlaceResult = Annotated[
    Allocated | Unplaceable | AllocationRejected, strawberry.union("PlaceResult")
]


@strawberry.type
class PlannedShard:
    shard_id: strawberry.ID
    node_id: strawberry.ID
    gpu_count: int


@strawberry.type(description="What place would do now; nothing is locked or held.")
class PlacementExplanation:
    placeable: bool
    message: str
    fabric: str | None
    nvlink_domain: str | None = strawberry.field(
        description="With sameNvlinkDomain: the NVLink domain the plan chose."
    )
    plan: list[PlannedShard]
    verdicts: list[PlacementVerdict]
    verdicts_omitted: int
    preemptions: list[Preemption] = strawberry.field(
        description="placeable is true when the place would succeed by preempting these."
    )

    @classmethod
    def of(cls, e: Explanation, gpus_per_shard: int) -> PlacementExplanation:
        planned: list[PlannedShard] = []
        names = iter(e.shard_ids)
        for node_id, count in e.plan.nodes if e.plan else ():
            for _ in range(count):
                planned.append(
                    PlannedShard(
                        shard_id=strawberry.ID(next(names)),
                        node_id=strawberry.ID(node_id),
                        gpu_count=gpus_per_shard,
                    )
                )
        return cls(
            placeable=e.placeable,
            message=e.message,
            fabric=e.plan.fabric if e.plan else None,
            nvlink_domain=e.plan.domain if e.plan else None,
            plan=planned,
            verdicts=[PlacementVerdict.of(v) for v in e.verdicts],
            verdicts_omitted=e.omitted,
            preemptions=[Preemption.of(p) for p in e.preemptions],
        )


@strawberry.type(description="How many nodes fail one check.")
class VerdictCount:
    code: verdicts.VerdictCode
    nodes: int


@strawberry.type(description="A node the counted replicas would use.")
class FitNode:
    node_id: strawberry.ID
    shards: int = strawberry.field(description="Shards of the counted replicas it would take.")
    gpus: int


@strawberry.type(
    description=(
        "How many more replicas of a shape fit now, by place's own planner; nothing is "
        "held or written."
    )
)
class Fit:
    replicas: int = strawberry.field(
        description=(
            "Replicas of the shape that place, called one by one now, would place; one more "
            "would be Unplaceable."
        )
    )
    nodes: list[FitNode] = strawberry.field(
        description=(
            "Where they would go, by node id, at most `first`. Among equally good nodes place "
            "picks at random, so it may use others of the same rank; the count is the same."
        )
    )
    nodes_omitted: int = strawberry.field(description="Nodes left out of `nodes` by `first`.")
    limited_by: list[VerdictCount] = strawberry.field(
        description=(
            "Per check, the nodes of the class that fail it once those replicas are placed "
            "(FITS left out), most nodes first: what stops one more."
        )
    )

    @classmethod
    def of(cls, f: FitRecord, gpus_per_shard: int) -> Fit:
        return cls(
            replicas=f.replicas,
            nodes=[
                FitNode(
                    node_id=strawberry.ID(n.node_id),
                    shards=n.shards,
                    gpus=n.shards * gpus_per_shard,
                )
                for n in f.nodes
            ],
            nodes_omitted=f.nodes_omitted,
            limited_by=[VerdictCount(code=code, nodes=count) for code, count in f.limited_by],
        )


class InvalidPlacement(InventoryError):
    """explainPlacement is a query: bad input is an error there, not a union member."""

    code = "BAD_INPUT"
