"""Why a replica does not fit, and what place() would answer now: the verdicts and their messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.database.connections import Connection, cached_text
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import preemption
from service.scheduling.placement.plan import Plan, shard_ids, validate_place
from service.scheduling.placement.statements import (
    CLASSES,
    SURVEY_COUNT,
    facts_of,
    plan_now,
    request_params,
    survey_sql,
)
from service.scheduling.rejections import Rejection, refused_for_charge, shown
from service.scheduling.tenancy.budgets import BudgetRecord
from service.scheduling.tenancy.charges import (
    PreemptionPolicy,
    QuotaShortfall,
    Refusal,
    UnknownTenant,
)
from service.scheduling.tenancy.headroom import refusal_now
from service.scheduling.tenancy.victims import Preemption
from service.scheduling.verdicts import NodeFacts, Verdict, VerdictCode, judge

# Verdicts are listed for at most this many nodes (by id); the answer says
# how many more were considered, so it stays readable on a 10,000-node cluster.
MAX_VERDICTS = 100


@dataclass(frozen=True)
class RoleVerdict:
    """A placement group's role, judged alone: whether its replicas fit without the other roles."""

    role: str
    placeable: bool
    message: str


@dataclass(frozen=True)
class Unplaceable:
    message: str
    verdicts: tuple[Verdict, ...]
    omitted: int
    # A placement group's roles (service/scheduling/groups/); empty for place.
    roles: tuple[RoleVerdict, ...] = ()
    # Set when the tenant's limit is what refused it (service/scheduling/tenancy/).
    quota: QuotaShortfall | None = None
    # The disruption budgets that kept preemption from making room.
    blocking_budgets: tuple[BudgetRecord, ...] = ()


@dataclass(frozen=True)
class Explanation:
    placeable: bool
    message: str
    verdicts: tuple[Verdict, ...]
    omitted: int
    plan: Plan | None
    shard_ids: tuple[str, ...]
    # The replicas place would stop to make room (preemption); none on free GPUs.
    preemptions: tuple[Preemption, ...] = ()
    # Set when the tenant's limit is what keeps it from being placed.
    quota: QuotaShortfall | None = None


async def verdicts_of(conn: Connection, request: PlaceRequest) -> tuple[tuple[Verdict, ...], int]:
    """Per node of the class (the first MAX_VERDICTS by id), the first check it fails; and how many more."""
    return await _verdicts(conn, request)


async def _verdicts(conn: Connection, request: PlaceRequest) -> tuple[tuple[Verdict, ...], int]:
    rows = await conn.execute(
        cached_text(survey_sql(request)), {**request_params(request), "limit": MAX_VERDICTS}
    )
    verdicts = tuple(judge(facts_of(r), request) for r in rows)
    total = (await conn.execute(SURVEY_COUNT, {"cls": request.gpu_class})).scalar_one()
    return verdicts, max(0, int(total) - len(verdicts))


def _shape(request: PlaceRequest) -> str:
    shards = "1 shard" if request.shards == 1 else f"{request.shards} shards"
    return f"{shards} of {request.gpus_per_shard} {request.gpu_class}"


async def _why_not(
    conn: Connection,
    request: PlaceRequest,
    facts: Sequence[NodeFacts],
    considered: int,
) -> str:
    if considered == 0:
        classes = [r.gpu_class for r in await conn.execute(CLASSES)]
        known = f"; classes here: {', '.join(classes)}" if classes else "; no GPUs are registered"
        return f"no node has {shown(request.gpu_class)} GPUs{known}"
    fitting = [f for f in facts if judge(f, request).fits]
    nodes = "node" if considered == 1 else "nodes"
    if request.shards == 1 or not fitting:
        return (
            f"no node has room for a shard of {request.gpus_per_shard} {request.gpu_class} "
            f"that meets every constraint ({considered} {nodes} with {request.gpu_class} considered)"
        )
    by_fabric = {
        fabric: sum(f.room(request) for f in fitting if fabric in f.fabrics)
        for fabric in sorted({x for f in fitting for x in f.fabrics})
        if request.fabric is None or fabric == request.fabric
    }
    if by_fabric:
        fabric, most = min(by_fabric.items(), key=lambda item: (-item[1], item[0]))
        best = f"at most {most} fit on fabric {fabric}"
    else:
        best = "the nodes with room share no fabric"
    return (
        f"{_shape(request)} fit on no single node, and no fabric has room for all of them: {best}"
    )


