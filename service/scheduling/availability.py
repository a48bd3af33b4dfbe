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
from service.scheduling.taints import first_taint, sending_last, taints_on, withholding

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
# (a report's GPUs in node_writes._REPLACE_REPORT) must carry them.
USABLE_COLUMNS = ("healthy", "sticky_reasons", "cordon_reason")
# And the columns pool_counts reads besides them: the NVLink groups and
# domain, and the taint marks (gpu_withheld, gpu_last_resort).
POOL_COLUMNS = (
    *USABLE_COLUMNS, "nvlink_group", "nvlink_peers", "nvlink_domain", "withheld", "last_resort",
    "reservation",
)  # fmt: skip


def shared_nvlink_domain(g: str) -> str:
    """SQL aggregate over a group of GPU rows `g`: the NVLink domain they all report, else NULL.

    A node's domain for a class (topology_fit.node_domain), and its pool's
    (pool_counts): one GPU that reports none, or another domain, and the node
    is in none.
    """
    return (
        f"CASE WHEN count(*) = count({g}.nvlink_domain)"
        f" AND count(DISTINCT {g}.nvlink_domain) = 1 THEN min({g}.nvlink_domain) END"
    )


def is_usable(healthy: bool, cordon_reason: str | None) -> bool:
    """gpu_usable for a GPU already read, `healthy` being gpu_healthy's value."""
    return healthy and cordon_reason is None


def gpu_withheld(g: str = "g") -> str:
    """SQL: a NO_SCHEDULE or NO_EXECUTE taint lies on the GPU row `g` or on its node.

    gpus.withheld, kept by every write of the taints table and of a node's
    GPUs (service/scheduling/gpu_pools.py: refresh_taint_marks, taint_marks),
    so that the question every untolerating request asks of every GPU it
    reads is a column of the row, not a probe of another table.
    """
    return f"{_columns_of(g)}withheld"


def taint_marks(node: str, index: str) -> str:
    """SQL select list: gpus.withheld and gpus.last_resort of GPU `index` of node `node`, from the taints table."""
    taints = taints_on(node, index)
    return (
        f"EXISTS (SELECT 1 {taints} AND {withholding('t')}) AS withheld, "
        f"EXISTS (SELECT 1 {taints} AND {sending_last('t')}) AS last_resort"
    )


def gpu_tolerated(g: str = "g") -> str:
    """SQL: every withholding taint on the GPU row `g` and its node is tolerated.

    The request's tolerations are the :tolerations parameter
    (taints.tolerations_json). The taints table is read only for a withheld
    GPU: the others need no look at it.
    """
    return (
        f"(CASE WHEN NOT {g}.withheld THEN true ELSE NOT EXISTS"
        f" (SELECT 1 {taints_on(f'{g}.node_id', f'{g}.idx')} AND {withholding('t', True)}) END)"
    )


def gpu_last_resort(g: str = "g", tolerating: bool = False) -> str:
    """SQL: the GPU row `g` is used last: a PREFER_NO_SCHEDULE taint the request does not tolerate."""
    c = _columns_of(g)
    if not tolerating:
        return f"{c}last_resort"
    return (
        f"(CASE WHEN NOT {c}last_resort THEN false ELSE EXISTS"
        f" (SELECT 1 {taints_on(f'{g}.node_id', f'{g}.idx')} AND {sending_last('t', True)}) END)"
    )


def gpu_held(g: str = "g") -> str:
    """SQL: the GPU row `g` is held by a shard (a primary-key probe of allocated_gpus)."""
    return (
        "EXISTS (SELECT 1 FROM allocated_gpus a"
        f" WHERE a.node_id = {g}.node_id AND a.gpu_index = {g}.idx)"
    )


def gpu_held_by(g: str, holder: str) -> str:
    """SQL: the GPU row `g` is held by a shard for which `holder` is true.

    `holder` is SQL over the held row `a` (of allocated_gpus: its tenant) and
    its shard `s` (its `until`, the reservation it was placed into): who
    holds a GPU, asked of reservations (placed into one, due to be gone by
    an instant, held by a tenant).
    """
    return (
        "EXISTS (SELECT 1 FROM allocated_gpus a JOIN shards s ON s.shard_id = a.shard_id"
        f" WHERE a.node_id = {g}.node_id AND a.gpu_index = {g}.idx AND {holder})"
    )


def gpu_free(g: str = "g") -> str:
    """SQL: the GPU row `g` (of `gpus`) can be allocated now, its node's state aside.

    Free is what a request without tolerations is offered: usable, not
    held, and not withheld by a taint (gpu_withheld). gpu_offered is the
    same question for a request that tolerates some taints.
    """
    return gpu_free_given(g, gpu_held(g))


