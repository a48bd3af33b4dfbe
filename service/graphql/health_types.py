"""GraphQL types of fleet health: taints, tolerations, and what reads them on a GPU and a node.

The domain's enums are exposed as they are (service/scheduling/taints.py);
the inputs translate to the domain's requests and nothing is decided here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import strawberry

from service.errors import InvalidInput
from service.fleet.health import drift, policy, remediations, validations
from service.fleet.health.remediations import Remediation as RemediationRecord
from service.fleet.health.taints import TaintRequest
from service.scheduling import taints
from service.scheduling.taints import Taint as TaintRecord

from .context import Info
from .loaders import now_or_later

strawberry.enum(taints.TaintEffect, name="TaintEffect")
strawberry.enum(taints.TaintSource, name="TaintSource")
strawberry.enum(taints.TolerationOperator, name="TolerationOperator")


@strawberry.type(
    description=(
        "A mark that keeps work off a GPU or node: NO_SCHEDULE and NO_EXECUTE unless tolerated, "
        "PREFER_NO_SCHEDULE used last. A cordon shows as an OPERATOR NO_SCHEDULE taint with "
        "key cordon (a drain: key drain), lifted by uncordon."
    )
)
class Taint:
    """Served by service.scheduling.taints.Taint itself (types.SERVED_BY_RECORDS)."""

    key: str
    value: str | None
    effect: taints.TaintEffect
    source: taints.TaintSource
    reason: str
    since: datetime
    actor: str | None = strawberry.field(default=None, description="Who set it.")


@strawberry.input
class TaintInput:
    key: str
    value: str | None = None
    effect: taints.TaintEffect
    reason: str

    def to_request(self) -> TaintRequest:
        return TaintRequest(self.key, self.value, self.effect, self.reason)


@strawberry.input(
    description=(
        "A toleration matches a taint with the same key (and value, for EQUAL); effect null "
        "matches every effect. tolerationSeconds: how long a NO_EXECUTE taint is tolerated."
    )
)
class TolerationInput:
    key: str
    operator: taints.TolerationOperator = taints.TolerationOperator.EQUAL
    value: str | None = None
    effect: taints.TaintEffect | None = None
    toleration_seconds: int | None = None

    def to_toleration(self) -> taints.Toleration:
        return taints.Toleration(
            key=self.key,
            operator=self.operator,
            value=self.value,
            effect=self.effect,
            toleration_seconds=self.toleration_seconds,
        )


def tolerations_of(given: list[TolerationInput] | None) -> tuple[taints.Toleration, ...]:
    return tuple(t.to_toleration() for t in given or ())


TOLERATIONS = (
    "Taints the request tolerates: a GPU withheld by NO_SCHEDULE or NO_EXECUTE taints is "
    "offered only when every one of them is tolerated; tolerated PREFER_NO_SCHEDULE GPUs are not "
    "used last."
)


def node_taints(node_id: str, info: Info) -> Any:
    """Node.taints: the node's own (not its GPUs'), cordon or drain included."""

    def own(found: list[TaintRecord]) -> list[TaintRecord]:
        return [t for t in found if t.gpu_index is None]

    return now_or_later(info.context.loaders.taints, node_id, own)


strawberry.enum(policy.RemediationAction, name="RemediationAction")
strawberry.enum(remediations.RemediationState, name="RemediationState")
strawberry.enum(
    policy.DriverRecoveryAction,
    name="GpuRecoveryAction",
    description=(
        "The driver's recovery action for a GPU (NVML's nvmlGpuRecoveryAction_t, read by the "
        "agent): what an XID 154 asks for."
    ),
)


@strawberry.type(
    description=(
        "Work for the operator's automation, from the remediation policy: PENDING -> "
        "IN_PROGRESS (startRemediation) -> AWAITING_VALIDATION (finishRemediation, or by itself "
        "on a reboot or reset) -> DONE once the required validations pass; or ESCALATED "
        "(CONTACT_SUPPORT), or SUPPRESSED by the circuit breaker."
    )
)
class Remediation:
    id: strawberry.ID
    node_id: strawberry.ID
    gpu_indices: list[int]
    gpu_class: str | None
    action: policy.RemediationAction
    state: remediations.RemediationState
    scope: str = strawberry.field(description="GPU, NVLINK_GROUP or NODE: what its taint covers.")
    cause: str
    trigger: str = strawberry.field(
        description=(
            "The fault that opened it, e.g. xid-79 (also the key of that fault's taint); "
            "faults that joined it later are not named here."
        )
    )
    taint_key: str | None = strawberry.field(
        description=(
            "The first taint it holds; null: none (no effect, or SUPPRESSED). DONE lifts all "
            "its faults' taints, but a taint on the node another open remediation's fault "
            "also put."
        )
    )
    attempts: int = strawberry.field(description="Validations recorded against it.")
    failures: int = strawberry.field(description="Of those, how many failed.")
    created_at: datetime
    since: datetime = strawberry.field(description="When it entered its state.")

    @classmethod
    def of(cls, r: RemediationRecord) -> Remediation:
        return cls(
            id=strawberry.ID(str(r.id)),
            node_id=strawberry.ID(r.node_id),
            gpu_indices=list(r.gpu_indices),
            gpu_class=r.gpu_class,
            action=r.action,
            state=r.state,
            scope=r.scope.value,
            cause=r.cause,
            trigger=r.trigger,
            taint_key=r.taint_key,
            attempts=r.attempts,
            failures=r.failures,
            created_at=r.created_at,
            since=r.since,
        )


def open_remediations(node_id: str, info: Info) -> Any:
    """Node.remediations, batched per request through the loader."""

    def listed(found: list[RemediationRecord]) -> list[Remediation]:
        return [Remediation.of(r) for r in found]

    return now_or_later(info.context.loaders.open_remediations, node_id, listed)


@strawberry.type(description="A test the node's agent should run now, after a remediation.")
class ValidationRequest:
    test: str
    gpu_indices: list[int]
    remediation_id: strawberry.ID | None

    @classmethod
    def of(cls, v: validations.ValidationRequest) -> ValidationRequest:
        return cls(
            test=v.test,
            gpu_indices=list(v.gpu_indices),
            remediation_id=None
            if v.remediation_id is None
            else strawberry.ID(str(v.remediation_id)),
        )


@strawberry.input
class ValidationInput:
    node_id: strawberry.ID
    gpu_indices: list[int]
    test: str
    passed: bool
    details: str | None = strawberry.field(
        default=None, description="The test's output, at most 16,384 characters (cut it)."
    )

    def to_result(self) -> validations.ValidationResult:
        return validations.ValidationResult(
            node_id=str(self.node_id),
            gpu_indices=tuple(self.gpu_indices),
            test=self.test,
            passed=self.passed,
            details=self.details,
        )


def remediation_id(value: strawberry.ID, field: str = "id") -> int:
    """A remediation's id from its GraphQL ID; BAD_INPUT naming the field when it is none."""
    text = str(value)
    if not text.isdigit() or len(text) > 18:
        raise InvalidInput(field, text, "a remediation id is a number")
    return int(text)


