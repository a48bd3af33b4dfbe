"""When a node's GPU facts are too old to be offered: the one definition, in SQL and in Python.

A scheduler that passes maxAge (seconds; on freeGpus, nodes, place and
fit) asks for nodes whose GPUs were observed at most that long ago:
nodes.gpus_observed_at, the agent's observedAt on the service's clock
(service/fleet/observed_at.py). last_seen cannot answer it: heartbeats
move it without saying anything about the GPUs, and an agent whose
discovery broke keeps beating on its last good report.

Every statement that filters on it builds its condition from
gpu_facts_fresh, and the verdicts (FACTS_STALE in explainPlacement) call
is_fresh on the age gpu_facts_age reads, so the offer and the explanation
cannot disagree. Both compare against the database's clock (now(), the
statement's transaction time), the clock every other age here is read by.
"""

from __future__ import annotations

from service.errors import InvalidInput

# A value that cannot be an age: refused with the field's name.
MAX_AGE_FIELD = "maxAge"


def gpu_facts_fresh(n: str = "n", max_age: str = ":max_age") -> str:
    """SQL: the node row `n` (of `nodes`) observed its GPUs at most `max_age` seconds ago.

    `max_age` is an expression (a bound parameter, by default) that is never
    NULL here: a caller without maxAge leaves the condition out.
    """
    return f"({n}.gpus_observed_at >= now() - make_interval(secs => CAST({max_age} AS float8)))"


def gpu_facts_age(n: str = "n") -> str:
    """SQL: how many seconds ago the node row `n` observed its GPUs, as is_fresh reads it."""
    return f"extract(epoch FROM now() - {n}.gpus_observed_at)"


def is_fresh(age: float | None, max_age: float | None) -> bool:
    """gpu_facts_fresh for an age already read (gpu_facts_age); no maxAge: every age."""
    return max_age is None or (age is not None and age <= max_age)


def check_max_age(max_age: int | None, field: str = MAX_AGE_FIELD) -> None:
    """Refuse an age no fact can have (negative): the caller's BAD_INPUT, naming the field."""
    if max_age is not None and max_age < 0:
        raise InvalidInput(field, max_age, "an age in seconds is 0 or more")


def stale_detail(age: float, max_age: float) -> str:
    """FACTS_STALE's words: how old the node's GPU facts are against the age asked for."""
    return f"GPU facts observed {age:.0f} s ago, older than maxAge {max_age:g} s"
