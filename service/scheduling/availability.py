"""When a GPU is free and when a node is schedulable: the one definition of each.

Every statement that counts, lists, pools, pages or claims free GPUs builds its
condition from the SQL fragments here, and the few decisions made in Python
(a Node's freeGpus from loaded records, a placement verdict, an allocation's
refusal) call the predicates here. A rule that takes GPUs or nodes out of
placement (a cordoned GPU, a sticky XID) is added here once, and every
answer changes with it; written out in eight places, the ninth would offer
a GPU that the others refuse. tests/scheduling/test_availability.py fails when a second
definition appears elsewhere in the service, and checks that the SQL and the
Python forms agree on a database holding every case.

The fragments are plain SQL over a table alias, so they go where the plans
need them (an indexed lookup of gpu_pools, a LATERAL over one node's GPUs)
instead of behind a view or function the planner cannot see through. They
take no parameters and are fixed strings for a given alias, so the statements
built from them stay cacheable.

Derived state: gpu_pools holds, per node and class, the counts this module's
partition gives (pool_counts) and the node's schedulability (node_schedulable);
every transaction that changes a GPU, an allocation or a node's state keeps it
current (service/scheduling/gpu_pools.py), and schedulers' questions read it through
pool_offers.
"""

from __future__ import annotations

from typing import Protocol

from service.node_states import NodeState

# The node state in which a node takes new placement. The column `state` is
# computed by the database from liveness and the operator's intent
# (tables.nodes), so a node is schedulable exactly when it is alive and no
# operator cordoned or drained it.
SCHEDULABLE_STATE = NodeState.READY.value


def node_schedulable(n: str = "n") -> str:
    """SQL: the node row `n` (of `nodes`) takes new placement."""
    return f"({n}.state = '{SCHEDULABLE_STATE}')"


def is_schedulable(state: str) -> bool:
    """node_schedulable for a node's state already read."""
    return state == SCHEDULABLE_STATE


def _columns_of(g: str) -> str:
    """The prefix of `g`'s columns: none for an index predicate (`g` empty)."""
    return f"{g}." if g else ""


def gpu_healthy(g: str = "g") -> str:
    """SQL: the GPU row `g` is healthy: its agent says so and no sticky reason remains.

    A sticky reason (a critical XID, service/fleet/gpu_health.py) outlives healthy
    reports until the GPU is reset: NVML forgets the XID, the service must not.
    What Gpu.healthy shows, so a GPU is never shown healthy and refused as sick.
    """
    c = _columns_of(g)
    return f"({c}healthy AND cardinality({c}sticky_reasons) = 0)"


def gpu_health_reasons(g: str = "g") -> str:
    """SQL: the reasons gpu_healthy is false: the agent's and the sticky ones, sorted."""
    return (
        f"CASE WHEN cardinality({g}.sticky_reasons) = 0 THEN {g}.health_reasons"
        f" ELSE ARRAY(SELECT DISTINCT r FROM unnest({g}.health_reasons || {g}.sticky_reasons) r"
        " ORDER BY r) END"
    )


def gpu_usable(g: str = "g") -> str:
    """SQL: the GPU row `g` may be given new work, whether or not it is held now.

    Healthy (gpu_healthy), and not cordoned by an operator (service/fleet/gpu_cordons.py).
    `g` names a row with the gpus table's columns (the table itself, or a
    report's rows shaped like it: USABLE_COLUMNS). Also the predicate of the
    partial index ix_gpus_usable (tables.py, with `g` empty), which a
    statement testing gpu_free or gpu_free_given in its WHERE can read.
    """
    return f"({gpu_healthy(g)} AND {_columns_of(g)}cordon_reason IS NULL)"


# The gpus columns gpu_usable reads: a row source standing in for the table
# (a report's GPUs in nodes._REPLACE_REPORT) must carry them.
USABLE_COLUMNS = ("healthy", "sticky_reasons", "cordon_reason")
# And the columns pool_counts reads besides them.
POOL_COLUMNS = (*USABLE_COLUMNS, "nvlink_group", "nvlink_peers")


