"""A fault the policy acts on: the remediation it opens or joins, its taint, the circuit breaker.

One path for every fault (an XID, a health reason, a new drift finding on
GPUs of a node whose row the caller locked), whether it opens a remediation
or joins one: a fault that joined an open remediation once did nothing but
raise its action, so XID 48 after XID 94 left the GPU untainted, XID 74 after
XID 79 on another GPU of the NVLink group left the rest of the group offered,
and a remediation could stay RESTART_APP on a GPU its faults asked to reset
(issue 44). Now:

- The GPUs a fault concerns are its rule's scope: the GPU, every GPU of its
  NVLink group, or the node's GPUs (scoped).
- Each open remediation holding some of them (XIDs' and health reasons':
  drift is apart, policy.is_drift) is joined for those GPUs, oldest first:
  the fault's taint goes on them, the remediation's action rises to the
  fault's when that is more drastic (its action is the most drastic of its
  faults'), and one waiting for validation goes back to PENDING when the
  fault taints (what was carried out did not stop it: a validation must not
  re-admit a GPU that faulted since).
- The GPUs no open remediation holds open one new remediation of the fault,
  PENDING, or ESCALATED (CONTACT_SUPPORT, at least NO_SCHEDULE) when one of
  them was in a DONE or ESCALATED remediation within the policy's window.
  So open remediations never share a GPU, each GPU's faults are worked on by
  one remediation, and its DONE (validated on its GPUs) lifts what its
  faults put there (remediations.close).
- Each of these parts passes the circuit breaker on its own: the GPUs of a
  class the policy tainted in the last hour, counted once however many
  faults tainted them, may not pass the policy's limit (Policy.breaker_limit).
  Past it the part is not tainted: a new remediation is SUPPRESSED, a join
  changes nothing of the remediation; an event says why. Serialized per class
  (an advisory lock taken after the node's row lock, as every caller holds
  it), so two reports cannot both take the last place under the limit.

Every part acted on is a row of remediation_faults (the trigger, its GPUs,
its taint key, when), which is what the breaker counts, what a reboot keeps
sticky, and what the remediation's DONE lifts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Row

from service.bounds import MAX_TEXT_LENGTH
from service.database.connections import Connection
from service.event_log.events import record_event
from service.fleet.health.policy import (
    SEVERITY,
    Policy,
    RemediationAction,
    Rule,
    Scope,
    current,
    is_drift,
)
from service.fleet.health.remediations import (
    COLUMNS,
    NOT_DRIFT_SQL,
    OPEN_SQL,
    Remediation,
    RemediationState,
    detail_of,
    effect_of,
    of_row,
)
from service.fleet.health.taints import TaintRequest, put_taint
from service.scheduling.taints import TaintSource


@dataclass(frozen=True)
class Fault:
    """What the policy acts on: a trigger on GPUs of a node (the node's row locked by the caller)."""

    gpu_indices: tuple[int, ...]
    # A key: the taint's and the remediation's (xid-79, health-row_remap_failed).
    trigger: str
    cause: str
    rule: Rule
    source: TaintSource


@dataclass(frozen=True)
class Acted:
    """What became of a fault, for the GPUs at fault: the remediation they are in now (the one it
    made or joined; None when its rule does nothing), and whether the breaker kept its taint
    off them."""

    remediation: Remediation | None
    suppressed: bool


def scoped(rule: Rule, at_fault: Sequence[int], gpus: Sequence[Row[Any]]) -> tuple[int, ...]:
    """The GPUs a rule's scope covers: the ones at fault, their NVLink groups, or the node's."""
    if rule.scope is Scope.NODE:
        return tuple(g.idx for g in gpus)
    if rule.scope is Scope.NVLINK_GROUP:
        groups = {g.nvlink_group for g in gpus if g.idx in at_fault and g.nvlink_group is not None}
        return tuple(sorted({*at_fault, *(g.idx for g in gpus if g.nvlink_group in groups)}))
    return tuple(sorted(set(at_fault)))


_GPUS = text("SELECT idx, gpu_class, nvlink_group FROM gpus WHERE node_id = :node_id ORDER BY idx")
_OPEN_ON = text(
    f"""
    SELECT {COLUMNS} FROM remediations r
    WHERE r.node_id = :node_id AND r.state IN {OPEN_SQL}
      AND r.gpu_indices && CAST(:indices AS int[]) AND {NOT_DRIFT_SQL}
    ORDER BY r.id
    """
)
_DONE_RECENTLY = text(
    """
    SELECT EXISTS (SELECT 1 FROM remediations r
                   WHERE r.node_id = :node_id AND r.state IN ('DONE', 'ESCALATED')
                     AND r.gpu_indices && CAST(:indices AS int[])
                     AND r.created_at > now() - make_interval(secs => :window))
    """
)
# The breaker's count, under the class's advisory lock: the GPUs the policy
# tainted in the last hour (each once, however many faults did: a node's
# drift findings all cover its GPUs, and a GPU's later faults join its
# remediation), those of this node among them, and the class's size.
_BREAKER_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended('llmgw-breaker:' || :cls, 0))")
_BREAKER = text(
    """
    WITH counted AS (
        SELECT DISTINCT r.node_id, i.idx FROM remediation_faults f
        JOIN remediations r ON r.id = f.remediation_id
        CROSS JOIN LATERAL unnest(f.gpu_indices) AS i(idx)
        WHERE f.gpu_class = :cls AND f.taint_key IS NOT NULL
          AND f.at > now() - interval '1 hour'
    )
    SELECT (SELECT count(*) FROM counted) AS tainted,
           (SELECT coalesce(array_agg(idx), '{}') FROM counted
            WHERE node_id = :node_id) AS here,
           (SELECT coalesce(sum(p.total), 0) FROM gpu_pools p WHERE p.gpu_class = :cls) AS total
    """
)
_INSERT = text(
    f"""
    INSERT INTO remediations AS r (node_id, gpu_indices, gpu_class, action, state, scope, cause,
                                   trigger, taint_key)
    VALUES (:node_id, :indices, :cls, :action, :state, :scope, :cause, :trigger, :taint_key)
    RETURNING {COLUMNS}
    """
)
# A fault seen again on the same GPUs of the same remediation refreshes its
# row (its taint's time, for the breaker) instead of adding one: a GPU that
# raises XID 48 every minute keeps one row per trigger.
_FAULT = text(
    """
    WITH again AS (
        UPDATE remediation_faults f
        SET taint_key = coalesce(CAST(:taint_key AS text), f.taint_key),
            at = CASE WHEN CAST(:fresh AS boolean) THEN now() ELSE f.at END
        WHERE f.id = (SELECT o.id FROM remediation_faults o
                      WHERE o.remediation_id = CAST(:id AS bigint)
                        AND o.trigger = CAST(:trigger AS text)
                        AND o.gpu_indices = CAST(:indices AS int[])
                      ORDER BY o.id LIMIT 1)
        RETURNING f.id
    )
    INSERT INTO remediation_faults (remediation_id, gpu_class, gpu_indices, scope, trigger, action,
                                    cause, taint_key)
    SELECT CAST(:id AS bigint), CAST(:cls AS text), CAST(:indices AS int[]),
           CAST(:scope AS text), CAST(:trigger AS text), CAST(:action AS text),
           CAST(:cause AS text), CAST(:taint_key AS text)
    WHERE NOT EXISTS (SELECT 1 FROM again)
    """
)
_JOIN = text(
    f"""
    UPDATE remediations r
    SET action = :action, state = :state, taint_key = coalesce(r.taint_key, :taint_key),
        since = CASE WHEN r.state = :state THEN r.since ELSE now() END
    WHERE r.id = :id
    RETURNING {COLUMNS}
    """
)
# Whether the taint is already on every GPU (or on the node: on_node) with
# this effect: a fault seen again puts nothing again, and takes no new place
# under the breaker.
_IN_PLACE = text(
    """
    SELECT count(*) = CASE WHEN CAST(:on_node AS boolean) THEN 1
                           ELSE cardinality(CAST(:indices AS int[])) END
    FROM taints t
    WHERE t.node_id = :node_id AND t.key = :key AND t.effect = :effect
      AND CASE WHEN CAST(:on_node AS boolean) THEN t.gpu_index IS NULL
               ELSE t.gpu_index = ANY(CAST(:indices AS int[])) END
    """
)