def gpu_offered(g: str = "g", tolerating: bool = False, admitting: str = "") -> str:
    """SQL: the GPU row `g` may be given to the request, its node's state aside.

    Without tolerations, gpu_free. With them (the :tolerations parameter),
    a withheld GPU is offered when the request tolerates every withholding
    taint on it and on its node. `admitting` (PlaceRequest.admitting): the
    reserved GPUs the request may use besides (gpu_admitted).
    """
    if not tolerating and not admitting:
        return gpu_free(g)
    if admitting == ADMITS_AT:
        return gpu_offered_at(g, tolerating)
    taint = gpu_tolerated(g) if tolerating else f"NOT {gpu_withheld(g)}"
    return f"({gpu_usable(g)} AND NOT ({gpu_held(g)}) AND {taint} AND {gpu_admitted(g, admitting)})"


# The kinds of request a reservation admits (PlaceRequest.admitting):
# UNTIL, a replica that promises to be gone by :until, may use GPUs set
# aside for a window that starts at or after it; INTO, a replica placed into
# the reservation :reservation, uses only its GPUs. Any other request uses
# none (gpu_free).
ADMITS_NONE = ""
ADMITS_UNTIL = "until"
ADMITS_INTO = "into"
# For a statement that reads both parameters (allocate's checks): INTO when
# :reservation is given, else UNTIL (with :until NULL, no GPU set aside).
ADMITS_ASKED = "asked"


# A request asked of a later instant :at (fit, fitGroup and freeGpus with
# `at`): gpu_offered_at.
ADMITS_AT = "at"


def gpu_offered_at(g: str = "g", tolerating: bool = False) -> str:
    """SQL: the GPU row `g` will be offered to an ordinary request at the instant :at.

    As it is now (usable; a taint the request does not tolerate withholds
    it), except that a GPU held by a replica whose `until` is at or before
    :at is counted gone (it promised), and a GPU set aside by a reservation
    that ends at or before :at is free again. What is not known now (a
    reserve or a taint to come) is not guessed.
    """
    c = _columns_of(g)
    taint = gpu_tolerated(g) if tolerating else f"NOT {gpu_withheld(g)}"
    return (
        f"({gpu_usable(g)} AND {taint}"
        f" AND NOT {gpu_held_by(g, '(s.until IS NULL OR s.until > CAST(:at AS timestamptz))')}"
        f" AND ({c}reservation IS NULL OR EXISTS (SELECT 1 FROM reservations r"
        f" WHERE r.id = {c}reservation AND r.ends_at <= CAST(:at AS timestamptz))))"
    )


def gpu_admitted(g: str, admitting: str = ADMITS_NONE) -> str:
    """SQL: the GPU row `g`'s reservation (gpus.reservation) lets the request use it.

    The one definition of who may use a GPU set aside (issue 47): no one but
    the owner placing into it (:reservation), and a replica whose :until is
    at or before the reservation's start (it is told to stop at the start:
    service/scheduling/reservations/) while it has not started: a claim that
    waited for the nodes' locks behind the start sees it started, and takes
    nothing the start just freed for the window.
    """
    c = _columns_of(g)
    if admitting == ADMITS_INTO:
        return f"({c}reservation = CAST(:reservation AS text))"
    if admitting == ADMITS_ASKED:
        return (
            f"(CASE WHEN CAST(:reservation AS text) IS NOT NULL"
            f" THEN {gpu_admitted(g, ADMITS_INTO)} ELSE {gpu_admitted(g, ADMITS_UNTIL)} END)"
        )
    if admitting == ADMITS_UNTIL:
        return (
            f"({c}reservation IS NULL OR EXISTS (SELECT 1 FROM reservations r"
            f" WHERE r.id = {c}reservation AND r.started_at IS NULL"
            " AND r.starts_at >= CAST(:until AS timestamptz)))"
        )
    return f"({c}reservation IS NULL)"


def gpu_free_given(g: str, held: str) -> str:
    """SQL: gpu_free for a row `g` whose holder the caller has joined already.

    `held` is the expression, true when the row's GPU is held (for a LEFT JOIN
    of allocated_gpus `a`: "a.gpu_index IS NOT NULL"). Why a second form: over
    one node's GPUs, a join of its allocations reads them with one index
    descent (a merge join on the GPU index), where gpu_free's probe looks each
    GPU up on its own; pool_counts counts a node's GPUs so.
    """
    return f"({gpu_usable(g)} AND NOT {gpu_withheld(g)} AND NOT ({held}) AND {gpu_admitted(g)})"


