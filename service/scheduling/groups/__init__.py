"""Placement groups (issue 39): roles of replicas placed as one unit, close on the KV-cache path.

Disaggregated serving splits prefill and decode into replicas that stream
the KV cache from one to the other; a deployment is useful only whole and
fast only when the two sides are close. A group is placed all or nothing,
its members are ordinary replicas (<groupId>-<role>-<n>), and each role's
shape is a PlaceRequest read and claimed through place()'s own primitives,
so every rule of "offered" (service/scheduling/availability.py) and every
term of the ranking (service/scheduling/ranking.py) applies to members.

The package, by idea: requests.py (the group as asked, its checks),
paths.py (which path a KV pair gets), board.py (the classes of like nodes a
plan is made on, and the nodes it opened), packing.py (how takes share a
node's GPUs: the one rule of plan and claim), planning.py (where the
replicas would go: a complete search, locality as a score, pure), reads.py
(the board, a placed group), claiming.py (a plan claimed under its nodes'
locks), placing.py (placeGroup, scaleGroup, releaseGroup), charging.py (a
group charged to its tenant as one), fitting.py (fitGroup), explaining.py
(explainGroupPlacement).
"""

from service.scheduling.groups.explaining import GroupExplanation, explain_group
from service.scheduling.groups.fitting import GroupFit, fit_group
from service.scheduling.groups.paths import KvPathKind
from service.scheduling.groups.placing import (
    GroupGenerationConflict,
    place_group,
    release_group,
    scale_group,
)
from service.scheduling.groups.reads import (
    KvPath,
    MemberRecord,
    StoredGroup,
    list_groups,
    read_group,
)
from service.scheduling.groups.requests import (
    GroupRequest,
    GroupRole,
    Locality,
    LocalityLevel,
    validate_group,
)

__all__ = [
    "GroupExplanation",
    "GroupFit",
    "GroupGenerationConflict",
    "GroupRequest",
    "GroupRole",
    "KvPath",
    "KvPathKind",
    "Locality",
    "LocalityLevel",
    "MemberRecord",
    "StoredGroup",
    "explain_group",
    "fit_group",
    "list_groups",
    "place_group",
    "read_group",
    "release_group",
    "scale_group",
    "validate_group",
]