def is_usable(healthy: bool, cordon_reason: str | None) -> bool:
    """gpu_usable for a GPU already read, `healthy` being gpu_healthy's value."""
    return healthy and cordon_reason is None


def gpu_held(g: str = "g") -> str:
    """SQL: the GPU row `g` is held by a shard (a primary-key probe of allocated_gpus)."""
    return (
        "EXISTS (SELECT 1 FROM allocated_gpus a"
        f" WHERE a.node_id = {g}.node_id AND a.gpu_index = {g}.idx)"
    )


def gpu_free(g: str = "g") -> str:
    """SQL: the GPU row `g` (of `gpus`) can be allocated now, its node's state aside."""
    return gpu_free_given(g, gpu_held(g))


def gpu_free_given(g: str, held: str) -> str:
    """SQL: gpu_free for a row `g` whose holder the caller has joined already.

    `held` is the expression, true when the row's GPU is held (for a LEFT JOIN
    of allocated_gpus `a`: "a.gpu_index IS NOT NULL"). Why a second form: over
    one node's GPUs, a join of its allocations reads them with one index
    descent (a merge join on the GPU index), where gpu_free's probe looks each
    GPU up on its own; pool_counts counts a node's GPUs so.
    """
    return f"({gpu_usable(g)} AND NOT ({held}))"


class GpuFacts(Protocol):
    """What is_free reads of a GPU already loaded (service.fleet.hardware.GpuRecord).

    `healthy` is gpu_healthy's value (hardware.py reads it so).
    """

    @property
    def healthy(self) -> bool: ...

    @property
    def cordon_reason(self) -> str | None: ...

    @property
    def held_by(self) -> str | None: ...


def is_free(gpu: GpuFacts) -> bool:
    """gpu_free for a GPU already loaded with its holder."""
    return is_usable(gpu.healthy, gpu.cordon_reason) and gpu.held_by is None


def pool_counts(g: str, held: str) -> str:
    """SQL select list: a group of GPU rows `g` counted as gpu_pools keeps them.

    `held` is the expression, true when the row's GPU is held (the caller
    joins allocated_gpus as it needs). The counts partition the GPUs:
    total = free + allocated + unhealthy, where a held GPU counts as
    allocated even if it has since become unusable (its holder must be told,
    but it is not spare capacity either way).

    free_indices lists the free GPUs' indices, ascending: its length is
    `free` (a check constraint of gpu_pools holds it so), and a page of
    freeGpus reads it from the pool row instead of the GPUs and their
    allocations (service/scheduling/capacity.py). free_groups is the NVLink
    group of each of them, in the same order (NULL: none), and nvlink_known
    whether any GPU of the group of rows reported NVLink peers: fit with
    nvlinkShards reads a node's free NVLink groups from them
    (topology_fit.facts_column), not from its GPUs. The rows `g` carry
    POOL_COLUMNS.
    """
    usable = gpu_usable(g)
    free = gpu_free_given(g, held)
    return (
        "count(*) AS total, "
        f"count(*) FILTER (WHERE NOT {usable} AND NOT ({held})) AS unhealthy, "
        f"count(*) FILTER (WHERE {held}) AS allocated, "
        f"count(*) FILTER (WHERE {free}) AS free, "
        f"coalesce(array_agg({g}.idx ORDER BY {g}.idx) FILTER (WHERE {free}),"
        " CAST('{}' AS integer[])) AS free_indices, "
        f"coalesce(array_agg({g}.nvlink_group ORDER BY {g}.idx) FILTER (WHERE {free}),"
        " CAST('{}' AS integer[])) AS free_groups, "
        f"coalesce(bool_or({g}.nvlink_peers IS NOT NULL), false) AS nvlink_known"
    )


def pool_offers(p: str = "p") -> str:
    """SQL: the gpu_pools row `p` offers free GPUs to schedulers.

    Also the predicate of the partial indexes ix_gpu_pools_free and
    ix_gpu_pools_fit (tables.py, with `p` empty), so a query written with it
    can use them.
    """
    column = f"{p}." if p else ""
    return f"{column}schedulable AND {column}free > 0"
