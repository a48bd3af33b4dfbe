"""XIDs, and the health they leave behind until the GPU is repaired and validated.

A GPU that raised a critical XID (fallen off the bus, a double-bit ECC error,
an NVLink error) can look healthy to NVML a minute later: NVML keeps no memory
of the event, and a service that believed the next report would offer the GPU
to the next replica, which then fails the same way. What an XID means is the
remediation policy's (service/fleet/health/policy.py: NVIDIA's XID catalog,
the driver's recovery action for XID 154, the operator's overrides): one
that taints leaves a sticky reason `xid_<n>` on the GPU (gpus.sticky_reasons)
that later healthy reports do not clear, a remediation (PENDING), and the
policy's taint (service/fleet/health/faults.py), unless the circuit
breaker suppresses them. A reboot (a new boot id), a reset the agent saw
(GpuInput.resetSeen: agent/discovery/resets.py says how) or an operator's
reset (clearGpuHealth) carries out the remediation; the sticky reason and the
taint go once the validation the policy requires has passed. Sticky reasons
no remediation holds go with a reboot, or that GPU's reset, as before. Each
is recorded as an event.

An application's XID (13, 31, 43, 45...) says the program misbehaved, not the
GPU: it is recorded and counted, and the GPU stays usable.

Whether a GPU with sticky reasons may be used is service/scheduling/availability.py's
rule; this module only keeps the reasons.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import text

from service.database.connections import Connection
from service.fleet.gpu_changes import after_change, gpu_detail, gpu_of, lock_gpus, record_events
from service.fleet.health import remediations
from service.fleet.health.faults import Fault, act_on
from service.fleet.health.policy import RemediationAction, current
from service.fleet.reports import NodeReport
from service.scheduling.gpu_pools import refresh_pools
from service.scheduling.taints import TaintSource

STICKY_PREFIX = "xid_"


def sticky_reason(xid: int) -> str:
    return f"{STICKY_PREFIX}{xid}"


@dataclass(frozen=True)
class ReportedXid:
    gpu_class: str
    xid: int


_SET_STICKY = text(
    """
    UPDATE gpus g SET sticky_reasons = r.sticky
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(idx int, sticky text[])
    WHERE g.node_id = :node_id AND g.idx = r.idx AND g.sticky_reasons IS DISTINCT FROM r.sticky
    """
)


async def _set_sticky(conn: Connection, node_id: str, sticky: Mapping[int, Sequence[str]]) -> None:
    rows = [{"idx": i, "sticky": sorted(set(s))} for i, s in sorted(sticky.items())]
    await conn.execute(_SET_STICKY, {"node_id": node_id, "rows": json.dumps(rows)})


def _faults(report: NodeReport) -> list[tuple[int, int, Fault]]:
    """(GPU, XID or 0, fault) the policy acts on in a report: its XIDs, and ruled health reasons."""
    policy = current()
    found: list[tuple[int, int, Fault]] = []
    for g in report.gpus:
        for xid in g.xids:
            rule = policy.for_xid(xid, g.recovery_action)
            cause = f"xid {xid}: {rule.why}" if rule.why else f"xid {xid}"
            found.append(
                (g.index, xid, Fault((g.index,), f"xid-{xid}", cause, rule, TaintSource.XID))
            )
        for reason in g.health_reasons:
            ruled = policy.health.get(reason)
            if ruled is not None and ruled.acts:
                cause = f"{reason}: {ruled.why}" if ruled.why else reason
                fault = Fault((g.index,), f"health-{reason}", cause, ruled, TaintSource.POLICY)
                found.append((g.index, 0, fault))
    return found


async def after_report(
    conn: Connection, report: NodeReport, rebooted: bool, actor: str | None
) -> tuple[ReportedXid, ...]:
    """A stored report's XIDs, ruled health and reboot: events, remediations, sticky reasons, pools.

    Runs after the report's GPUs are stored; no statement when there is
    nothing of the kind. A new boot id comes first (the XIDs in the same
    report happened after that boot): the node's open REBOOT_NODE and
    RESET_GPU remediations were carried out, and the sticky reasons no open
    remediation holds are cleared.
    """
    faults = _faults(report)
    resets = {g.index: g.reset_seen for g in report.gpus if g.reset_seen}
    if not (faults or rebooted or resets):
        return ()
    gpus = await lock_gpus(conn, report.id)
    sticky = {i: list(g.sticky) for i, g in gpus.items()}
    events: list[dict[str, object]] = []
    # Resets, like a reboot, come before the report's XIDs (which happened after).
    why_reset: dict[int, str] = {}
    if rebooted:
        await remediations.carried_out(
            conn,
            report.id,
            (RemediationAction.REBOOT_NODE, RemediationAction.RESET_GPU),
            None,
            actor,
            "the node rebooted (new boot id)",
        )
        why_reset = {i: "the node rebooted (new boot id): its GPUs were reset" for i in gpus}
    else:
        for index, seen in sorted(resets.items()):
            reason = f"GPU {index} was reset (the agent saw it: {seen})"
            await remediations.carried_out(
                conn, report.id, (RemediationAction.RESET_GPU,), (index,), actor, reason
            )
            why_reset[index] = reason
    if why_reset:
        held = await remediations.covered_sticky(conn, report.id)
        for index, reason in sorted(why_reset.items()):
            gpu = gpus[index]  # the report's GPUs are stored
            cleared = [r for r in gpu.sticky if (gpu.idx, r) not in held]
            if cleared:
                sticky[gpu.idx] = [r for r in gpu.sticky if (gpu.idx, r) in held]
                events.append(
                    {
                        "kind": "gpu_health_cleared",
                        "reason": reason,
                        "detail": gpu_detail(gpu, cleared=cleared),
                    }
                )
    acted = await act_on(conn, report.id, [f for _, _, f in faults], actor)
    counted: list[ReportedXid] = []
    why_unusable: dict[int, str] = {}
    for (index, xid, fault), done in zip(faults, acted, strict=True):
        if not xid:
            continue
        gpu = gpus[index]  # the report's GPUs are stored
        counted.append(ReportedXid(gpu.gpu_class, xid))
        rule = fault.rule
        # Sticky when its rule taints and the breaker let it taint this GPU,
        # whether it opened a remediation or joined one.
        takes = rule.effect is not None and not done.suppressed
        events.append(
            {
                "kind": "gpu_xid",
                "reason": rule.why or None,
                "detail": gpu_detail(gpu, xid=xid, critical=takes),
            }
        )
        if takes:
            sticky[index].append(sticky_reason(xid))
            why_unusable.setdefault(index, f"{sticky_reason(xid)}: {rule.why}")
    await _set_sticky(conn, report.id, sticky)
    await after_change(conn, report.id, gpus, why_unusable, events)
    await record_events(conn, report.id, actor, events)
    return tuple(counted)


async def clear_gpu_health(conn: Connection, node_id: str, index: int, actor: str | None) -> None:
    """An operator reset the GPU by hand: its sticky reasons go (an event says which).

    Its open RESET_GPU remediations were carried out: they wait for the
    policy's validation, their taints in place until it passes.
    """
    gpus = await lock_gpus(conn, node_id)
    gpu = gpu_of(gpus, node_id, index)
    await _set_sticky(conn, node_id, {index: []})
    await refresh_pools(conn, [node_id])
    await record_events(
        conn,
        node_id,
        actor,
        [
            {
                "kind": "gpu_health_cleared",
                "reason": "cleared by an operator",
                "detail": gpu_detail(gpu, cleared=list(gpu.sticky)),
            }
        ],
    )
    await remediations.carried_out(
        conn,
        node_id,
        (RemediationAction.RESET_GPU,),
        (index,),
        actor,
        "an operator reset the GPU (clearGpuHealth)",
    )