def validations_to_run(node_id: str, info: Info) -> Any:
    """Node.validationsToRun, batched per request through the loader."""

    def requests(found: list[validations.ValidationRequest]) -> list[ValidationRequest]:
        return [ValidationRequest.of(v) for v in found]

    return now_or_later(info.context.loaders.validations, node_id, requests)


strawberry.enum(policy.DriftKind, name="DriftKind")


@strawberry.type(description="Where a node's report differs from its hardware profile.")
class DriftFinding:
    kind: policy.DriftKind
    expected: str
    observed: str
    since: datetime
    gpu_indices: list[int] | None = strawberry.field(
        description="The GPUs that explain it (the policy's taint goes there); null: the node."
    )
    remediation_id: strawberry.ID | None = strawberry.field(
        default=None,
        description=(
            "The remediation the finding made (its action, state and taint); null when the "
            "policy's rule for its kind does nothing or the node reports no GPUs."
        ),
    )

    @classmethod
    def of(cls, f: drift.Finding) -> DriftFinding:
        assert f.since is not None  # read back from drift_findings
        return cls(
            kind=f.kind,
            expected=f.expected,
            observed=f.observed,
            since=f.since,
            gpu_indices=None if f.gpu_indices is None else list(f.gpu_indices),
            remediation_id=None
            if f.remediation_id is None
            else strawberry.ID(str(f.remediation_id)),
        )


def node_drift(node_id: str, info: Info) -> Any:
    """Node.drift, batched per request through the loader."""

    def findings(found: list[drift.Finding]) -> list[DriftFinding]:
        return [DriftFinding.of(f) for f in found]

    return now_or_later(info.context.loaders.drift, node_id, findings)