class GpuFacts(Protocol):
    """What is_free reads of a GPU already loaded (service.fleet.node_details.GpuRecord).

    `healthy` is gpu_healthy's value (node_details.py reads it so).
    """

    @property
    def healthy(self) -> bool: ...

    @property
    def cordon_reason(self) -> str | None: ...

    @property
    def held_by(self) -> str | None: ...

    @property
    def withheld(self) -> bool: ...

    @property
    def reservation(self) -> str | None: ...


def is_free(gpu: GpuFacts) -> bool:
    """gpu_free for a GPU already loaded with its holder."""
    return (
        is_usable(gpu.healthy, gpu.cordon_reason)
        and not gpu.withheld
        and gpu.held_by is None
        and gpu.reservation is None
    )


def pool_counts(g: str, held: str) -> str:
    """SQL select list: a group of GPU rows `g` counted as gpu_pools keeps them.

    `held` is the expression, true when the row's GPU is held (the caller
    joins allocated_gpus as it needs). The counts partition the GPUs:
    total = free + allocated + unhealthy + withheld, where a held GPU counts
    as allocated even if it has since become unusable or tainted (its holder
    must be told, but it is not spare capacity either way), and withheld
    counts the usable, unheld GPUs a NO_SCHEDULE or NO_EXECUTE taint keeps
    from requests that do not tolerate it (gpu_withheld).

    free_indices lists the free GPUs' indices, ascending: its length is
    `free` (a check constraint of gpu_pools holds it so), and a page of
    freeGpus reads it from the pool row instead of the GPUs and their
    allocations (service/scheduling/capacity.py). free_groups is the NVLink
    group of each of them, in the same order (NULL: none), and nvlink_known
    whether any GPU of the group of rows reported NVLink peers: fit with
    nvlinkShards reads a node's free NVLink groups from them
    (topology_fit.facts_column), not from its GPUs. nvlink_domain is the
    domain they all report (shared_nvlink_domain), '' for none: where
    placement groups find a node's domain without reading its GPUs. withheld_indices lists
    the withheld GPUs, which a request with tolerations may still be offered
    (PoolOffer), so such a request reads them from the same row. And
    last_resort_indices, the free GPUs under a PREFER_NO_SCHEDULE taint, a
    subset of free_indices: placement ranks a node that needs them last.
    reserved and reserved_indices: the usable, unheld GPUs no taint
    withholds that a live reservation sets aside (gpu_admitted), offered only
    to the requests it admits; a fifth bucket of the partition
    (total = free + allocated + unhealthy + withheld + reserved).
    The rows `g` carry POOL_COLUMNS.
    """
    usable = gpu_usable(g)
    free = gpu_free_given(g, held)
    withheld = f"{usable} AND {gpu_withheld(g)} AND NOT ({held})"
    last = f"{free} AND {gpu_last_resort(g)}"
    reserved = f"{usable} AND NOT {gpu_withheld(g)} AND NOT ({held}) AND NOT {gpu_admitted(g)}"

    def indices(where: str) -> str:
        return f"coalesce(array_agg({g}.idx ORDER BY {g}.idx) FILTER (WHERE {where}), CAST('{{}}' AS integer[]))"

    return (
        "count(*) AS total, "
        f"count(*) FILTER (WHERE NOT {usable} AND NOT ({held})) AS unhealthy, "
        f"count(*) FILTER (WHERE {held}) AS allocated, "
        f"count(*) FILTER (WHERE {free}) AS free, "
        f"{indices(free)} AS free_indices, "
        f"coalesce(array_agg({g}.nvlink_group ORDER BY {g}.idx) FILTER (WHERE {free}),"
        " CAST('{}' AS integer[])) AS free_groups, "
        f"coalesce(bool_or({g}.nvlink_peers IS NOT NULL), false) AS nvlink_known, "
        f"coalesce({shared_nvlink_domain(g)}, '') AS nvlink_domain, "
        f"count(*) FILTER (WHERE {withheld}) AS withheld, "
        f"{indices(withheld)} AS withheld_indices, "
        f"count(*) FILTER (WHERE {last}) AS last_resort, "
        f"{indices(last)} AS last_resort_indices, "
        f"count(*) FILTER (WHERE {reserved}) AS reserved, "
        f"{indices(reserved)} AS reserved_indices"
    )


# The columns pool_counts gives, in its order: what an INSERT of gpu_pools
# lists after node_id and gpu_class (gpu_pools.POOL_UPSERT writes them all).
POOL_COUNTS = (
    "total", "unhealthy", "allocated", "free", "free_indices", "free_groups", "nvlink_known",
    "nvlink_domain", "withheld", "withheld_indices", "last_resort", "last_resort_indices",
    "reserved", "reserved_indices",
)  # fmt: skip


