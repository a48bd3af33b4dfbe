"""A group charged to its tenant as one (issue 46): its GPUs by class, and the answer when its charge refuses it.

placeGroup and scaleGroup (placing.py) check the whole group's GPUs of a
class against the tenant's limit (tenancy/quota_claims.py: the members'
claims, or charge_group first for a group of several classes); fitGroup
(fitting.py) counts within it.
"""

from __future__ import annotations

from service.database.connections import Connection
from service.scheduling.groups.requests import GroupRequest
from service.scheduling.placement import Unplaceable
from service.scheduling.rejections import Rejection, refused_for_charge, shown
from service.scheduling.tenancy.charges import QuotaShortfall, Refusal
from service.scheduling.tenancy.headroom import headroom


def asked_by_class(group: GroupRequest) -> dict[str, int]:
    """The GPUs of each class the group's replicas take, all together: what its tenant is charged."""
    asked: dict[str, int] = {}
    for r in group.roles:
        asked[r.shape.gpu_class] = asked.get(r.shape.gpu_class, 0) + r.replicas * r.shape.gpus
    return asked


def group_shortfall(group: GroupRequest, refusal: Refusal) -> Unplaceable | Rejection:
    """A group its charge refused: Unplaceable naming the quota, or INVALID for no such tenant."""
    if isinstance(refusal, QuotaShortfall):
        message = (
            f"group {shown(group.group_id)} does not fit its tenant's limit: {refusal.sentence()}"
        )
        return Unplaceable(message, (), 0, quota=refusal)
    return refused_for_charge(refusal)


async def refused_charge(
    conn: Connection, group: GroupRequest, refusal: Refusal
) -> Unplaceable | Rejection:
    """The answer to a group a claim's charge refused, in the group's numbers.

    A member's claim is refused with the member's numbers (what the group's
    earlier members took counted as used); the group is charged as one, so
    the answer says what the tenant holds (the claim was rolled back) and
    what the whole group asks.
    """
    if isinstance(refusal, QuotaShortfall):
        over = await quota_first(conn, group)
        if over is not None:
            return over
    return group_shortfall(group, refusal)


async def quota_first(conn: Connection, group: GroupRequest) -> Unplaceable | Rejection | None:
    """For a group that found no room: would its tenant's limit refuse it anyway? (the more useful answer)."""
    asked = asked_by_class(group)
    standing = await headroom(conn, group.charge.tenant_id, asked)
    for gpu_class in sorted(asked):
        refusal = standing[gpu_class].refusal(asked[gpu_class])
        if refusal is not None:
            return group_shortfall(group, refusal)
    return None
