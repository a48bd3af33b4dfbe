"""Validation before re-admission: the tests a node runs after a remediation, and what their results do.

After a remediation was carried out (AWAITING_VALIDATION), its node's
validationsToRun lists each test the policy requires (default: a DCGM
diagnostic, `dcgm_diag`; operators name others, e.g. an NCCL loopback) that
has not passed since the remediation began waiting, with its GPUs. The
agent runs the command configured for each test, with a timeout, and
reports with recordValidation; operators' tools may report too.

- A pass of the last required test: the remediation is DONE, its taint
  lifted and the sticky health its fault left cleared. A pass counts only
  when the test ran on all of the remediation's GPUs: a diagnostic of one GPU
  says nothing of the other seven a node-wide remediation covers.
- A failure: the remediation keeps waiting, its taint in place (a retest
  that passes clears it), until the policy's allowed failures are used up:
  then ESCALATED (CONTACT_SUPPORT), taint kept.
- Drift remediations are not validated by tests but by the node's next
  report (remediations.py): no test is listed for them, no result counts.
- A result for GPUs no remediation waits on is recorded; a failure taints
  them (source VALIDATION, key validation-<test>) and a later pass of the
  same test lifts that taint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text

from service.bounds import MAX_ID_LENGTH, MAX_VALIDATION_DETAILS
from service.database.connections import Connection
from service.errors import InvalidInput
from service.event_log.events import record_event
from service.fleet.gpu_changes import lock_gpus
from service.fleet.health import remediations
from service.fleet.health.policy import RemediationAction, current
from service.fleet.health.remediations import (
    COLUMNS,
    NOT_DRIFT_SQL,
    Remediation,
    RemediationState,
    of_row,
)
from service.fleet.health.taints import TaintRequest, lift_taint, put_taint
from service.scheduling.rejections import index_ranges, shown
from service.scheduling.taints import TaintEffect, TaintSource
from service.stored_text import id_problem, storable

# A test's output kept with its result (bounds.py); an agent cuts a longer one.
MAX_DETAILS = MAX_VALIDATION_DETAILS
VALIDATION_KEY = "validation-{test}"


@dataclass(frozen=True)
class ValidationResult:
    node_id: str
    gpu_indices: tuple[int, ...]
    test: str
    passed: bool
    details: str | None = None


@dataclass(frozen=True)
class ValidationRequest:
    test: str
    gpu_indices: tuple[int, ...]
    remediation_id: int | None


def _check(result: ValidationResult, gpus: Sequence[int]) -> None:
    """BAD_INPUT naming the field; nothing is stored for a refused result."""
    if not result.test or id_problem(result.test) is not None:
        raise InvalidInput(
            "input.test", result.test, f"a test name is 1 to {MAX_ID_LENGTH} characters"
        )
    if any(c.isspace() for c in result.test):
        raise InvalidInput("input.test", result.test, "a test name has no spaces")
    if not result.gpu_indices:
        raise InvalidInput("input.gpuIndices", [], "name the GPUs the test ran on")
    seen: set[int] = set()
    for i, index in enumerate(result.gpu_indices):
        if index not in gpus:
            raise InvalidInput(
                f"input.gpuIndices[{i}]",
                index,
                f"node {shown(result.node_id)} has no GPU {index}; its GPUs are "
                f"{index_ranges(gpus)}",
            )
        if index in seen:
            raise InvalidInput(f"input.gpuIndices[{i}]", index, "listed twice")
        seen.add(index)
    if result.details is not None and (
        len(result.details) > MAX_DETAILS or not storable(result.details)
    ):
        raise InvalidInput(
            "input.details",
            result.details,
            f"at most {MAX_DETAILS} characters, without NUL (cut the test's output)",
        )


def _why(details: str | None) -> str:
    """': ' and the first line of a test's output (where a failure says why), or nothing."""
    first_line = (details or "").strip().splitlines()[:1]
    return f": {first_line[0][:200]}" if first_line else ""


_WAITING = text(
    f"""
    SELECT {COLUMNS} FROM remediations r
    WHERE r.node_id = :node_id AND r.state = 'AWAITING_VALIDATION'
      AND r.gpu_indices && CAST(:indices AS int[]) AND {NOT_DRIFT_SQL}
    ORDER BY r.id DESC LIMIT 1
    FOR UPDATE
    """
)
_RECORD = text(
    """
    INSERT INTO validation_results (node_id, remediation_id, gpu_indices, test, passed, details,
                                    actor)
    VALUES (:node_id, :remediation_id, :indices, :test, :passed, :details, :actor)
    """
)
_COUNT = text(
    """
    UPDATE remediations SET attempts = attempts + 1,
        failures = failures + CASE WHEN CAST(:passed AS boolean) THEN 0 ELSE 1 END
    WHERE id = :id
    RETURNING attempts, failures
    """
)
_PASSED_SINCE = text(
    """
    SELECT coalesce(array_agg(DISTINCT v.test), '{}') FROM validation_results v
    JOIN remediations r ON r.id = v.remediation_id
    WHERE v.remediation_id = :id AND v.passed AND v.at >= r.since
      AND v.gpu_indices @> r.gpu_indices
    """
)


