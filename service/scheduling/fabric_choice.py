"""Which fabric a multi-node replica runs on, when its nodes share several: the one rule.

Speed first: the fabric whose slowest attachment among the replica's nodes
is fastest (a collective runs at the speed of its slowest link). Then the
name that sorts first, so the same nodes always get the same fabric.

allocate() applies it to the nodes it was handed
(service/scheduling/allocations/allocating.py); place() ranks each plan's
fabric by it among plans equally good otherwise (plan_placement in
service/scheduling/placement/plan.py). tests/scheduling/test_fabric_choice.py
fails when a second rule appears in the service, and checks that both pick
the faster fabric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def fabric_rank(fabric: str, rates_gbps: Iterable[int]) -> tuple[int, str]:
    """The rule as a sort key (lowest first): `fabric`, given its links' rates on the nodes."""
    return (-min(rates_gbps), fabric)


def choose_fabric(fabrics: Iterable[str], rates_on: Callable[[str], Iterable[int]]) -> str | None:
    """The fabric the rule picks among `fabrics` (rates_on: a fabric's links' rates), or None."""
    return min(fabrics, key=lambda fabric: fabric_rank(fabric, rates_on(fabric)), default=None)
