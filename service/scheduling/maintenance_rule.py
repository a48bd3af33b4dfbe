"""Which nodes placement avoids for a maintenance window: the one definition, in SQL.

A maintenance window (service/fleet/maintenance/) is in force on its nodes
from its drain time (start - drainLead) until its end, unless cancelled or
done. While it is, a new replica does not go there (verdict MAINTENANCE)
unless it promised to be released by the window's start (PlaceInput.until at
or before it): a replica that leaves in time never has to be moved.

The rule reads time, not the window's state: the transition that puts the
taint may run a second late (its loop's interval), and placement must not
fill a node in that second. The window's taint (PREFER_NO_SCHEDULE, then
NO_SCHEDULE: service/scheduling/taints.py, MAINTENANCE_KEY) is what an
operator and a scheduler see on the node; this is what keeps new replicas
off it, tolerations or not (the window is the operator's plan, not a fault
a request may accept).

Each statement that reads candidates (placement/statements.py) filters
with maintenance_on and carries maintenance_json as the node fact the
verdict names (verdicts.judge), so the filter and the verdict cannot
disagree. The request's `until` is the :until parameter, the instant it is
judged at :at (AT).
"""

from __future__ import annotations

from enum import Enum


class MaintenanceState(Enum):
    SCHEDULED = "SCHEDULED"
    DRAINING = "DRAINING"
    IN_PROGRESS = "IN_PROGRESS"
    DONE = "DONE"
    CANCELLED = "CANCELLED"


# The states of a window that has not ended (nor been cancelled).
OPEN_STATES = (MaintenanceState.SCHEDULED, MaintenanceState.DRAINING, MaintenanceState.IN_PROGRESS)
OPEN_STATES_SQL = "(" + ", ".join(f"'{s.value}'" for s in OPEN_STATES) + ")"

UNTIL = "CAST(:until AS timestamptz)"
# The instant placement is judged at: now, or the later one fit, fitGroup and
# freeGpus are asked about (:at, PlaceRequest.at; NULL for a place), so a
# window in force then is taken out then (docs/scheduler/reservations.md).
AT = "coalesce(CAST(:at AS timestamptz), now())"


def _in_force(w: str, at: str, until: str) -> str:
    """SQL: the window row `w` keeps a replica placed at `at` with promise `until` off its nodes."""
    return (
        f"{w}.state IN {OPEN_STATES_SQL} AND {w}.drain_at <= {at} AND {at} < {w}.end_at"
        f" AND ({until} IS NULL OR {until} > {w}.start_at)"
    )


def _windows_of(node: str, at: str, until: str) -> str:
    return (
        "FROM maintenance_nodes mn JOIN maintenance_windows mw ON mw.id = mn.window_id"
        f" WHERE mn.node_id = {node} AND {_in_force('mw', at, until)}"
    )


def maintenance_on(node: str, at: str = AT, until: str = UNTIL) -> str:
    """SQL boolean: a window in force at `at` keeps the request (its `until`) off node `node`.

    One probe of ix_maintenance_nodes_node_id per node asked about.
    """
    return f"EXISTS (SELECT 1 {_windows_of(node, at, until)})"


def maintenance_json(node: str, at: str = AT, until: str = UNTIL) -> str:
    """SQL json: the first window (by start) maintenance_on finds on node `node`, or NULL.

    {"id", "start", "end", "why"} (the window's reason): what the MAINTENANCE verdict names.
    """
    return (
        "(SELECT json_build_object('id', mw.id, 'start', mw.start_at, 'end', mw.end_at,"
        f" 'why', mw.reason) {_windows_of(node, at, until)}"
        " ORDER BY mw.start_at, mw.id LIMIT 1)"
    )


# SQL boolean: some window is in force at :at (now, or the instant asked
# about), for any request. The pool
# census (fit's count, placement groups' reads) cannot tell nodes of one kind
# apart, so its statements carry this (an InitPlan, evaluated once) and their
# callers read every pool instead while it is true.
ANY_IN_FORCE = (
    "EXISTS (SELECT 1 FROM maintenance_windows mw"
    f" WHERE {_in_force('mw', AT, 'CAST(NULL AS timestamptz)')})"
)
