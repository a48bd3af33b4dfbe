"""Replicas of one role spread over a node's NUMA nodes: the order their shards take its GPUs.

Used by the claims of placement groups' members (groups/claiming.py, and
claiming.claim_members for a whole group in one round).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any


def numa_columns(node: str) -> str:
    """SQL: columns gpu_indices and numa_nodes, node `node`'s GPUs by index and each one's NUMA node."""
    return f"""ARRAY(SELECT g.idx FROM gpus g WHERE g.node_id = {node} ORDER BY g.idx) AS gpu_indices,
           ARRAY(SELECT g.numa_node FROM gpus g WHERE g.node_id = {node} ORDER BY g.idx)
               AS numa_nodes"""


# Each GPU's NUMA node, by (node id, index).
NumaNodes = Mapping[tuple[str, int], int | None]


def numa_of(node_id: str, row: Any) -> dict[tuple[str, int], int | None]:
    """NumaNodes of the node `node_id` from a row with numa_columns."""
    return {(node_id, i): numa for i, numa in zip(row.gpu_indices, row.numa_nodes, strict=True)}


def spread_order(
    node_id: str,
    free: Sequence[int],
    held: Sequence[int],
    numa: NumaNodes,
    last: Collection[int] = (),
) -> list[int]:
    """The node's free GPUs, those on the NUMA node `held` has fewest GPUs on first.

    Replicas of one role on one PCIe root or NUMA node share its bandwidth
    (Dynamo #10171: both prefill workers on one PCIe root halved throughput,
    and raised latency about 30x). GPUs of one NUMA node stay together, in
    index order, so a shard of several GPUs takes them from one; a GPU whose
    NUMA node is unknown counts as one NUMA node of its own kind. `last`:
    GPUs a PREFER_NO_SCHEDULE taint sends last, which stay after the rest
    (issue 38: such GPUs are used last, however the others spread; the
    planner counts them so, groups/board.py).
    """
    load: dict[int | None, int] = {}
    for i in held:
        load[numa.get((node_id, i))] = load.get(numa.get((node_id, i)), 0) + 1

    def key(i: int) -> tuple[bool, int, int, int]:
        where = numa.get((node_id, i))
        return (i in last, load.get(where, 0), -1 if where is None else where, i)

    return sorted(free, key=key)