@dataclass(frozen=True)
class _Verdict:
    """The breaker's answer for a part: whether it is suppressed, and why."""

    suppressed: bool
    why: str = ""


async def _breaker(
    conn: Connection, node_id: str, gpu_class: str, part: Sequence[int], policy: Policy
) -> _Verdict:
    counts = (await conn.execute(_BREAKER, {"cls": gpu_class, "node_id": node_id})).one()
    total = int(counts.total)
    limit = policy.breaker_limit(total)
    taking = len(set(part) - set(counts.here))
    if int(counts.tainted) + taking <= limit:
        return _Verdict(False)
    return _Verdict(
        True,
        f"circuit breaker: more than {limit} of {total} {gpu_class} GPUs tainted by the policy "
        "in the last hour",
    )


async def act_on(
    conn: Connection, node_id: str, faults: Sequence[Fault], actor: str | None
) -> list[Acted]:
    """The policy's remediations and taints for faults on a node whose row this transaction locked.

    One answer per fault, in order (Acted). The faults are acted on one
    after the other, so a report's second XID on a GPU joins the remediation
    its first one opened.
    """
    if not any(f.rule.acts for f in faults):
        return [Acted(None, False)] * len(faults)
    policy = current()
    gpus = list(await conn.execute(_GPUS, {"node_id": node_id}))
    # The breaker's class locks, all up front and in one order: a node of two
    # classes must not take them in the order another node takes the reverse.
    tainting = {
        g.gpu_class
        for f in faults
        if f.rule.acts
        for g in gpus
        if g.idx in scoped(f.rule, f.gpu_indices, gpus)
    }
    for gpu_class in sorted(tainting):
        await conn.execute(_BREAKER_LOCK, {"cls": gpu_class})
    acted: list[Acted] = []
    for fault in faults:
        indices = scoped(fault.rule, fault.gpu_indices, gpus) if fault.rule.acts else ()
        if not indices:
            acted.append(Acted(None, False))
            continue
        # Drift joins nothing and nothing joins drift: each finding's
        # remediation ends with the finding (remediations.py).
        joined: list[Remediation] = []
        if not is_drift(fault.trigger):
            params = {"node_id": node_id, "indices": list(indices)}
            joined = [of_row(r) for r in await conn.execute(_OPEN_ON, params)]
        parts: list[tuple[Remediation | None, tuple[int, ...]]] = [
            (r, tuple(i for i in indices if i in r.gpu_indices)) for r in joined
        ]
        held = {i for r in joined for i in r.gpu_indices}
        rest = tuple(i for i in indices if i not in held)
        if rest:
            parts.append((None, rest))
        at_fault = Acted(None, False)
        for remediation, part in parts:
            done = await _act(conn, node_id, fault, remediation, part, gpus, policy, actor)
            if set(part) & set(fault.gpu_indices):
                at_fault = done
        acted.append(at_fault)
    return acted