def pool_offers(p: str = "p") -> str:
    """SQL: the gpu_pools row `p` offers free GPUs to schedulers.

    Also the predicate of the partial indexes ix_gpu_pools_free and
    ix_gpu_pools_fit (tables.py, with `p` empty), so a query written with it
    can use them.
    """
    column = f"{p}." if p else ""
    return f"{column}schedulable AND {column}free > 0"


def pool_withholds(p: str = "p") -> str:
    """SQL: the gpu_pools row `p` is on a schedulable node and has GPUs a taint withholds.

    The pools a request with tolerations reads besides those pool_offers
    selects (capacity.free_gpus, placement's windows): only there can a
    toleration add GPUs. Also the predicate of ix_gpu_pools_withheld and
    ix_gpu_pools_withheld_class (tables.py).
    """
    column = f"{p}." if p else ""
    return f"{column}schedulable AND {column}withheld > 0"


def pool_reserves(p: str = "p") -> str:
    """SQL: the gpu_pools row `p` is on a schedulable node and has GPUs set aside.

    The pools a request a reservation admits reads besides those pool_offers
    selects. Also the predicate of ix_gpu_pools_reserved (tables.py).
    """
    column = f"{p}." if p else ""
    return f"{column}schedulable AND {column}reserved > 0"


def pool_tolerated_indices(p: str = "p") -> str:
    """SQL int[]: the pool row `p`'s withheld GPUs whose withholding taints :tolerations all tolerate."""
    return (
        f"(CASE WHEN {p}.withheld = 0 THEN CAST('{{}}' AS integer[]) ELSE ARRAY("
        f"SELECT i FROM unnest({p}.withheld_indices) i WHERE NOT EXISTS"
        f" (SELECT 1 {taints_on(f'{p}.node_id', 'i')} AND {withholding('t', True)})"
        " ORDER BY i) END)"
    )


def pool_last_resort(p: str, tolerated: str, tolerating: bool = False) -> str:
    """SQL integer: how many GPUs the pool row `p` offers the request are used last.

    Without tolerations, the pool's own count. With them, `tolerated` being
    the withheld GPUs the request is offered besides the free ones
    (pool_tolerated_indices): of the pool's last-resort GPUs and of those,
    the ones under a PREFER_NO_SCHEDULE taint (on the GPU or its node) that
    the request does not tolerate. A probe of the taints table per such GPU,
    and none for a pool with neither.
    """
    if not tolerating:
        return f"{p}.last_resort"

    def untolerated(indices: str) -> str:
        return (
            f"(SELECT count(*) FROM unnest({indices}) i WHERE EXISTS"
            f" (SELECT 1 {taints_on(f'{p}.node_id', 'i')} AND {sending_last('t', True)}))"
        )

    return (
        f"((CASE WHEN {p}.last_resort = 0 THEN 0 ELSE {untolerated(f'{p}.last_resort_indices')} END)"
        f" + (CASE WHEN cardinality({tolerated}) = 0 THEN 0 ELSE {untolerated(tolerated)} END))"
    )


def pool_withholding_taint(p: str, tolerating: bool = False) -> str:
    """SQL json: the first taint that withholds a GPU of the pool row `p` from the request, or NULL.

    What the verdict TAINTED names (taints.first_taint). Read only for a
    pool with withheld GPUs.
    """
    taint = first_taint(f"{p}.node_id", f"ANY({p}.withheld_indices)", withholding("t", tolerating))
    return f"(CASE WHEN {p}.withheld = 0 THEN NULL ELSE {taint} END)"


