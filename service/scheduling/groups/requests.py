"""A placement group as a scheduler asks for it, and the checks that need no database.

A group is roles (so many replicas of one shape each), a locality (how close
its replicas should be, hard or preferred) and which role sends KV cache to
which. Each role's shape is a PlaceRequest, so every rule place applies to a
replica (availability, verdicts, topology, weights) applies to a member.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Any

from service.bounds import MAX_GROUP_REPLICAS, MAX_GROUP_ROLES
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement.plan import MAX_REPLICA_ID_LENGTH, validate_place
from service.scheduling.rejections import Rejection, invalid, invalid_field, shown
from service.scheduling.taints import tolerations_json, tolerations_of
from service.scheduling.tenancy.charges import (
    DEFAULT_TENANT,
    UNNAMED,
    Charge,
    PreemptionPolicy,
    charge_problem,
)
from service.stored_text import id_problem


class LocalityLevel(Enum):
    """How close a group's replicas should be, closest first."""

    NODE = "NODE"
    NVLINK_DOMAIN = "NVLINK_DOMAIN"
    LABEL = "LABEL"
    FABRIC = "FABRIC"
    ANY = "ANY"


@dataclass(frozen=True)
class Locality:
    level: LocalityLevel = LocalityLevel.ANY
    # LABEL: the node label whose value nodes share (a rack, a leaf switch).
    label: str | None = None
    # Hard: the whole group in one zone of `level`, or Unplaceable. Otherwise
    # the closest level that fits (a preference; llm-d #2315 found a hard
    # host filter raised latency).
    hard: bool = False


@dataclass(frozen=True)
class GroupRole:
    role: str
    replicas: int
    # The shape of each replica; its replica_id names nothing.
    shape: PlaceRequest


@dataclass(frozen=True)
class GroupRequest:
    group_id: str
    roles: tuple[GroupRole, ...]
    locality: Locality = Locality()
    kv_from: str | None = None
    kv_to: str | None = None
    # Who the whole group is charged to (service/scheduling/tenancy/): every
    # member carries it, and the group is checked against the tenant's limit
    # as one. Its roles' shapes name none.
    charge: Charge = UNNAMED
    preemption: PreemptionPolicy = PreemptionPolicy.NEVER

    def role(self, name: str) -> GroupRole | None:
        return next((r for r in self.roles if r.role == name), None)

    @property
    def max_age(self) -> int | None:
        """The tightest maxAge of its roles' shapes: how stale a read of the fleet it may take."""
        ages = [r.shape.max_age for r in self.roles if r.shape.max_age is not None]
        return min(ages) if ages else None

    def spec(self) -> dict[str, Any]:
        """The group as stored, to tell a retry (the same spec) from a clash (another).

        In JSON's terms (lists, not tuples), so it compares equal to itself read back.
        """
        spec: dict[str, Any] = json.loads(json.dumps(self._spec()))
        return spec

    def _spec(self) -> dict[str, Any]:
        return {
            "roles": [
                {
                    "role": r.role,
                    "replicas": r.replicas,
                    "shape": shape_spec(r.shape),
                }
                for r in self.roles
            ],
            "locality": {
                "level": self.locality.level.value,
                "label": self.locality.label,
                "hard": self.locality.hard,
            },
            "kvFrom": self.kv_from,
            "kvTo": self.kv_to,
            "charge": {
                "tenant": self.charge.tenant,
                "priority": self.charge.priority,
                "deployment": self.charge.deployment,
            },
            "preemption": self.preemption.value,
        }


def member_id(group_id: str, role: str, n: int) -> str:
    """A member's replica id: <groupId>-<role>-<n>, n from 0 (the contract's form)."""
    return f"{group_id}-{role}-{n}"


def shape_of(
    role: str, shape: PlaceRequest, group_id: str, n: int, charge: Charge = UNNAMED
) -> PlaceRequest:
    """The PlaceRequest of member n of a role: the role's shape under the member's replica id,
    charged as its group."""
    return replace(shape, replica_id=member_id(group_id, role, n), charge=charge)


def validate_group_id(group_id: str) -> Rejection | None:
    if not group_id:
        return invalid("groupId is empty")
    problem = id_problem(group_id)
    if problem is not None:
        return invalid(f"groupId {shown(group_id)!r}: {problem}")
    return None