async def _act(
    conn: Connection,
    node_id: str,
    fault: Fault,
    joining: Remediation | None,
    part: tuple[int, ...],
    gpus: Sequence[Row[Any]],
    policy: Policy,
    actor: str | None,
) -> Acted:
    """The fault on these GPUs of its scope: join `joining` (open, holding them) or open one."""
    rule = fault.rule
    params = {"node_id": node_id, "indices": list(part)}
    escalated = False
    if joining is None:
        window = policy.escalate_within.total_seconds()
        escalated = bool(
            (await conn.execute(_DONE_RECENTLY, {**params, "window": window})).scalar_one()
        )
    classes = {g.gpu_class for g in gpus if g.idx in part}
    gpu_class = min(classes) if classes else None
    effect = effect_of(rule, escalated)
    on = None if rule.scope is Scope.NODE else part
    verdict = _Verdict(False)
    in_place = effect is not None and bool(
        (
            await conn.execute(
                _IN_PLACE,
                {
                    "node_id": node_id,
                    "key": fault.trigger,
                    "effect": effect.value,
                    "on_node": on is None,
                    "indices": list(part),
                },
            )
        ).scalar_one()
    )
    if effect is not None and gpu_class is not None and not in_place:
        verdict = await _breaker(conn, node_id, gpu_class, part, policy)
    taint_key = None if effect is None or verdict.suppressed else fault.trigger
    cause = fault.cause[:MAX_TEXT_LENGTH]
    reason = f"{verdict.why}; {fault.cause}" if verdict.suppressed else fault.cause
    if joining is None:
        action, state = rule.action, RemediationState.PENDING
        if escalated:
            action, state = RemediationAction.CONTACT_SUPPORT, RemediationState.ESCALATED
        if verdict.suppressed:
            state = RemediationState.SUPPRESSED
        row = await conn.execute(
            _INSERT,
            {
                **params,
                "cls": gpu_class,
                "action": action.value,
                "state": state.value,
                "scope": rule.scope.value,
                "cause": cause,
                "trigger": fault.trigger,
                "taint_key": taint_key,
            },
        )
        remediation = of_row(row.one())
        kind, detail = "remediation_created", detail_of(remediation, trigger=fault.trigger)
    elif verdict.suppressed:
        # Nothing of the remediation changes: the breaker's share holds for
        # joins as for new remediations, or a burst on GPUs with open
        # RESTART_APP remediations would taint past it.
        await record_event(
            conn,
            "remediation_joined",
            node_id=node_id,
            actor=actor,
            reason=reason,
            detail=detail_of(joining, trigger=fault.trigger, on=list(part), suppressed=True),
        )
        return Acted(joining, True)
    else:
        action = max(joining.action, rule.action, key=SEVERITY.__getitem__)
        state = joining.state
        if state is RemediationState.AWAITING_VALIDATION and effect is not None:
            state = RemediationState.PENDING
        row = await conn.execute(
            _JOIN,
            {
                "id": joining.id,
                "action": action.value,
                "state": state.value,
                "taint_key": taint_key,
            },
        )
        remediation = of_row(row.one())
        kind = "remediation_joined"
        detail = detail_of(
            remediation, trigger=fault.trigger, on=list(part), was=joining.state.value
        )
    await conn.execute(
        _FAULT,
        {
            "id": remediation.id,
            "cls": gpu_class,
            "indices": list(part),
            "scope": rule.scope.value,
            "trigger": fault.trigger,
            "action": rule.action.value,
            "cause": cause,
            "taint_key": taint_key,
            "fresh": taint_key is not None and not in_place,
        },
    )
    await record_event(conn, kind, node_id=node_id, actor=actor, reason=reason, detail=detail)
    if taint_key is not None and effect is not None and not in_place:
        request = TaintRequest(fault.trigger, None, effect, cause, fault.source)
        await put_taint(conn, node_id, on, request, actor)
    return Acted(remediation, verdict.suppressed)
