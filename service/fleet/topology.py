"""A node's GPU topology as reported: NVLink groups, the checks a report's topology must pass, and its words.

An NVLink group is a connected set of GPUs on one node (a GPU's peers are the
GPUs it reaches over NVLink, directly or through an NVSwitch); it is named by
its lowest index. A shard whose GPUs lie in one group runs its all-reduce
over NVLink; one split across groups falls back to PCIe, several times slower.

Unknown is not zero: a GPU whose peers were not reported (None) has no group,
and a node none of whose GPUs reported peers has an unknown topology, which
constrains nothing unless a request needs it. An empty list of peers is the
opposite: the agent looked and the GPU has no NVLink (an L40S).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import text

from service.bounds import MAX_DOMAIN_LENGTH, MAX_NUMA_NODE
from service.database.connections import Connection
from service.errors import InvalidInput
from service.scheduling.availability import gpu_free, is_free
from service.stored_text import storable

if TYPE_CHECKING:
    from service.fleet.node_details import GpuRecord


class ReportedGpu(Protocol):
    """A GPU's topology fields as a report gives them (service/fleet/reports.py's GpuReport)."""

    @property
    def index(self) -> int: ...
    @property
    def numa_node(self) -> int | None: ...
    @property
    def nvlink_peers(self) -> tuple[int, ...] | None: ...
    @property
    def nvlink_domain(self) -> str | None: ...
    @property
    def near_hcas(self) -> tuple[str, ...] | None: ...


def nvlink_groups(peers: Mapping[int, Sequence[int] | None]) -> dict[int, int | None]:
    """Each GPU's group (the lowest index of its connected set); None where its peers are unknown.

    Peers are symmetric by the time this runs (check_topology), so a plain
    union-find over the links gives the sets.
    """
    parent = {index: index for index, listed in peers.items() if listed is not None}

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    for index, listed in peers.items():
        for peer in listed or ():
            if peer in parent and index in parent:
                a, b = root(index), root(peer)
                parent[max(a, b)] = min(a, b)
    return {index: (root(index) if index in parent else None) for index in peers}


def check_topology(gpus: Sequence[ReportedGpu], fabric_hcas: Iterable[str]) -> None:
    """Raise InvalidInput for the first topology field that cannot describe this node.

    Refused, since each would store a topology the hardware cannot have and a
    scheduler would place a shard on it: a peer that is not a GPU of the node,
    a GPU listing itself, a link only one end reports, a near HCA that no
    fabric of the node lists (the shard would be handed an adapter it cannot
    use), a negative NUMA node, an empty domain. `fabric_hcas`: every
    adapter the node's fabrics list.
    """
    on_node = {gpu.index for gpu in gpus}
    peers_of = {gpu.index: gpu.nvlink_peers for gpu in gpus}
    hcas = set(fabric_hcas)
    for i, gpu in enumerate(gpus):
        where = f"input.gpus[{i}]"
        if gpu.numa_node is not None and not 0 <= gpu.numa_node <= MAX_NUMA_NODE:
            raise InvalidInput(
                f"{where}.numaNode",
                gpu.numa_node,
                f"must be 0 to {MAX_NUMA_NODE}; omit it if unknown",
            )
        if gpu.nvlink_domain is not None:
            if not gpu.nvlink_domain.strip():
                raise InvalidInput(
                    f"{where}.nvlinkDomain", gpu.nvlink_domain, "must not be empty; omit it if none"
                )
            if len(gpu.nvlink_domain) > MAX_DOMAIN_LENGTH or not storable(gpu.nvlink_domain):
                raise InvalidInput(
                    f"{where}.nvlinkDomain", gpu.nvlink_domain, "is not a 'uuid/clique' domain"
                )
        for peer in gpu.nvlink_peers or ():
            if peer == gpu.index:
                raise InvalidInput(f"{where}.nvlinkPeers", peer, "a GPU is not its own peer")
            if peer not in on_node:
                raise InvalidInput(
                    f"{where}.nvlinkPeers", peer, f"no GPU {peer} on this node (GPU {gpu.index})"
                )
            theirs = peers_of[peer]
            if theirs is not None and gpu.index not in theirs:
                raise InvalidInput(
                    f"{where}.nvlinkPeers",
                    peer,
                    f"GPU {gpu.index} lists GPU {peer} but GPU {peer} does not list GPU {gpu.index}",
                )
        if gpu.nvlink_peers is not None and len(set(gpu.nvlink_peers)) != len(gpu.nvlink_peers):
            raise InvalidInput(f"{where}.nvlinkPeers", list(gpu.nvlink_peers), "lists a peer twice")
        for hca in gpu.near_hcas or ():
            if hca not in hcas:
                raise InvalidInput(
                    f"{where}.nearHcas", hca, "no fabric of this node lists this adapter"
                )


def describe_groups(sizes: Sequence[int] | None) -> str:
    """A node's NVLink groups for an operator: 'NVLink 8', 'NVLink 4x2', 'NVLink 4 + 2x2', 'none'.

    None (no GPU reported its peers) reads 'unknown'. GPUs without NVLink
    are left out of the words unless there is nothing else ('none').
    """
    if sizes is None:
        return "unknown"
    linked = Counter(size for size in sizes if size > 1)
    if not linked:
        return "none"
    parts = [
        f"{size}x{count}" if count > 1 else str(size)
        for size, count in sorted(linked.items(), reverse=True)
    ]
    return "NVLink " + " + ".join(parts)


def group_sizes(gpus: Sequence[GpuRecord]) -> list[int] | None:
    """The sizes of a node's NVLink groups, largest first; None when no GPU reported its peers."""
    groups = Counter(g.nvlink_group for g in gpus if g.nvlink_group is not None)
    if not groups:
        return None
    return sorted(groups.values(), reverse=True)