def validate_role(
    group_id: str, where: str, role: GroupRole, highest: int | None = None
) -> Rejection | None:
    """A role's name, count and shape; `highest`: the largest member number it will have."""
    name = role.role
    if not name or id_problem(name) is not None:
        return invalid(f"{where}.role {shown(name)!r} is not a role name")
    if role.replicas < 1:
        return invalid(f"{where}.replicas={role.replicas}: a role has 1 or more replicas")
    if role.replicas > MAX_GROUP_REPLICAS:
        return invalid(
            f"{where}.replicas={role.replicas}: a group has at most {MAX_GROUP_REPLICAS} replicas"
        )
    last = member_id(group_id, name, highest if highest is not None else role.replicas - 1)
    if len(last) > MAX_REPLICA_ID_LENGTH:
        return invalid(
            f"{where}: replica id {shown(last)!r} (groupId-role-n) is longer than "
            f"{MAX_REPLICA_ID_LENGTH} characters"
        )
    if role.shape.charge.named or role.shape.preemption is not PreemptionPolicy.NEVER:
        return invalid(
            f"{where}.shape: names a tenant, priority, deployment or preemption; a group is "
            "charged, prioritized and preempted for as one: name them on the group"
        )
    if role.shape.until is not None or role.shape.reservation is not None:
        # Not built for groups (issue 47): refused rather than placed without the
        # promise or outside the reservation the caller named.
        named = "until" if role.shape.until is not None else "reservation"
        return invalid(
            f"{where}.shape.{named}: a group's members are placed neither with a promise to be "
            "gone by a time nor into a reservation; place such replicas one by one"
        )
    problem = validate_place(replace(role.shape, replica_id=last))
    if problem is not None:
        return invalid(f"{where}.shape: {problem.message}")
    return None


def validate_group(request: GroupRequest) -> Rejection | None:
    """What can be refused without reading the database: nothing is held for it."""
    problem = validate_group_id(request.group_id)
    if problem is not None:
        return problem
    charge = charge_problem(request.charge)
    if charge is not None:
        return invalid_field(*charge)
    if not request.roles:
        return invalid("roles is empty: a group has at least one role")
    if len(request.roles) > MAX_GROUP_ROLES:
        return invalid(f"{len(request.roles)} roles: a group has at most {MAX_GROUP_ROLES}")
    seen: set[str] = set()
    for i, role in enumerate(request.roles):
        where = f"roles[{i}]"
        if role.role in seen:
            return invalid(f"{where}.role {shown(role.role)!r} appears twice in this group")
        seen.add(role.role)
        problem = validate_role(request.group_id, where, role)
        if problem is not None:
            return problem
    total = sum(r.replicas for r in request.roles)
    if total > MAX_GROUP_REPLICAS:
        return invalid(f"roles ask for {total} replicas: a group has at most {MAX_GROUP_REPLICAS}")
    locality = request.locality
    if locality.level is LocalityLevel.LABEL and not locality.label:
        return invalid("locality.label is missing: level LABEL names the label nodes share")
    if locality.label is not None and locality.level is not LocalityLevel.LABEL:
        return invalid(
            f"locality.label {shown(locality.label)!r} is read only with level LABEL, "
            f"not {locality.level.value}"
        )
    if locality.label is not None and id_problem(locality.label) is not None:
        return invalid(f"locality.label {shown(locality.label)!r} is not a label key")
    for field, name in (("kvFrom", request.kv_from), ("kvTo", request.kv_to)):
        if name is not None and name not in seen:
            return invalid(f"{field} {shown(name)!r} names no role of this group")
    if (request.kv_from is None) != (request.kv_to is None):
        return invalid("kvFrom and kvTo go together: which role sends KV cache to which")
    if request.kv_from is not None and request.kv_from == request.kv_to:
        return invalid(f"kvFrom and kvTo are both {shown(request.kv_from)!r}: name two roles")
    return None


def shape_spec(shape: PlaceRequest) -> dict[str, Any]:
    """A role's shape as its group's spec stores it (JSON's terms; shape_of_spec reads it back).

    The tolerations in the form shards keep them (taints.tolerations_json):
    asdict() alone would leave their enums, which JSON cannot hold.
    """
    fields = asdict(replace(shape, replica_id=""))
    fields["tolerations"] = json.loads(tolerations_json(shape.tolerations))
    # The group's, not the role's (GroupRequest.charge): kept once, in the spec.
    del fields["charge"], fields["preemption"]
    # Never set on a stored group's shapes (validate_role refuses until and
    # reservation; `at` is fitGroup's question, not the group's).
    del fields["until"], fields["reservation"], fields["at"]
    return fields


def shape_of_spec(fields: dict[str, Any]) -> PlaceRequest:
    """shape_spec's answer as the PlaceRequest it came from (equal to it, tolerations included)."""
    label = fields.get("label")
    return PlaceRequest(
        **{
            **fields,
            "label": tuple(label) if label is not None else None,
            "tolerations": tolerations_of(fields.get("tolerations")),
        }
    )


def request_from_spec(group_id: str, spec: dict[str, Any]) -> GroupRequest:
    """A stored group's spec (GroupRequest.spec) as a request again."""
    locality = spec["locality"]
    # A group placed before tenancy (migration 0022) was the default tenant's.
    charge = spec.get("charge") or {}
    return GroupRequest(
        group_id=group_id,
        roles=tuple(
            GroupRole(r["role"], int(r["replicas"]), shape_of_spec(r["shape"]))
            for r in spec["roles"]
        ),
        locality=Locality(LocalityLevel(locality["level"]), locality["label"], locality["hard"]),
        kv_from=spec["kvFrom"],
        kv_to=spec["kvTo"],
        charge=Charge(
            charge.get("tenant", DEFAULT_TENANT),
            int(charge.get("priority", 0)),
            charge.get("deployment"),
        ),
        preemption=PreemptionPolicy(spec.get("preemption", PreemptionPolicy.NEVER.value)),
    )
