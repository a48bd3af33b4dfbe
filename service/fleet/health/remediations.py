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
(validations.py); then its taints are lifted and the sticky health its
faults left clears. Each step is an event naming who did it.

- One at a time per GPU: a fault on GPUs that already have an open
  remediation joins it for those GPUs (faults.py: its taint goes on them,
  the action rises to the most drastic of its faults'), and the GPUs without
  one open a new one, so open remediations share no GPU. What a remediation
  holds is each of its faults' (remediation_faults): its DONE lifts all
  their taints and clears all their sticky reasons, and a reboot keeps
  those sticky reasons while it is open.
  Drift is apart (policy.is_drift): each finding has its own remediation,
  which the finding's clearing ends, so a drift finding joins nothing and no
  XID joins a drift remediation (whose end would not clear the XID's health).
- A drift remediation is judged by the node's reports, not by the validation
  tests (a DCGM diagnostic cannot see a missing GPU, and its pass must not
  lift the taint of a finding that still stands): carried out, it waits
  (AWAITING_VALIDATION) for the node's next report; drift.py makes it DONE
  when the finding clears, ESCALATED when the report still shows it.
- ESCALATED: a second remediation of a GPU within the policy's window (7
  days) after one was DONE (or ESCALATED) is CONTACT_SUPPORT from the start,
  and keeps its taint (at least NO_SCHEDULE) until an operator lifts it. An
  ESCALATED remediation is closed to the automation: a later fault on its
  GPUs joins nothing and opens such a one.
- SUPPRESSED: the circuit breaker (faults.py) kept its taint off: a burst
  of XIDs that is the monitoring's fault, not the GPUs', takes out a
  bounded share of the fleet.

A wrong transition (finishing a PENDING one, starting one twice) is refused
CONFLICT naming the id and the state, and changes nothing.

Read back: a page of them (list_remediations), and each node's open ones
(open_of, and open_sql for the fast path's compiled page: the same rows).
"""

from __future__ import annotations

from collections import defaultdict
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
    RemediationAction,
    Rule,
    Scope,
    current,
    is_drift,
)
from service.fleet.health.taints import lift_taint
from service.scheduling.gpu_pools import refresh_pools
from service.scheduling.taints import TaintEffect


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


# Remediations a drift finding holds (policy.is_drift), in SQL.
NOT_DRIFT_SQL = f"r.trigger NOT LIKE '{DRIFT_TRIGGER}%'"


def effect_of(rule: Rule, escalated: bool) -> TaintEffect | None:
    """The taint a remediation holds: the rule's; at least NO_SCHEDULE once ESCALATED."""
    if escalated and (rule.effect is None or rule.effect is TaintEffect.PREFER_NO_SCHEDULE):
        return TaintEffect.NO_SCHEDULE
    return rule.effect


def detail_of(r: Remediation, **more: object) -> dict[str, object]:
    """An event's detail about a remediation: what it is now, and `more`."""
    return {
        "remediation": r.id,
        "action": r.action.value,
        "state": r.state.value,
        "gpuIndices": list(r.gpu_indices),
        **more,
    }


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
    WITH faults AS (
        UPDATE remediation_faults f SET gpu_indices = :indices, scope = :scope
        WHERE f.remediation_id = :id
    )
    UPDATE remediations r SET gpu_indices = :indices, scope = :scope WHERE r.id = :id
    RETURNING {COLUMNS}
    """
)


async def rescope(
    conn: Connection, r: Remediation, indices: Sequence[int], scope: Scope
) -> Remediation:
    """A locked remediation now covers these GPUs (a drift finding that moved to another rail).

    Its fault (a drift remediation has one: it joins nothing) moves with it,
    so what its DONE lifts and what the breaker counts are where the taint is.
    """
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
        detail=detail_of(moved, was=r.state.value),
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


# The reasons cleared, and each GPU's reasons before (`had`): the event names
# those it had of them.
_STICKY_CLEARED = text(
    """
    UPDATE gpus g SET sticky_reasons = ARRAY(
        SELECT x FROM unnest(g.sticky_reasons) x WHERE x <> ALL(CAST(:reasons AS text[])))
    FROM gpus old
    WHERE g.node_id = :node_id AND g.idx = ANY(CAST(:indices AS int[]))
      AND g.sticky_reasons && CAST(:reasons AS text[])
      AND old.node_id = g.node_id AND old.idx = g.idx
    RETURNING g.idx, old.sticky_reasons AS had
    """
)


def sticky_of(trigger: str) -> list[str]:
    """The sticky health reasons a trigger leaves (xid-79 -> xid_79)."""
    return [trigger.replace("-", "_", 1)] if trigger.startswith("xid-") else []


# The taints a remediation's faults put (key; on the node for scope NODE, or
# on their GPUs), and where another open remediation of the node holds the
# same key: its DONE lifts only what no open one still holds. Open
# remediations of XIDs share no GPU (faults.py), so this only spares the
# node's taint of a NODE-scoped fault that several remediations joined.
_HELD = text(
    f"""
    SELECT f.taint_key AS key, f.scope = 'NODE' AS on_node, f.gpu_indices,
           f.remediation_id = :id AS own
    FROM remediation_faults f JOIN remediations r ON r.id = f.remediation_id
    WHERE r.node_id = :node_id AND f.taint_key IS NOT NULL
      AND (r.id = :id OR (r.state IN {OPEN_SQL}
                          AND f.taint_key IN (SELECT o.taint_key FROM remediation_faults o
                                              WHERE o.remediation_id = :id)))
    ORDER BY f.id
    """
)
_TRIGGERS = text(
    "SELECT DISTINCT f.trigger FROM remediation_faults f WHERE f.remediation_id = :id"
    " ORDER BY f.trigger"
)


async def close(conn: Connection, r: Remediation, actor: str | None) -> None:
    """DONE: the sticky health its faults left cleared, their taints lifted (events for both).

    Every fault that opened or joined it counts, not only the first: a
    remediation opened by XID 94 (no taint) and joined by XID 48 holds 48's
    taint and sticky reason, and its DONE is what lifts them. Pools after.
    """
    triggers = list((await conn.execute(_TRIGGERS, {"id": r.id})).scalars())
    reasons = [reason for trigger in triggers for reason in sticky_of(trigger)]
    if reasons:
        cleared = await conn.execute(
            _STICKY_CLEARED,
            {"node_id": r.node_id, "indices": list(r.gpu_indices), "reasons": reasons},
        )
        for row in sorted(cleared, key=lambda row: row.idx):
            await record_event(
                conn,
                "gpu_health_cleared",
                node_id=r.node_id,
                actor=actor,
                reason=f"remediation {r.id} validated",
                detail={"index": row.idx, "cleared": sorted(set(row.had) & set(reasons))},
            )
    own: dict[tuple[str, bool], set[int]] = {}
    others: dict[tuple[str, bool], set[int]] = {}
    for f in await conn.execute(_HELD, {"id": r.id, "node_id": r.node_id}):
        (own if f.own else others).setdefault((f.key, f.on_node), set()).update(f.gpu_indices)
    lifted = 0
    for (key, on_node), indices in own.items():
        if on_node:
            if (key, True) not in others:
                lifted += await lift_taint(conn, r.node_id, None, key, actor)
            continue
        free = sorted(indices - others.get((key, False), set()))
        if free:
            # Refreshes the node's GPU marks and pools, the cleared health with them.
            lifted += await lift_taint(conn, r.node_id, free, key, actor)
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


_HELD_STICKY = text(
    f"""
    SELECT r.gpu_indices, f.trigger FROM remediations r
    JOIN remediation_faults f ON f.remediation_id = r.id
    WHERE r.node_id = :node_id AND r.state IN {OPEN_SQL}
    """
)


async def covered_sticky(conn: Connection, node_id: str) -> set[tuple[int, str]]:
    """(GPU, sticky reason) pairs an open remediation of the node still holds: a reboot keeps them.

    The reasons of each of its faults, the ones that joined it included.
    """
    rows = await conn.execute(_HELD_STICKY, {"node_id": node_id})
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


# A node's open remediations (Node.remediations): read by the loader (open_of)
# and built by the fast path's compiled page (open_sql), with one predicate
# (OPEN) and one order (by id), so the dashboard's node list answered by
# PostgreSQL lists what Strawberry's resolver lists.
_OPEN = f"r.state IN {OPEN_SQL}"
_OF_NODES = text(
    f"SELECT {COLUMNS} FROM remediations r"
    f" WHERE r.node_id = ANY(CAST(:ids AS text[])) AND {_OPEN} ORDER BY r.node_id, r.id"
)


async def open_of(conn: Connection, node_ids: Sequence[str]) -> dict[str, list[Remediation]]:
    """Each node's open remediations (PENDING, IN_PROGRESS, AWAITING_VALIDATION), by id."""
    out: dict[str, list[Remediation]] = defaultdict(list)
    for r in await conn.execute(_OF_NODES, {"ids": list(node_ids)}):
        out[r.node_id].append(of_row(r))
    return out


def open_sql(n: str, entry: str) -> str:
    """SQL json: `entry` (over remediations `r`) for each open remediation of the node row `n`,
    as open_of lists them; [] for none. The compiled page's Node.remediations."""
    return (
        f"(SELECT coalesce(json_agg({entry} ORDER BY r.id), '[]')"
        f" FROM remediations r WHERE r.node_id = {n}.id AND {_OPEN})"
    )
