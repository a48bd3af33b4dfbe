"""Remediations: the policy's work for the operator's automation, and its state machine.

A fault the policy acts on (policy.Rule.acts: an XID, a health reason, a new
drift finding) on GPUs of a node becomes a remediation, in the transaction
that reported it:

    PENDING --startRemediation--> IN_PROGRESS --finishRemediation--> AWAITING_VALIDATION --> DONE
                                               (succeeded: false) --> ESCALATED

A reboot (a new boot id) finishes the PENDING or IN_PROGRESS REBOOT_NODE and
RESET_GPU remediations of the node by itself, and an operator's
clearGpuHealth (a reset by hand) the RESET_GPU ones of that GPU. DONE comes
when every test the policy requires has passed since it began waiting
(validations.py); then its taint is lifted and the sticky health its fault
left clears. Each step is an event naming who did it.

- One at a time per GPU: a fault on a GPU that already has an open
  remediation joins it (its action is raised to the more drastic one).
  Drift is apart (policy.is_drift): each finding has its own remediation,
  which the finding's clearing ends, so a drift finding joins nothing and no
  XID joins a drift remediation (whose end would not clear the XID's health).
- A drift remediation is judged by the node's reports, not by the validation
  tests (a DCGM diagnostic cannot see a missing GPU, and its pass must not
  lift the taint of a finding that still stands): carried out, it waits
  (AWAITING_VALIDATION) for the node's next report; drift.py makes it DONE
  when the finding clears, ESCALATED when the report still shows it.
- ESCALATED: a second remediation of a GPU within the policy's window (7
  days) after one was DONE is CONTACT_SUPPORT from the start, and keeps its
  taint (at least NO_SCHEDULE) until an operator lifts it.
- SUPPRESSED: the circuit breaker. The GPUs of a class the policy tainted in
  the last hour may not exceed the policy's fraction of the class (but may
  always reach its floor; a GPU counts once however many remediations
  tainted it): past it, the remediation is recorded SUPPRESSED,
  its taint is not applied, and an event and the metric say so. A burst of
  XIDs that is the monitoring's fault, not the GPUs', then takes out a
  bounded share of the fleet. Serialized per class (an advisory lock, after
  the node's row lock, as every caller holds it), so two reports cannot both
  take the last place under the limit.

A wrong transition (finishing a PENDING one, starting one twice) is refused
CONFLICT naming the id and the state, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Row

from service.bounds import MAX_TEXT_LENGTH
from service.database.connections import Connection, cached_text
from service.errors import InventoryError
from service.event_log.events import record_event
from service.fleet.health.policy import (
    DRIFT_TRIGGER,
    SEVERITY,
    RemediationAction,
    Rule,
    Scope,
    current,
    is_drift,
)
from service.fleet.health.taints import TaintRequest, lift_taint, put_taint
from service.scheduling.gpu_pools import refresh_pools
from service.scheduling.taints import TaintEffect, TaintSource


class RemediationState(Enum):
    PENDING = "PENDING"
    IN_PROGRESS = "IN_PROGRESS"
    AWAITING_VALIDATION = "AWAITING_VALIDATION"
    DONE = "DONE"
    ESCALATED = "ESCALATED"
    SUPPRESSED = "SUPPRESSED"


OPEN = (
    RemediationState.PENDING,
    RemediationState.IN_PROGRESS,
    RemediationState.AWAITING_VALIDATION,
)
# SQL: the OPEN states, for `state IN OPEN_SQL`.
OPEN_SQL = "(" + ", ".join(f"'{s.value}'" for s in OPEN) + ")"


@dataclass(frozen=True)
class Remediation:
    id: int
    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_class: str | None
    action: RemediationAction
    state: RemediationState
    scope: Scope
    cause: str
    trigger: str
    taint_key: str | None
    attempts: int
    failures: int
    created_at: datetime
    since: datetime


COLUMNS = (
    "r.id, r.node_id, r.gpu_indices, r.gpu_class, r.action, r.state, r.scope, r.cause,"
    " r.trigger, r.taint_key, r.attempts, r.failures, r.created_at, r.since"
)


def of_row(r: Row[Any]) -> Remediation:
    return Remediation(
        id=r.id,
        node_id=r.node_id,
        gpu_indices=tuple(r.gpu_indices),
        gpu_class=r.gpu_class,
        action=RemediationAction(r.action),
        state=RemediationState(r.state),
        scope=Scope(r.scope),
        cause=r.cause,
        trigger=r.trigger,
        taint_key=r.taint_key,
        attempts=r.attempts,
        failures=r.failures,
        created_at=r.created_at,
        since=r.since,
    )


class RemediationConflict(InventoryError):
    """A transition the remediation's state does not allow: nothing changed."""

    code = "CONFLICT"

    def __init__(self, remediation_id: int, state: RemediationState, wanted: str) -> None:
        super().__init__(f"remediation {remediation_id} is {state.value}: {wanted}")
        self.remediation_id = remediation_id
        self.state = state

    @property
    def extensions(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "field": "id",
            "value": str(self.remediation_id),
            "state": self.state.value,
        }


