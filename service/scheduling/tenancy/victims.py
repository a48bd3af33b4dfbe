"""A replica stopped to make room for another (preemption): the record an answer lists.

Preemption itself (choosing the victims in the claiming transaction, within
disruption budgets) is issue 46's next part. What is here is what every
answer that can carry victims already holds: Allocated.preempted,
GroupPlaced.preempted and PlacementExplanation.preemptions are lists of
Preemption, empty while no place preempts.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
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
