"""What a drift finding's appearing, staying and clearing does: events, its remediation, its taint.

drift.py compares a node with its profile; this module acts on the
difference, in the transaction that stored the report (or changed the
profile), the node's row locked:

- A new finding is an event (drift_found) and, when the policy's rule for
  its kind acts, a remediation made by faults.act_on like an XID's:
  the rule's action, the taint (key drift-<kind>, source DRIFT) on the
  smallest scope that explains it, the circuit breaker (past it, no taint,
  SUPPRESSED, an event and the metric) and the 7-day escalation. A finding
  no GPU explains (a missing GPU, a missing HCA whose rail is unknown) is
  the node's, whatever scope the rule names. A node that reports no GPUs
  has none to remediate or count: the finding taints the node itself.
- A finding that stays after its remediation was carried out (a reboot, or
  finishRemediation; it waits in AWAITING_VALIDATION) is ESCALATED,
  CONTACT_SUPPORT: the action did not fix it. One that moves (another rail,
  another NVLink group) takes its remediation and taint with it.
- A finding that clears (drift_cleared) ends its open remediation DONE, with
  an event naming why ("drift cleared: ..."), and lifts its taint: the
  comparison with the profile is the validation a drift remediation needs.
  An ESCALATED one keeps its taint until an operator lifts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Row

from service.bounds import MAX_TEXT_LENGTH
from service.database.connections import Connection
from service.event_log.events import record_event
from service.fleet.health import remediations
from service.fleet.health.faults import Fault, act_on, scoped
from service.fleet.health.policy import DriftKind, RemediationAction, Rule, Scope, drift_trigger
from service.fleet.health.remediations import Remediation, RemediationState
from service.fleet.health.taints import TaintRequest, lift_taint, put_taint
from service.scheduling.taints import TaintEffect, TaintSource


@dataclass(frozen=True)
class Finding:
    kind: DriftKind
    expected: str
    observed: str
    # The GPUs that explain it; None: the node as a whole.
    gpu_indices: tuple[int, ...] | None
    since: datetime | None = None
    # The remediation it made (None: none, or not read back).
    remediation_id: int | None = None


_UPSERT = text(
    """
    INSERT INTO drift_findings AS f
        (node_id, kind, expected, observed, gpu_indices, taint_on, tainted, remediation_id)
    VALUES (:node_id, :kind, :expected, :observed, :gpu_indices, :taint_on, :tainted,
            :remediation_id)
    ON CONFLICT (node_id, kind) DO UPDATE
    SET expected = excluded.expected, observed = excluded.observed,
        gpu_indices = excluded.gpu_indices, taint_on = excluded.taint_on,
        tainted = excluded.tainted, remediation_id = excluded.remediation_id
    """
)
_DELETE = text("DELETE FROM drift_findings WHERE node_id = :node_id AND kind = :kind")


def _where(rule: Rule, finding: Finding, gpus: Sequence[Row[Any]]) -> tuple[Rule, list[int] | None]:
    """The rule as it applies to the finding, and the GPUs its taint goes on (None: the node).

    A finding no GPU explains (a missing GPU, a missing HCA whose rail is
    unknown) is the node's, whatever scope the rule names.
    """
    if finding.gpu_indices is None:
        rule = replace(rule, scope=Scope.NODE)
    if rule.scope is Scope.NODE:
        return rule, None
    return rule, list(scoped(rule, finding.gpu_indices or (), gpus))


def _reason(kind: DriftKind, finding: Finding) -> str:
    return f"{kind.value}: expected {finding.expected}, observed {finding.observed}"[
        :MAX_TEXT_LENGTH
    ]


@dataclass(frozen=True)
class FindingChange:
    """What one finding's appearing, staying or clearing does, in the report's transaction."""

    conn: Connection
    node_id: str
    kind: DriftKind
    actor: str | None

    @property
    def key(self) -> str:
        return drift_trigger(self.kind)

    async def _store(
        self, new: Finding, on: list[int] | None, tainted: bool, remediation_id: int | None
    ) -> None:
        await self.conn.execute(
            _UPSERT,
            {
                "node_id": self.node_id,
                "kind": self.kind.value,
                "expected": new.expected,
                "observed": new.observed[:MAX_TEXT_LENGTH],
                "gpu_indices": None if new.gpu_indices is None else list(new.gpu_indices),
                "taint_on": on,
                "tainted": tainted,
                "remediation_id": remediation_id,
            },
        )

    async def _taint(self, on: list[int] | None, effect: TaintEffect, reason: str) -> None:
        request = TaintRequest(self.key, None, effect, reason, TaintSource.DRIFT)
        await put_taint(self.conn, self.node_id, on, request, self.actor)

    async def found(self, new: Finding, rule: Rule, gpus: Sequence[Row[Any]]) -> None:
        """A new finding: its event, then the policy's remediation (breaker, escalation, taint)."""
        rule, on = _where(rule, new, gpus)
        reason = _reason(self.kind, new)
        await record_event(
            self.conn,
            "drift_found",
            node_id=self.node_id,
            actor=self.actor,
            reason=reason,
            detail={
                "kind": self.kind.value,
                "expected": new.expected,
                "observed": new.observed,
                "gpuIndices": None if new.gpu_indices is None else list(new.gpu_indices),
            },
        )
        made: Remediation | None = None
        own = False
        if gpus and rule.acts:
            at_fault = new.gpu_indices or tuple(g.idx for g in gpus)
            fault = Fault(at_fault, self.key, reason, rule, TaintSource.DRIFT)
            [acted] = await act_on(self.conn, self.node_id, [fault], self.actor)
            made = acted.remediation
        elif rule.effect is not None:
            # A node that reports no GPUs has none to remediate, validate or
            # count against a class's breaker: the finding taints the node itself.
            own = True
            await self._taint(on, rule.effect, reason)
        await self._store(new, on, own, None if made is None else made.id)

    async def persists(
        self, old: Row[Any], new: Finding, rule: Rule, gpus: Sequence[Row[Any]]
    ) -> None:
        """A finding that stays: judge its carried-out remediation, follow where it moved."""
        rule, on = _where(rule, new, gpus)
        reason = _reason(self.kind, new)
        made = None
        if old.remediation_id is not None:
            made = await remediations.get(self.conn, old.remediation_id)
            if made.state is RemediationState.AWAITING_VALIDATION:
                # The action was carried out and the node still drifts: as the
                # catalog's RESTART_BM then CONTACT_SUPPORT, a person's turn.
                made = await remediations.move(
                    self.conn,
                    made,
                    RemediationState.ESCALATED,
                    self.actor,
                    f"carried out, and the node still drifts: {reason}",
                    "remediation_escalated",
                    RemediationAction.CONTACT_SUPPORT,
                )
        moved = _on(old.taint_on) != on
        if not moved and (old.expected, old.observed) == (new.expected, new.observed):
            return
        await self._store(new, on, old.tainted, old.remediation_id)
        if old.tainted:
            if moved:
                await lift_taint(self.conn, self.node_id, _on(old.taint_on), self.key, self.actor)
            if rule.effect is not None:
                await self._taint(on, rule.effect, reason)
        holds = (
            made is not None
            and made.taint_key is not None
            and made.state is not RemediationState.DONE
        )
        if made is None or not holds:
            return
        if moved:
            # The finding moved (another rail, another group): its remediation
            # and taint move with it.
            await lift_taint(self.conn, self.node_id, _on(old.taint_on), self.key, self.actor)
            covers = on if on is not None else [g.idx for g in gpus]
            if covers:
                made = await remediations.rescope(self.conn, made, covers, rule.scope)
        effect = remediations.effect_of(rule, made.state is RemediationState.ESCALATED)
        if effect is not None:
            # Put again when only the numbers changed: the taint's reason says them.
            await self._taint(on, effect, reason)

    async def cleared(self, old: Row[Any]) -> None:
        """The node is as its profile says again: the finding goes, its open remediation is DONE."""
        said = f"{self.kind.value}: now as the profile says ({old.expected})"
        await self.conn.execute(_DELETE, {"node_id": self.node_id, "kind": self.kind.value})
        await record_event(
            self.conn,
            "drift_cleared",
            node_id=self.node_id,
            actor=self.actor,
            reason=said,
            detail={"kind": self.kind.value, "expected": old.expected, "was": old.observed},
        )
        if old.tainted:
            await lift_taint(self.conn, self.node_id, _on(old.taint_on), self.key, self.actor)
        if old.remediation_id is None:
            return
        made = await remediations.get(self.conn, old.remediation_id)
        # Its validation is the comparison itself: DONE, its taint lifted. An
        # ESCALATED one keeps its taint until an operator lifts it (a GPU that
        # went twice in 7 days stays out though it came back); a SUPPRESSED
        # one holds nothing.
        if made.state in remediations.OPEN:
            await remediations.move(
                self.conn,
                made,
                RemediationState.DONE,
                self.actor,
                f"drift cleared: {said}",
                "remediation_done",
            )


def _on(stored: Sequence[int] | None) -> list[int] | None:
    """A finding's taint_on column: the GPUs its taint is on, NULL for the node."""
    return None if stored is None else list(stored)
