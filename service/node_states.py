"""A node's states: their names, the reason shown with each and their wording; one home for each.

The database derives a node's `state` (STATE_SQL, the computed column of
service/tables.py) from two columns kept apart: the node's liveness (alive,
unreachable, lost: the sweep's, service/fleet/liveness.py) and the
operator's intent (admin_state: cordoned, draining). Liveness problems come
first, so a cordoned node that drops off the network reads as unreachable
and, back again, as cordoned with the operator's reason.

The reason shown with a state is the one that explains it: the liveness
reason while unreachable or lost (with no actor: the sweep set it), the
operator's reason and actor otherwise. Every answer that shows or words a
state (Node.stateReason in pages and records, a placement verdict, an
allocation's refusal) takes it from here, in SQL (state_reason_sql) or in
Python (shown_reason); tests/fleet/test_node_states.py fails when a second
definition appears elsewhere in the service and checks that the two forms
agree on a database holding every state.

Whether a state takes new placement is service/scheduling/availability.py's
rule (node_schedulable), built on these names. This module imports nothing
from the service: every layer may read it.
"""

from __future__ import annotations

from enum import Enum


class NodeState(Enum):
    """The states a node is in, as schedulers see them (the GraphQL enum NodeState)."""

    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    UNREACHABLE = "unreachable"
    LOST = "lost"


# Every state's name, in the order answers list them (metrics, errors).
STATES: tuple[str, ...] = tuple(state.value for state in NodeState)
# What an operator sets (nodes.admin_state); NULL is no intent.
ADMIN_STATES = (NodeState.CORDONED.value, NodeState.DRAINING.value)
ALIVE = "alive"
# What the liveness sweep finds a node to be (nodes.liveness): the states
# whose reason is the liveness reason.
LIVENESS_PROBLEMS = (NodeState.UNREACHABLE.value, NodeState.LOST.value)
LIVENESS = (ALIVE, *LIVENESS_PROBLEMS)


def _sql_list(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


# The computed column nodes.state (tables.py): liveness problems first, then
# the operator's intent, else ready.
STATE_SQL = (
    f"CASE WHEN liveness <> '{ALIVE}' THEN liveness "
    f"WHEN admin_state IS NOT NULL THEN admin_state ELSE '{NodeState.READY.value}' END"
)
# tables.py's CHECKs on the two columns the state is derived from.
ADMIN_STATE_CHECK = f"admin_state IN ({_sql_list(ADMIN_STATES)})"
LIVENESS_CHECK = f"liveness IN ({_sql_list(LIVENESS)})"


def state_reason_sql(n: str = "n") -> str:
    """SQL: the reason shown with the state of the node row `n` (of `nodes`), as shown_reason."""
    return (
        f"CASE WHEN {n}.state IN ({_sql_list(LIVENESS_PROBLEMS)}) THEN {n}.liveness_reason"
        f" ELSE {n}.admin_reason END"
    )


def state_actor_sql(n: str = "n") -> str:
    """SQL: who set the state of the node row `n`: the operator's actor, none for the sweep's."""
    problems = _sql_list(LIVENESS_PROBLEMS)
    return f"CASE WHEN {n}.state IN ({problems}) THEN NULL ELSE {n}.admin_actor END"


def shown_reason(
    state: str, admin_reason: str | None, admin_actor: str | None, liveness_reason: str | None
) -> tuple[str | None, str | None]:
    """The reason and actor shown with a node's state: the ones that explain it.

    A liveness reason while unreachable or lost (no actor: the sweep), the
    operator's while cordoned or draining.
    """
    if state in LIVENESS_PROBLEMS:
        return liveness_reason, None
    return admin_reason, admin_actor


def state_phrase(state: str, reason: str | None) -> str:
    """'cordoned: kernel upgrade', 'unreachable': a state and, if known, why."""
    return f"{state}: {reason}" if reason else state
