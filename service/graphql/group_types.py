"""GraphQL types of placement groups (contract-groups.graphql): inputs, the placed group, its fit."""

from __future__ import annotations

from typing import Annotated

import strawberry

from service.scheduling.groups import (
    GroupExplanation,
    GroupRequest,
    GroupRole,
    KvPathKind,
    Locality,
    LocalityLevel,
    StoredGroup,
)
from service.scheduling.groups import (
    GroupFit as GroupFitRecord,
)
from service.scheduling.tenancy.charges import PreemptionPolicy

from .allocation_types import (
    DEPLOYMENT,
    PRIORITY,
    TENANT,
    AllocationRejected,
    PlaceInput,
    PlacementVerdict,
    Unplaceable,
)
from .tenancy_types import Preemption, charge_of
from .types import Allocation

strawberry.enum(LocalityLevel, name="LocalityLevel")
strawberry.enum(KvPathKind, name="KvPathKind")


@strawberry.input(
    description=(
        "How close a group's replicas should be: NODE closest, ANY no constraint. LABEL: nodes "
        "sharing the value of `label` (e.g. a rack or leaf-switch label) count as close."
    )
)
class GroupLocalityInput:
    level: LocalityLevel
    label: str | None = None
    hard: bool = False

    def to_locality(self) -> Locality:
        return Locality(self.level, self.label, self.hard)


@strawberry.input(
    description=(
        "One role of a group: `replicas` replicas of `shape` (PlaceInput as fit reads it: its "
        "replicaId names nothing)."
    )
)
class GroupRoleInput:
    role: str
    replicas: int
    shape: PlaceInput

    def to_role(self) -> GroupRole:
        return GroupRole(self.role, self.replicas, self.shape.to_request())


@strawberry.input
class PlaceGroupInput:
    group_id: strawberry.ID
    roles: list[GroupRoleInput]
    locality: GroupLocalityInput | None = None
    kv_from: str | None = strawberry.field(
        default=None,
        description=(
            "Which roles send KV cache to which, for kvPaths and the locality score "
            "(e.g. prefill -> decode)."
        ),
    )
    kv_to: str | None = None
    # A group is charged, prioritized and preempted for as one: its roles'
    # shapes name none of these (contract-tenancy.graphql).
    tenant: strawberry.ID | None = strawberry.field(default=None, description=TENANT)
    priority: int | None = strawberry.field(default=0, description=PRIORITY)
    deployment: str | None = strawberry.field(default=None, description=DEPLOYMENT)
    preemption: PreemptionPolicy | None = strawberry.field(
        default=PreemptionPolicy.NEVER,
        description="For the whole group or not at all (see PreemptionPolicy).",
    )

    def to_request(self) -> GroupRequest:
        """The group as named; its tenant bound to the caller by the resolver (charges.bind)."""
        return GroupRequest(
            group_id=str(self.group_id),
            roles=tuple(r.to_role() for r in self.roles),
            locality=self.locality.to_locality() if self.locality is not None else Locality(),
            kv_from=self.kv_from,
            kv_to=self.kv_to,
            charge=charge_of(self.tenant, self.priority, self.deployment),
            preemption=self.preemption or PreemptionPolicy.NEVER,
        )


@strawberry.type(description="The path a KV-cache transfer between two replicas gets.")
class KvPath:
    from_: strawberry.ID = strawberry.field(name="from")
    to: strawberry.ID
    kind: KvPathKind


@strawberry.type
class GroupMember:
    role: str
    replica_id: strawberry.ID
    allocations: list[Allocation] = strawberry.field(
        description="Its shards; empty once the replica was released on its own (releaseReplica)."
    )


@strawberry.type(description="A placed group: its members, ordinary replicas, and their KV paths.")
class GroupPlaced:
    group_id: strawberry.ID
    generation: int = strawberry.field(
        description="Moves up with every scaleGroup; scaleGroup and releaseGroup naming another: CONFLICT."
    )
    members: list[GroupMember]
    kv_paths: list[KvPath] = strawberry.field(
        description="For each kvFrom replica, every kvTo replica and the path the pair gets."
    )
    preempted: list[Preemption] = strawberry.field(
        description="The replicas stopped to make room for the group; empty on free GPUs."
    )

    @classmethod
    def of(cls, g: StoredGroup) -> GroupPlaced:
        return cls(
            preempted=[Preemption.of(p) for p in g.preempted],
            group_id=strawberry.ID(g.group_id),
            generation=g.generation,
            members=[
                GroupMember(
                    role=m.role,
                    replica_id=strawberry.ID(m.replica_id),
                    allocations=[Allocation.of(s) for s in m.shards],
                )
                for m in g.members
            ],
            kv_paths=[
                KvPath(from_=strawberry.ID(p.from_id), to=strawberry.ID(p.to_id), kind=p.kind)
                for p in g.kv_paths
            ],
        )


PlaceGroupResult = Annotated[
    GroupPlaced | Unplaceable | AllocationRejected, strawberry.union("PlaceGroupResult")
]


@strawberry.type
class GroupFit:
    groups: int = strawberry.field(
        description="How many more whole groups placeGroup would place now, one after another."
    )
    limited_by: list[str] = strawberry.field(
        description=(
            "What stops the next one: the role that finds no room first, at which locality "
            "level, and that role's verdicts (code and nodes) as the counted groups leave them."
        )
    )

    @classmethod
    def of(cls, f: GroupFitRecord) -> GroupFit:
        return cls(groups=f.groups, limited_by=list(f.limited_by))


@strawberry.type(description="A role of the group judged alone, with its verdicts per node.")
class RoleExplanation:
    role: str
    placeable: bool = strawberry.field(
        description="Whether the role's replicas fit without the group's other roles."
    )
    message: str
    verdicts: list[PlacementVerdict] = strawberry.field(
        description="Per node of the role's class (the first by id), the first check that fails."
    )
    verdicts_omitted: int


@strawberry.type(description="Where placeGroup would put a member now.")
class PlannedMember:
    role: str
    replica_id: strawberry.ID
    node_ids: list[strawberry.ID] = strawberry.field(description="One entry per shard.")
    fabric: str | None


@strawberry.type(description="What placeGroup would do now; nothing is locked or held.")
class GroupPlacementExplanation:
    placeable: bool
    message: str
    level: LocalityLevel | None = strawberry.field(
        description="The locality level the best plan reaches (null: no plan)."
    )
    zone: str | None = strawberry.field(
        description="Its zone: the node, NVLink domain, label value or fabric."
    )
    members: list[PlannedMember]
    kv_paths: list[KvPath]
    roles: list[RoleExplanation]

    @classmethod
    def of(cls, e: GroupExplanation) -> GroupPlacementExplanation:
        return cls(
            placeable=e.placeable,
            message=e.message,
            level=e.level,
            zone=e.zone,
            members=[
                PlannedMember(
                    role=m.role,
                    replica_id=strawberry.ID(m.replica_id),
                    node_ids=[strawberry.ID(n) for n, k in m.nodes for _ in range(k)],
                    fabric=m.fabric,
                )
                for m in e.members
            ],
            kv_paths=[
                KvPath(from_=strawberry.ID(p.from_id), to=strawberry.ID(p.to_id), kind=p.kind)
                for p in e.kv_paths
            ],
            roles=[
                RoleExplanation(
                    role=r.role,
                    placeable=r.placeable,
                    message=r.message,
                    verdicts=[PlacementVerdict.of(v) for v in r.verdicts],
                    verdicts_omitted=r.omitted,
                )
                for r in e.roles
            ],
        )