async def unplaceable(
    conn: Connection,
    request: PlaceRequest,
    facts: Sequence[NodeFacts],
) -> Unplaceable:
    verdicts, omitted = await _verdicts(conn, request)
    message = await _why_not(conn, request, facts, len(verdicts) + omitted)
    if omitted:
        message += f" (verdicts for the first {len(verdicts)} nodes by id; {omitted} more)"
    return Unplaceable(message, verdicts, omitted)


def within_limit(verdicts: Sequence[Verdict], shortfall: QuotaShortfall) -> tuple[Verdict, ...]:
    """The verdicts as the tenant's limit leaves them: a node that would fit is QUOTA_EXCEEDED."""
    said = (
        f"the tenant's limit: {shortfall.tenant} holds {shortfall.used} {shortfall.gpu_class} "
        f"of {shortfall.limit}, needs {shortfall.asked} more"
    )
    return tuple(
        Verdict(v.node_id, VerdictCode.QUOTA_EXCEEDED, f"{v.detail}; but {said}") if v.fits else v
        for v in verdicts
    )


async def refused_placement(
    conn: Connection, request: PlaceRequest, refusal: Refusal
) -> Unplaceable | Rejection:
    """place()'s answer to a claim its charge refused.

    Past the tenant's limit: Unplaceable naming the tenant, the class, what
    it holds, its limit and what was asked (quota), with the verdicts of
    the nodes of the class (those that would fit are QUOTA_EXCEEDED). No
    such tenant: INVALID.
    """
    if not isinstance(refusal, QuotaShortfall):
        return refused_for_charge(refusal)
    verdicts, omitted = await _verdicts(conn, request)
    return Unplaceable(refusal.sentence(), within_limit(verdicts, refusal), omitted, quota=refusal)


async def explain(conn: Connection, request: PlaceRequest) -> Explanation | Rejection:
    """What place() would answer now, without locking or writing anything."""
    problem = validate_place(request)
    if problem is not None:
        return problem
    refusal = await refusal_now(conn, request.charge.tenant_id, request.gpu_class, request.gpus)
    if isinstance(refusal, UnknownTenant):
        return refused_for_charge(refusal)
    if isinstance(refusal, QuotaShortfall):
        refused = await refused_placement(conn, request, refusal)
        assert isinstance(refused, Unplaceable)
        return Explanation(
            False, refused.message, refused.verdicts, refused.omitted, None, (), quota=refusal
        )
    facts, plan = await plan_now(conn, request)
    preempting: tuple[Preemption, ...] = ()
    if plan is None:
        why = await unplaceable(conn, request, facts)
        if request.preemption is not PreemptionPolicy.LOWER_PRIORITY:
            return Explanation(False, why.message, why.verdicts, why.omitted, None, ())
        # The search place() would make, on the same data (its trials roll back).
        choice = await preemption.choose(conn, request, explaining=True)
        if isinstance(choice, preemption.NoChoice):
            message = f"{why.message}; preemption: {choice.why}"
            return Explanation(False, message, why.verdicts, why.omitted, None, ())
        plan, preempting = choice.plan, choice.records(request)
    verdicts, omitted = await _verdicts(conn, request)
    where = ", ".join(f"{n} ({k})" if k > 1 else n for n, k in plan.nodes)
    on = f" on fabric {plan.fabric}" if plan.fabric else ""
    if plan.domain is not None:
        on += f" in NVLink domain {plan.domain}"
    message = f"would place {_shape(request)} on {where}{on}"
    if preempting:
        message += " by preempting " + ", ".join(p.replica_id for p in preempting)
    return Explanation(
        True, message, verdicts, omitted, plan, tuple(shard_ids(request)), preemptions=preempting
    )