async def record(
    conn: Connection, result: ValidationResult, actor: str | None
) -> Remediation | None:
    """Record a result; the remediation it concerns as it now stands, or None when none waits."""
    gpus = await lock_gpus(conn, result.node_id)
    _check(result, sorted(gpus))
    indices = sorted(set(result.gpu_indices))
    waiting = (
        await conn.execute(_WAITING, {"node_id": result.node_id, "indices": indices})
    ).one_or_none()
    remediation = None if waiting is None else of_row(waiting)
    await conn.execute(
        _RECORD,
        {
            "node_id": result.node_id,
            "remediation_id": None if remediation is None else remediation.id,
            "indices": indices,
            "test": result.test,
            "passed": result.passed,
            "details": result.details,
            "actor": actor,
        },
    )
    verdict = "passed" if result.passed else "failed"
    why = "" if result.passed else _why(result.details)
    await record_event(
        conn,
        "validation_recorded",
        node_id=result.node_id,
        actor=actor,
        reason=f"{result.test} {verdict} on GPU {index_ranges(indices)}{why}",
        detail={
            "test": result.test,
            "passed": result.passed,
            "gpuIndices": indices,
            "remediation": None if remediation is None else remediation.id,
        },
    )
    if remediation is None:
        await _unremediated(conn, result, indices, actor)
        return None
    counts = (await conn.execute(_COUNT, {"id": remediation.id, "passed": result.passed})).one()
    policy = current()
    required = set(policy.validations)
    if result.passed:
        passed = set((await conn.execute(_PASSED_SINCE, {"id": remediation.id})).scalar_one())
        if required <= passed:
            locked = await remediations.get(conn, remediation.id)
            return await remediations.move(
                conn,
                locked,
                RemediationState.DONE,
                actor,
                f"{', '.join(sorted(required)) or 'no test'} passed",
                "remediation_done",
            )
    elif result.test in required and counts.failures >= policy.allowed_failures:
        locked = await remediations.get(conn, remediation.id)
        return await remediations.move(
            conn,
            locked,
            RemediationState.ESCALATED,
            actor,
            f"{result.test} failed {counts.failures} times",
            "remediation_escalated",
            RemediationAction.CONTACT_SUPPORT,
        )
    return await remediations.get(conn, remediation.id)


async def _unremediated(
    conn: Connection, result: ValidationResult, indices: Sequence[int], actor: str | None
) -> None:
    """A result no remediation waits on: a failure taints the GPUs, a pass lifts that taint."""
    key = VALIDATION_KEY.format(test=result.test)
    if result.passed:
        await lift_taint(conn, result.node_id, indices, key, actor)
        return
    reason = f"{result.test} failed{_why(result.details)}"
    await put_taint(
        conn,
        result.node_id,
        indices,
        TaintRequest(key, None, TaintEffect.NO_SCHEDULE, reason, TaintSource.VALIDATION),
        actor,
    )


# A drift remediation is judged by the node's reports, not by these tests
# (remediations.py): none is listed for it, and no result counts towards it.
_TO_RUN = text(
    f"""
    SELECT r.id, r.gpu_indices, r.node_id,
           ARRAY(SELECT DISTINCT v.test FROM validation_results v
                 WHERE v.remediation_id = r.id AND v.passed AND v.at >= r.since
                   AND v.gpu_indices @> r.gpu_indices) AS passed
    FROM remediations r
    WHERE r.node_id = ANY(CAST(:ids AS text[])) AND r.state = 'AWAITING_VALIDATION'
      AND {NOT_DRIFT_SQL}
    ORDER BY r.node_id, r.id
    """
)


async def to_run(conn: Connection, node_ids: Sequence[str]) -> dict[str, list[ValidationRequest]]:
    """Per node, the tests the policy requires of its remediations that have not passed yet."""
    required = current().validations
    out: dict[str, list[ValidationRequest]] = {n: [] for n in node_ids}
    for r in await conn.execute(_TO_RUN, {"ids": list(node_ids)}):
        for test in required:
            if test not in r.passed:
                out[r.node_id].append(ValidationRequest(test, tuple(r.gpu_indices), r.id))
    return out
