"""Victims: which replicas a place may stop to make room, in which order, and the record answers list.

The rules (docs/scheduler/tenancy.md, "Preemption"), one definition each:

- kind_of: a replica may be a victim when its priority is strictly lower than
  the placing replica's (LOWER_PRIORITY), or, while the placing tenant stays
  within its guarantee once placed, when another tenant holds it and that
  tenant holds more than its guarantee of the class (RECLAIM). Never a
  replica of the placing tenant at an equal or higher priority.
- allowed: a victim set never takes a deployment below its disruption
  budget's minAvailable, and never reclaims more of a tenant's class than it
  holds beyond its guarantee.
- set_key: among the sets that make the whole shape fit, the fewest
  replicas, then the lowest priorities (the most important victim first),
  then the fewest GPUs, then the youngest (the oldest victim's creation,
  latest first), then the replica ids (so the choice is one).

Pure: the search that tries sets against the fleet is
service/scheduling/placement/preemption.py's; what is here reads no database.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum


class PreemptionKind(Enum):
    """Why a replica was chosen as a victim (the contract's words)."""

    # Its priority is lower than the placing replica's.
    LOWER_PRIORITY = "LOWER_PRIORITY"
    # Its tenant holds it beyond its guarantee while the placing tenant is below its own.
    RECLAIM = "RECLAIM"


@dataclass(frozen=True)
class Preemption:
    replica_id: str
    tenant: str
    priority: int
    deployment: str | None
    gpus: int
    node_ids: tuple[str, ...]
    kind: PreemptionKind
    reason: str
    # The class the preemptor asked for, which the victim held (for /metrics).
    gpu_class: str = ""


@dataclass(frozen=True)
class Candidate:
    """A replica that may be stopped for one place, as the search reads it (every shard of it)."""

    replica_id: str
    tenant: str
    priority: int
    deployment: str | None
    created_at: datetime
    # Every GPU the replica holds, of any class: what stopping it frees.
    gpus: int
    # (node id, GPUs of the asked class it holds there), by node id.
    class_gpus: tuple[tuple[str, int], ...]
    # (shard id, fence) of every shard: re-read under the nodes' locks, a
    # replica that changed meanwhile is not stopped.
    shards: tuple[tuple[str, int], ...]
    # Every node its shards are on, by id.
    node_ids: tuple[str, ...]
    kind: PreemptionKind

    @property
    def class_total(self) -> int:
        return sum(n for _, n in self.class_gpus)


def kind_of(
    tenant: str,
    priority: int,
    placing_tenant: str,
    placing_priority: int,
    reclaiming: bool,
    beyond_guarantee: bool,
) -> PreemptionKind | None:
    """Whether a replica of (tenant, priority) may be a victim of the placing one, and why.

    `reclaiming`: the placing tenant stays within its guarantee of the class
    once this place is counted (reclaiming). `beyond_guarantee`: the
    replica's tenant holds more than its guarantee of the class now.
    """
    if priority < placing_priority:
        return PreemptionKind.LOWER_PRIORITY
    if reclaiming and tenant != placing_tenant and beyond_guarantee:
        return PreemptionKind.RECLAIM
    return None


def reclaiming(used: int, asked: int, guaranteed: int) -> bool:
    """Whether a tenant holding `used` of a class, asking `asked` more, stays within its guarantee."""
    return guaranteed > 0 and used + asked <= guaranteed


@dataclass(frozen=True)
class BudgetLine:
    """A disruption budget as a victim set is checked against it."""

    tenant: str
    deployment: str
    min_available: int
    placed: int


def budgets_broken(
    victims: Iterable[Candidate], budgets: Mapping[tuple[str, str], BudgetLine]
) -> list[BudgetLine]:
    """The budgets a victim set would take below their minAvailable, by (tenant, deployment)."""
    taken = Counter((v.tenant, v.deployment) for v in victims if v.deployment is not None)
    return [
        budgets[key]
        for key in sorted(taken)
        if key in budgets and budgets[key].placed - taken[key] < budgets[key].min_available
    ]


def reclaim_fits(victims: Iterable[Candidate], beyond: Mapping[str, int]) -> bool:
    """Whether the set reclaims no more of a tenant's class than it holds beyond its guarantee.

    `beyond`: per tenant with a quota of the class, GPUs held beyond its
    guarantee (a tenant absent has no quota: everything it holds is beyond).
    """
    reclaimed: Counter[str] = Counter()
    for v in victims:
        if v.kind is PreemptionKind.RECLAIM:
            reclaimed[v.tenant] += v.class_total
    return all(n <= beyond[t] for t, n in reclaimed.items() if t in beyond)


def allowed(
    victims: Sequence[Candidate],
    budgets: Mapping[tuple[str, str], BudgetLine],
    beyond: Mapping[str, int],
) -> bool:
    """Whether a victim set keeps every budget and takes back only what was borrowed."""
    return not budgets_broken(victims, budgets) and reclaim_fits(victims, beyond)


SetKey = tuple[int, tuple[int, ...], int, tuple[float, ...], tuple[str, ...]]


def set_key(victims: Iterable[Candidate]) -> SetKey:
    """The order of victim sets: the smallest key is the one chosen (see the module's docstring)."""
    chosen = list(victims)
    return (
        len(chosen),
        tuple(sorted((v.priority for v in chosen), reverse=True)),
        sum(v.gpus for v in chosen),
        tuple(-t for t in sorted(v.created_at.timestamp() for v in chosen)),
        tuple(sorted(v.replica_id for v in chosen)),
    )


def record_of(victim: Candidate, preemptor: str, gpu_class: str) -> Preemption:
    """The answer's line for a victim stopped to make room for `preemptor`."""
    if victim.kind is PreemptionKind.LOWER_PRIORITY:
        why = f"priority {victim.priority} is lower than {preemptor}'s"
    else:
        why = (
            f"tenant {victim.tenant} holds it beyond its guarantee, and {preemptor}'s tenant "
            "is below its own"
        )
    return Preemption(
        victim.replica_id,
        victim.tenant,
        victim.priority,
        victim.deployment,
        victim.gpus,
        victim.node_ids,
        victim.kind,
        f"stopped for {preemptor}: {why}",
        gpu_class,
    )


class PreemptedCounts:
    """Replicas preempted by this process's committed places, by the victim's tenant and GPU class.

    Process-local, for /metrics (inventory_tenant_replicas_preempted_total):
    every process exports its own and Prometheus sums them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = defaultdict(int)

    def count(self, tenant: str, gpu_class: str, replicas: int = 1) -> None:
        with self._lock:
            self._counts[(tenant, gpu_class)] += replicas

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


PREEMPTED = PreemptedCounts()