class PoolOffer:
    """What a gpu_pools row `p` offers one request, as SQL expressions over `p` (and `join`'s alias).

    Without tolerations, the row's own columns, which a statement reads from
    an index. With them (:tolerations), the free GPUs plus the withheld ones
    every withholding taint of which the request tolerates
    (pool_tolerated_indices, read once per row through `join`, a LATERAL
    the caller puts after the pool in its FROM). Every reader of a pool for
    a request (placement's windows and survey, fit, freeGpus) takes these,
    so none can count a GPU another would refuse.

    - indices: the GPUs offered, ascending (what freeGpus lists);
    - free: how many;
    - withheld: the usable, unheld GPUs a taint still keeps from the request;
    - last_resort: of the offered, those a PREFER_NO_SCHEDULE taint the
      request does not tolerate sends last;
    - taint: the first taint that withholds a GPU (pool_withholding_taint), JSON;
    - reserved: the GPUs set aside that the request may not use (gpu_admitted).
    """

    def __init__(self, p: str, tolerating: bool, admitting: str = ADMITS_NONE) -> None:
        self.tolerating = tolerating
        if admitting == ADMITS_AT and not tolerating:
            # At a later instant only the pools with GPUs set aside, or with a
            # replica due to be gone by then, offer other than they do now:
            # the others are read from the row as now, the rest counted GPU by
            # GPU (gpu_offered_at), each expression only for such a pool.
            changed = (
                f"({p}.reserved > 0 OR {p}.node_id IN (SELECT s.node_id FROM shards s"
                " WHERE s.until <= CAST(:at AS timestamptz)))"
            )

            def counted(expression: str, now: str) -> str:
                return (
                    f"(CASE WHEN {changed} THEN (SELECT {expression} FROM gpus g"
                    f" WHERE g.node_id = {p}.node_id AND g.gpu_class = {p}.gpu_class"
                    f" AND {gpu_offered_at('g')}) ELSE {now} END)"
                )

            self.join = ""
            self.indices = counted(
                "coalesce(array_agg(g.idx ORDER BY g.idx), CAST('{}' AS integer[]))",
                f"{p}.free_indices",
            )
            self.free = counted("CAST(count(*) AS integer)", f"{p}.free")
            self.withheld = f"{p}.withheld"
            self.last_resort = counted(
                f"CAST(count(*) FILTER (WHERE {gpu_last_resort('g')}) AS integer)",
                f"{p}.last_resort",
            )
            self.reserved = counted(
                f"{p}.reserved - CAST(count(*) FILTER (WHERE g.reservation IS NOT NULL) AS integer)",
                f"{p}.reserved",
            )
        elif admitting:
            # A request a reservation admits: its GPUs counted one by one
            # (gpu_offered), a look at the pool's GPUs per pool read. Such
            # requests are few (a place with `until`, or into a reservation).
            offered = PoolOffer._admitted(p, tolerating, admitting)
            self.join = f" CROSS JOIN LATERAL ({offered}) {p}_admitted"
            self.indices = f"{p}_admitted.indices"
            self.free = f"{p}_admitted.free"
            self.withheld = f"({p}.withheld - {p}_admitted.withheld)"
            self.last_resort = f"{p}_admitted.last_resort"
            self.reserved = f"({p}.reserved - {p}_admitted.reserved)"
        elif not tolerating:
            self.join = ""
            self.indices = f"{p}.free_indices"
            self.free = f"{p}.free"
            self.withheld = f"{p}.withheld"
            self.last_resort = f"{p}.last_resort"
        else:
            # One LATERAL per pool row: the tolerated indices, then the
            # last-resort count over them, each computed once.
            tolerated = f"{p}_tolerated"
            self.join = (
                f" CROSS JOIN LATERAL (SELECT x.indices,"
                f" {pool_last_resort(p, 'x.indices', True)} AS last_resort"
                f" FROM (SELECT {pool_tolerated_indices(p)} AS indices OFFSET 0) x OFFSET 0)"
                f" {tolerated}"
            )
            self.indices = (
                f"ARRAY(SELECT i FROM unnest({p}.free_indices || {tolerated}.indices) i ORDER BY i)"
            )
            self.free = f"({p}.free + cardinality({tolerated}.indices))"
            self.withheld = f"({p}.withheld - cardinality({tolerated}.indices))"
            self.last_resort = f"{tolerated}.last_resort"
        if not admitting:
            self.reserved = f"{p}.reserved"
        self.taint = pool_withholding_taint(p, tolerating)

    @staticmethod
    def _admitted(p: str, tolerating: bool, admitting: str) -> str:
        """SQL: one row of the GPUs of the pool `p` offered to an admitted request."""
        return (
            "SELECT CAST(count(*) AS integer) AS free,"
            " coalesce(array_agg(g.idx ORDER BY g.idx), CAST('{}' AS integer[])) AS indices,"
            f" CAST(count(*) FILTER (WHERE {gpu_withheld('g')}) AS integer) AS withheld,"
            f" CAST(count(*) FILTER (WHERE {gpu_last_resort('g', tolerating)}) AS integer)"
            " AS last_resort,"
            " CAST(count(*) FILTER (WHERE g.reservation IS NOT NULL) AS integer) AS reserved"
            f" FROM gpus g WHERE g.node_id = {p}.node_id AND g.gpu_class = {p}.gpu_class"
            f" AND {gpu_offered('g', tolerating, admitting)}"
        )
