"""Which path a KV-cache transfer between two replicas gets: the one rule, for plans and for placed groups.

Closest first: the same NVLink group (both replicas' GPUs on one node in one
NVLink group), the same node, the same NVLink domain (multi-node NVLink,
GB200), the same value of the locality label (a rack, a leaf switch), a
fabric both are on, or across fabrics. vLLM #55434 found multi-node NVLink
slower than RDMA on GB200 for KV transfer: the answer says which path a pair
gets, and leaves the judgement to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class KvPathKind(Enum):
    SAME_NVLINK_GROUP = "SAME_NVLINK_GROUP"
    SAME_NODE = "SAME_NODE"
    SAME_NVLINK_DOMAIN = "SAME_NVLINK_DOMAIN"
    SAME_LABEL = "SAME_LABEL"
    SAME_FABRIC = "SAME_FABRIC"
    CROSS_FABRIC = "CROSS_FABRIC"


# Lower is closer: the planner's score sums these over a group's KV pairs.
CLOSENESS = {kind: rank for rank, kind in enumerate(KvPathKind)}


@dataclass(frozen=True)
class Zone:
    """Where a node is, for locality: its fabrics, NVLink domain and locality label value."""

    fabrics: tuple[str, ...]
    domain: str | None
    label: str | None


@dataclass(frozen=True)
class Whereabouts:
    """Where a replica is: its nodes with their zones, and (placed) the NVLink groups of its GPUs."""

    nodes: tuple[tuple[str, Zone], ...]
    # (node id, NVLink group) of each GPU it holds; empty for a plan not yet claimed.
    nvlink_groups: frozenset[tuple[str, int | None]] = frozenset()


def path_kind(a: Whereabouts, b: Whereabouts) -> KvPathKind:
    """The path between two replicas: the closest kind that holds for every pair of their nodes."""
    a_nodes = {node for node, _ in a.nodes}
    b_nodes = {node for node, _ in b.nodes}
    if len(a_nodes) == 1 and a_nodes == b_nodes:
        groups = {g for _, g in a.nvlink_groups | b.nvlink_groups}
        if len(groups) == 1 and None not in groups and a.nvlink_groups and b.nvlink_groups:
            return KvPathKind.SAME_NVLINK_GROUP
        return KvPathKind.SAME_NODE
    zones = [zone for _, zone in a.nodes + b.nodes]
    domains = {z.domain for z in zones}
    if len(domains) == 1 and None not in domains:
        return KvPathKind.SAME_NVLINK_DOMAIN
    labels = {z.label for z in zones}
    if len(labels) == 1 and None not in labels:
        return KvPathKind.SAME_LABEL
    shared = set(zones[0].fabrics).intersection(*(z.fabrics for z in zones[1:]))
    return KvPathKind.SAME_FABRIC if shared else KvPathKind.CROSS_FABRIC


def kv_pairs(senders: int, receivers: int) -> list[tuple[int, int]]:
    """Every (kvFrom replica, kvTo replica) pair, by number: kvPaths lists them all."""
    return [(i, j) for i in range(senders) for j in range(receivers)]


def partner(receiver: int, senders: int) -> int:
    """The kvFrom replica a kvTo replica is placed beside: round robin, so each sender gets its share."""
    return receiver % senders