def largest_free_group(gpus: Sequence[GpuRecord]) -> int | None:
    """The most free GPUs in one NVLink group of the node; None when its topology is unknown.

    A GPU without NVLink is a group of one, so a node of free L40S answers 1.
    """
    if group_sizes(gpus) is None:
        return None
    free = Counter(g.nvlink_group for g in gpus if g.nvlink_group is not None and is_free(g))
    return max(free.values(), default=0)


# The same two answers for a node row `n` in SQL, where a page of nodes is
# built as JSON by PostgreSQL (service/graphql/fast/json_pages.py). Each is written next
# to its Python definition above and follows it step by step;
# tests/fleet/test_topology_reports.py checks that both agree on every topology
# the agents report.


def _groups_of(n: str) -> str:
    """SQL rows (group, size, free) of node `n`'s NVLink groups: group_sizes' Counter."""
    return (
        "SELECT g.nvlink_group, count(*) AS size,"
        f" count(*) FILTER (WHERE {gpu_free('g')}) AS free"
        f" FROM gpus g WHERE g.node_id = {n}.id AND g.nvlink_group IS NOT NULL"
        " GROUP BY g.nvlink_group"
    )


def describe_groups_sql(n: str = "n") -> str:
    """SQL text: describe_groups(group_sizes(the GPUs of node row `n`))."""
    # Per size, how many groups have it; the words list sizes > 1, largest
    # first, "4x2" for two groups of 4.
    return (
        "(SELECT CASE WHEN count(*) = 0 THEN 'unknown'"
        " WHEN count(*) FILTER (WHERE s.size > 1) = 0 THEN 'none'"
        " ELSE 'NVLink ' || string_agg(CASE WHEN s.groups > 1 THEN s.size || 'x' || s.groups"
        " ELSE s.size::text END, ' + ' ORDER BY s.size DESC) FILTER (WHERE s.size > 1) END"
        f" FROM (SELECT x.size, count(*) AS groups FROM ({_groups_of(n)}) x GROUP BY x.size) s)"
    )


def largest_free_group_sql(n: str = "n") -> str:
    """SQL integer: largest_free_group(the GPUs of node row `n`); null when its topology is unknown."""
    return (
        f"(SELECT CASE WHEN count(*) = 0 THEN NULL ELSE max(x.free) END FROM ({_groups_of(n)}) x)"
    )


# Free GPUs of a class, on nodes that take placement, per NVLink group.
_FREE_PER_GROUP = f"""
    SELECT count(*) AS n FROM gpus g
    JOIN gpu_pools p ON p.node_id = g.node_id AND p.gpu_class = g.gpu_class AND p.schedulable
    WHERE g.gpu_class = :cls AND g.nvlink_group IS NOT NULL AND {gpu_free("g")}
    GROUP BY g.node_id, g.nvlink_group
"""
_FRAGMENTED = text(
    f"SELECT coalesce(sum(x.n) FILTER (WHERE x.n < :size), 0) AS n FROM ({_FREE_PER_GROUP}) x"
)


async def fragmented_free(conn: Connection, gpu_class: str, shard_size: int) -> int:
    """Free GPUs of the class in NVLink groups that can no longer take a shard of `shard_size`.

    The capacity that stays idle for tensor-parallel jobs of that width
    however many GPUs are free. Nodes whose topology is unknown are not
    counted: unknown is not fragmented.
    """
    if shard_size < 1:
        raise InvalidInput("shardSize", shard_size, "must be at least 1")
    found = await conn.execute(_FRAGMENTED, {"cls": gpu_class, "size": shard_size})
    return int(found.scalar_one())