class RemediationNotFound(InventoryError):
    code = "NOT_FOUND"

    def __init__(self, remediation_id: int) -> None:
        super().__init__(f"no remediation {remediation_id}")
        self.remediation_id = remediation_id

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "field": "id", "value": str(self.remediation_id)}


@dataclass(frozen=True)
class Fault:
    """What the policy acts on: a trigger on GPUs of a node (the node's row locked by the caller)."""

    gpu_indices: tuple[int, ...]
    # A key: the taint's and the remediation's (xid-79, health-row_remap_failed).
    trigger: str
    cause: str
    rule: Rule
    source: TaintSource


_GPUS = text("SELECT idx, gpu_class, nvlink_group FROM gpus WHERE node_id = :node_id ORDER BY idx")
# Remediations a drift finding holds (policy.is_drift), in SQL.
NOT_DRIFT_SQL = f"r.trigger NOT LIKE '{DRIFT_TRIGGER}%'"
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
# tainted in the last hour (each once, however many of its remediations did:
# a node's drift findings all cover its GPUs), those of this node among
# them, and the class's size.
_BREAKER_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended('llmgw-breaker:' || :cls, 0))")
_BREAKER = text(
    """
    WITH counted AS (
        SELECT DISTINCT r.node_id, i.idx FROM remediations r
        CROSS JOIN LATERAL unnest(r.gpu_indices) AS i(idx)
        WHERE r.gpu_class = :cls AND r.taint_key IS NOT NULL
          AND r.created_at > now() - interval '1 hour'
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
_RAISE_ACTION = text("UPDATE remediations SET action = :action WHERE id = :id")


def scoped(rule: Rule, at_fault: Sequence[int], gpus: Sequence[Row[Any]]) -> tuple[int, ...]:
    """The GPUs a rule's scope covers: the ones at fault, their NVLink groups, or the node's."""
    if rule.scope is Scope.NODE:
        return tuple(g.idx for g in gpus)
    if rule.scope is Scope.NVLINK_GROUP:
        groups = {g.nvlink_group for g in gpus if g.idx in at_fault and g.nvlink_group is not None}
        return tuple(sorted({*at_fault, *(g.idx for g in gpus if g.nvlink_group in groups)}))
    return tuple(sorted(set(at_fault)))


def effect_of(rule: Rule, escalated: bool) -> TaintEffect | None:
    """The taint a remediation holds: the rule's; at least NO_SCHEDULE once ESCALATED."""
    if escalated and (rule.effect is None or rule.effect is TaintEffect.PREFER_NO_SCHEDULE):
        return TaintEffect.NO_SCHEDULE
    return rule.effect


def _detail(r: Remediation, **more: object) -> dict[str, object]:
    return {
        "remediation": r.id,
        "action": r.action.value,
        "state": r.state.value,
        "gpuIndices": list(r.gpu_indices),
        **more,
    }


async def act_on(
    conn: Connection, node_id: str, faults: Sequence[Fault], actor: str | None
) -> list[Remediation | None]:
    """The policy's remediations (and taints) for faults on a node whose row this transaction locked.

    One answer per fault, in order: the remediation it made, or None (the
    rule does nothing, or the fault joined an open remediation).
    """
    made: list[Remediation | None] = []
    if not any(f.rule.acts for f in faults):
        return [None] * len(faults)
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
    for fault in faults:
        made.append(None)
        rule = fault.rule
        indices = scoped(rule, fault.gpu_indices, gpus) if rule.acts else ()
        if not indices:
            continue
        params = {"node_id": node_id, "indices": list(indices)}
        drifting = is_drift(fault.trigger)
        joined = [] if drifting else [of_row(r) for r in await conn.execute(_OPEN_ON, params)]
        if joined:
            # One at a time: the fault joins the open remediation, whose
            # action rises to the more drastic one.
            first = joined[0]
            if SEVERITY[rule.action] > SEVERITY[first.action]:
                await conn.execute(_RAISE_ACTION, {"id": first.id, "action": rule.action.value})
            continue
        window = policy.escalate_within.total_seconds()
        escalated = bool(
            (await conn.execute(_DONE_RECENTLY, {**params, "window": window})).scalar_one()
        )
        classes = {g.gpu_class for g in gpus if g.idx in indices}
        gpu_class = min(classes) if classes else None
        effect = effect_of(rule, escalated)
        action = rule.action
        state = RemediationState.PENDING
        if escalated:
            action = RemediationAction.CONTACT_SUPPORT
            state = RemediationState.ESCALATED
        suppressed = False
        if effect is not None and gpu_class is not None:
            counts = (await conn.execute(_BREAKER, {"cls": gpu_class, "node_id": node_id})).one()
            limit = policy.breaker_limit(int(counts.total))
            taking = len(set(indices) - set(counts.here))
            suppressed = int(counts.tainted) + taking > limit
        if suppressed:
            state = RemediationState.SUPPRESSED
            effect = None
        row = (
            await conn.execute(
                _INSERT,
                {
                    **params,
                    "cls": gpu_class,
                    "action": action.value,
                    "state": state.value,
                    "scope": rule.scope.value,
                    "cause": fault.cause[:MAX_TEXT_LENGTH],
                    "trigger": fault.trigger,
                    "taint_key": None if effect is None else fault.trigger,
                },
            )
        ).one()
        remediation = of_row(row)
        made[-1] = remediation
        if suppressed:
            reason = (
                f"circuit breaker: more than {policy.breaker_limit(int(counts.total))} of "
                f"{int(counts.total)} {gpu_class} GPUs tainted by the policy in the last hour; "
                f"{fault.cause}"
            )
        else:
            reason = fault.cause
        await record_event(
            conn,
            "remediation_created",
            node_id=node_id,
            actor=actor,
            reason=reason,
            detail=_detail(remediation, trigger=fault.trigger),
        )
        if effect is not None:
            taint = TaintRequest(
                fault.trigger, None, effect, fault.cause[:MAX_TEXT_LENGTH], fault.source
            )
            on = None if rule.scope is Scope.NODE else indices
            await put_taint(conn, node_id, on, taint, actor)
    return made


_LOCK = text(f"SELECT {COLUMNS} FROM remediations r WHERE r.id = :id FOR UPDATE")
_LOCK_NODE = text("SELECT id FROM nodes WHERE id = :node_id FOR NO KEY UPDATE")
_MOVE = text(
    f"""
    UPDATE remediations r SET state = :state, action = coalesce(:action, r.action), since = now()
    WHERE r.id = :id
    RETURNING {COLUMNS}
    """
)


_RESCOPE = text(
    f"""
    UPDATE remediations r SET gpu_indices = :indices, scope = :scope WHERE r.id = :id
    RETURNING {COLUMNS}
    """
)


async def rescope(
    conn: Connection, r: Remediation, indices: Sequence[int], scope: Scope
) -> Remediation:
    """A locked remediation now covers these GPUs (a drift finding that moved to another rail)."""
    row = await conn.execute(_RESCOPE, {"id": r.id, "indices": list(indices), "scope": scope.value})
    return of_row(row.one())


async def get(conn: Connection, remediation_id: int) -> Remediation:
    """The remediation, its node's row locked first (as every writer of the node's taints locks it)."""
    row = (
        await conn.execute(
            text(f"SELECT {COLUMNS} FROM remediations r WHERE r.id = :id"), {"id": remediation_id}
        )
    ).one_or_none()
    if row is None:
        raise RemediationNotFound(remediation_id)
    await conn.execute(_LOCK_NODE, {"node_id": row.node_id})
    locked = (await conn.execute(_LOCK, {"id": remediation_id})).one_or_none()
    if locked is None:
        raise RemediationNotFound(remediation_id)
    return of_row(locked)


async def move(
    conn: Connection,
    r: Remediation,
    state: RemediationState,
    actor: str | None,
    reason: str | None,
    kind: str,
    action: RemediationAction | None = None,
) -> Remediation:
    """Move a locked remediation to `state` (and `action`), with the event `kind`."""
    row = (
        await conn.execute(
            _MOVE,
            {"id": r.id, "state": state.value, "action": None if action is None else action.value},
        )
    ).one()
    moved = of_row(row)
    await record_event(
        conn,
        kind,
        node_id=r.node_id,
        actor=actor,
        reason=reason,
        detail=_detail(moved, was=r.state.value),
    )
    if state is RemediationState.DONE:
        await close(conn, moved, actor)
    return moved


async def awaiting_validation(
    conn: Connection, r: Remediation, actor: str | None, reason: str, kind: str
) -> Remediation:
    """The action was carried out: wait for the policy's tests, or DONE when it requires none.

    A drift remediation waits whatever the tests: the node's next report judges it.
    """
    waits = bool(current().validations) or is_drift(r.trigger)
    state = RemediationState.AWAITING_VALIDATION if waits else RemediationState.DONE
    return await move(conn, r, state, actor, reason, kind)


async def start(conn: Connection, remediation_id: int, actor: str | None) -> Remediation:
    """PENDING -> IN_PROGRESS; anything else is CONFLICT (a second start included)."""
    r = await get(conn, remediation_id)
    if r.state is not RemediationState.PENDING:
        raise RemediationConflict(
            remediation_id, r.state, "startRemediation starts a PENDING remediation"
        )
    return await move(conn, r, RemediationState.IN_PROGRESS, actor, None, "remediation_started")


async def finish(
    conn: Connection, remediation_id: int, succeeded: bool, note: str | None, actor: str | None
) -> Remediation:
    """IN_PROGRESS -> AWAITING_VALIDATION (or ESCALATED when it did not succeed)."""
    r = await get(conn, remediation_id)
    if r.state is not RemediationState.IN_PROGRESS:
        wanted = "finishRemediation finishes an IN_PROGRESS remediation"
        if r.state is RemediationState.PENDING:
            wanted += " (startRemediation first)"
        raise RemediationConflict(remediation_id, r.state, wanted)
    reason = (note or "").strip()[:MAX_TEXT_LENGTH] or None
    if succeeded:
        return await awaiting_validation(
            conn, r, actor, reason or "carried out", "remediation_finished"
        )
    return await move(
        conn,
        r,
        RemediationState.ESCALATED,
        actor,
        reason or "the action did not succeed",
        "remediation_escalated",
        RemediationAction.CONTACT_SUPPORT,
    )


_STICKY_CLEARED = text(
    """
    UPDATE gpus g SET sticky_reasons = ARRAY(
        SELECT x FROM unnest(g.sticky_reasons) x WHERE x <> ALL(CAST(:reasons AS text[])))
    WHERE g.node_id = :node_id AND g.idx = ANY(CAST(:indices AS int[]))
      AND g.sticky_reasons && CAST(:reasons AS text[])
    RETURNING g.idx
    """
)


def sticky_of(trigger: str) -> list[str]:
    """The sticky health reasons a trigger leaves (xid-79 -> xid_79)."""
    return [trigger.replace("-", "_", 1)] if trigger.startswith("xid-") else []


async def close(conn: Connection, r: Remediation, actor: str | None) -> None:
    """DONE: the sticky health its fault left cleared, its taint lifted (events for both), pools after."""
    reasons = sticky_of(r.trigger)
    if reasons:
        cleared = await conn.execute(
            _STICKY_CLEARED,
            {"node_id": r.node_id, "indices": list(r.gpu_indices), "reasons": reasons},
        )
        for index in sorted(row.idx for row in cleared):
            await record_event(
                conn,
                "gpu_health_cleared",
                node_id=r.node_id,
                actor=actor,
                reason=f"remediation {r.id} validated",
                detail={"index": index, "cleared": reasons},
            )
    lifted = 0
    if r.taint_key is not None:
        on = None if r.scope is Scope.NODE else list(r.gpu_indices)
        # Refreshes the node's GPU marks and pools, the cleared health with them.
        lifted = await lift_taint(conn, r.node_id, on, r.taint_key, actor)
    if not lifted:
        await refresh_pools(conn, [r.node_id])


_OPEN_OF_NODE = text(
    f"""
    SELECT {COLUMNS} FROM remediations r
    WHERE r.node_id = :node_id AND r.state IN ('PENDING', 'IN_PROGRESS')
      AND r.action = ANY(CAST(:actions AS text[]))
      AND (CAST(:indices AS int[]) IS NULL OR r.gpu_indices && CAST(:indices AS int[]))
    ORDER BY r.id
    FOR UPDATE
    """
)


async def carried_out(
    conn: Connection,
    node_id: str,
    actions: Sequence[RemediationAction],
    indices: Sequence[int] | None,
    actor: str | None,
    reason: str,
) -> list[Remediation]:
    """The node did it by itself (a reboot, a reset): its matching open remediations wait for validation."""
    rows = await conn.execute(
        _OPEN_OF_NODE,
        {
            "node_id": node_id,
            "actions": [a.value for a in actions],
            "indices": None if indices is None else list(indices),
        },
    )
    moved = []
    for r in [of_row(row) for row in rows]:
        moved.append(await awaiting_validation(conn, r, actor, reason, "remediation_finished"))
    return moved


async def covered_sticky(conn: Connection, node_id: str) -> set[tuple[int, str]]:
    """(GPU, sticky reason) pairs an open remediation of the node still holds: a reboot keeps them."""
    rows = await conn.execute(
        text(
            f"SELECT r.gpu_indices, r.trigger FROM remediations r"
            f" WHERE r.node_id = :node_id AND r.state IN {OPEN_SQL}"
        ),
        {"node_id": node_id},
    )
    return {(i, reason) for r in rows for i in r.gpu_indices for reason in sticky_of(r.trigger)}


async def list_remediations(
    conn: Connection,
    *,
    state: RemediationState | None,
    node_id: str | None,
    first: int,
    after: int | None,
) -> list[Remediation]:
    """A page of remediations by id; `after`: the last id of the page before."""
    where = ["true"]
    params: dict[str, Any] = {"first": first}
    if state is not None:
        where.append("r.state = :state")
        params["state"] = state.value
    if node_id is not None:
        where.append("r.node_id = :node_id")
        params["node_id"] = node_id
    if after is not None:
        where.append("r.id > :after")
        params["after"] = after
    rows = await conn.execute(
        cached_text(
            f"SELECT {COLUMNS} FROM remediations r WHERE {' AND '.join(where)}"
            " ORDER BY r.id LIMIT :first"
        ),
        params,
    )
    return [of_row(r) for r in rows]
