"""/metrics in the Prometheus text format: the cluster as the database sees it, and this process.

Cluster gauges are read at scrape time, one statement per group of metric
families whatever the cluster size. Process-local counters (allocation
rejections, request latencies) live here; every process exports its own and
Prometheus sums them.

A node whose local disk is unknown has NO disk series, never a zero: a zero
would fire "disk full" alerts for every node whose agent is too old to report
storage.
"""

from __future__ import annotations

import gc
import math
import threading
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Sequence

from sqlalchemy import text

from service import backup_status
from service.database import connections, read_routing, request_state, transactions
from service.database.connections import Connection
from service.node_states import STATES
from service.scheduling import place_batches, pool_census
from service.scheduling.capacity import gpu_classes
from service.scheduling.placement import preemption
from service.scheduling.reservations import records, replacing
from service.scheduling.tenancy import tenants, victims

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

KNOWN_METHODS = frozenset({"GET", "POST", "HEAD", "OPTIONS"})
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rejections: dict[str, int] = defaultdict(int)
        # The fast path's route runs: (route, outcome, reason) -> count
        # (service/graphql/fast/front_door.py).
        self.fast_path: dict[tuple[str, str, str], int] = defaultdict(int)
        # (method, route, status) -> per-bucket counts, sum
        self.latency: dict[tuple[str, str, int], list[float]] = {}
        # Websockets whose token ended, by how ("revoked", "expired"), and the
        # re-checks that could not ask the database (service/access_control/token_watch.py).
        self.token_ends: dict[str, int] = defaultdict(int)
        self.token_check_failures = 0

    def count_rejection(self, code: str) -> None:
        with self._lock:
            self.rejections[code] += 1

    def count_fast_path(self, route: str, outcome: str, reason: str) -> None:
        with self._lock:
            self.fast_path[route, outcome, reason] += 1

    def count_token_end(self, status: str) -> None:
        with self._lock:
            self.token_ends[status] += 1

    def count_token_check_failure(self) -> None:
        with self._lock:
            self.token_check_failures += 1

    def token_watch(self) -> tuple[dict[str, int], int]:
        with self._lock:
            return dict(self.token_ends), self.token_check_failures

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        # Labels come from the request: fold the unexpected so that a scanner
        # cannot mint a new series per made-up method.
        if method not in KNOWN_METHODS:
            method = "other"
        key = (method, route, status)
        # The one bucket it falls in (the last: over every bound); the
        # snapshot sums them up as Prometheus counts them (cumulative).
        bucket = bisect_left(LATENCY_BUCKETS, seconds)
        with self._lock:
            series = self.latency.get(key)
            if series is None:
                # per-bucket counts (+Inf last), then the sum
                series = self.latency[key] = [0.0] * (len(LATENCY_BUCKETS) + 2)
            series[bucket] += 1
            series[-1] += seconds

    def snapshot(
        self,
    ) -> tuple[
        dict[str, int], dict[tuple[str, str, str], list[float]], dict[tuple[str, str, str], int]
    ]:
        with self._lock:
            latency = {
                (method, route, str(status)): _cumulative(series)
                for (method, route, status), series in self.latency.items()
            }
            return dict(self.rejections), latency, dict(self.fast_path)

    def reset(self) -> None:
        with self._lock:
            self.rejections.clear()
            self.latency.clear()
            self.fast_path.clear()
            self.token_ends.clear()
            self.token_check_failures = 0


COUNTERS = _Counters()


def count_rejection(code: str) -> None:
    """Count one refused allocation by its RejectionCode (e.g. GPU_TAKEN); process-local."""
    COUNTERS.count_rejection(code)


def _cumulative(series: list[float]) -> list[float]:
    """Per-bucket counts and their sum as the exposition reads them: cumulative counts, sum, count."""
    out = []
    running = 0.0
    for count in series[: len(LATENCY_BUCKETS)]:
        running += count
        out.append(running)
    total = running + series[len(LATENCY_BUCKETS)]
    return [*out, series[-1], total]


def count_fast_path(route: str, outcome: str, reason: str) -> None:
    """Count one run of a fast-path route, after it ran: outcome "answered" or "declined".

    Labels are fixed words of the routes, never values of the request.
    """
    COUNTERS.count_fast_path(route, outcome, reason)


# XIDs reported to this process, by GPU class and XID (service/fleet/gpu_health.py),
# counted once the report's transaction committed (a retried transaction
# counts once). Apart from _Counters: one idea, one lock.
_XIDS: dict[tuple[str, str], int] = defaultdict(int)
_XIDS_LOCK = threading.Lock()


def count_xids(xids: Iterable[tuple[str, int]]) -> None:
    """Count committed XIDs, each a (GPU class, XID) pair; process-local."""
    with _XIDS_LOCK:
        for gpu_class, xid in xids:
            _XIDS[(gpu_class, str(xid))] += 1


# Reports stored by this process, by path ("one_statement" or "transaction",
# service/fleet/re_registration.py) and reason (the one statement's verdict, or why
# the report took the transaction). Apart from _Counters: one idea, one lock.
_REGISTRATIONS: dict[tuple[str, str], int] = defaultdict(int)
_REGISTRATIONS_LOCK = threading.Lock()


def count_registration(path: str, reason: str) -> None:
    """Count one stored report by how it was stored; process-local."""
    with _REGISTRATIONS_LOCK:
        _REGISTRATIONS[(path, reason)] += 1


def registrations() -> dict[tuple[str, str], int]:
    """(path, reason) -> reports stored so far by this process."""
    with _REGISTRATIONS_LOCK:
        return dict(_REGISTRATIONS)


# Reports whose observedAt times were shifted because the agent's clock was off
# by more than INVENTORY_CLOCK_SKEW (service/fleet/observed_at.py), by node.
# Apart from _Counters: one idea, one lock.
_CLOCK_CORRECTIONS: dict[str, int] = defaultdict(int)
_CLOCK_CORRECTIONS_LOCK = threading.Lock()


def count_clock_correction(node_id: str) -> None:
    """Count one stored report whose times were corrected; process-local."""
    with _CLOCK_CORRECTIONS_LOCK:
        _CLOCK_CORRECTIONS[node_id] += 1


def clock_corrections() -> dict[str, int]:
    """node id -> reports of that node stored with corrected times by this process."""
    with _CLOCK_CORRECTIONS_LOCK:
        return dict(_CLOCK_CORRECTIONS)


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    COUNTERS.observe_request(method, route, status, seconds)


def _by_reason(counts: dict[str, int]) -> list[tuple[Sequence[tuple[str, str]], float]]:
    """A counter's samples labelled by reason, in the reasons' order."""
    return [((("reason", reason),), count) for reason, count in sorted(counts.items())]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class Exposition:
    """Builds the text format: HELP and TYPE once per family, then its samples."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(
        self,
        name: str,
        kind: str,
        help_text: str,
        samples: Iterable[tuple[Sequence[tuple[str, str]], float]],
    ) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self._lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def histogram(
        self,
        name: str,
        help_text: str,
        series: dict[tuple[str, str, str], list[float]],
        label_names: tuple[str, str, str],
    ) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} histogram")
        for key in sorted(series):
            values = series[key]
            base = list(zip(label_names, key, strict=True))
            for bound, count in zip(LATENCY_BUCKETS, values, strict=False):
                self._lines.append(
                    f"{name}_bucket{_labels([*base, ('le', _number(bound))])} {_number(count)}"
                )
            total = values[-1]
            self._lines.append(f"{name}_bucket{_labels([*base, ('le', '+Inf')])} {_number(total)}")
            self._lines.append(f"{name}_sum{_labels(base)} {_number(values[-2])}")
            self._lines.append(f"{name}_count{_labels(base)} {_number(total)}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


_NODES_BY_STATE = text("SELECT state, count(*) AS n FROM nodes GROUP BY state")
# Issue 38: remediations by state and action (the circuit breaker's
# SUPPRESSED among them), and taints by effect and source: small tables.
_REMEDIATIONS = text(
    "SELECT state, action, count(*) AS n FROM remediations GROUP BY state, action ORDER BY 1, 2"
)
_DRIFT = text("SELECT kind, count(*) AS n FROM drift_findings GROUP BY kind ORDER BY 1")
_TAINTS = text(
    "SELECT effect, source, count(*) AS n FROM taints GROUP BY effect, source ORDER BY 1, 2"
)

# One row per node, for the per-node families; heartbeat age by the
# database's clock, the one heartbeats are stamped with.
_PER_NODE = text(
    """
    SELECT id, local_disk_free, local_disk_total,
           extract(epoch FROM now() - last_seen)::float8 AS heartbeat_age
    FROM nodes ORDER BY id
    """
)


async def render(conn: Connection | None) -> str:
    """The exposition; with conn=None (the database is down) only this process's metrics.

    A scrape during an outage still answers, with inventory_database_up 0,
    so the alert says "database down" rather than "inventory gone".
    """
    out = Exposition()
    out.family(
        "inventory_database_up",
        "gauge",
        "1 when this process could read the cluster's state for this scrape.",
        [((), 0 if conn is None else 1)],
    )
    if conn is not None:
        await _cluster(conn, out)
        await _backups(conn, out)
    _process(out)
    return out.text()


async def _cluster(conn: Connection, out: Exposition) -> None:

    by_state = {r.state: int(r.n) for r in await conn.execute(_NODES_BY_STATE)}
    out.family(
        "inventory_nodes",
        "gauge",
        "Nodes by state.",
        [((("state", s),), by_state.get(s, 0)) for s in STATES],
    )

    classes = await gpu_classes(conn)
    samples: list[tuple[Sequence[tuple[str, str]], float]] = []
    for c in classes:
        for status, value in (
            ("free", c.free),
            ("allocated", c.allocated),
            ("unhealthy", c.unhealthy),
            ("unschedulable", c.unschedulable),
            ("tainted", c.tainted),
            ("reserved", c.reserved),
        ):
            samples.append(((("gpu_class", c.gpu_class), ("status", status)), value))
    out.family(
        "inventory_gpus",
        "gauge",
        "GPUs by class and status (free = healthy, not cordoned, unallocated, on a READY node; "
        "unhealthy = unallocated and unhealthy or cordoned; "
        "unschedulable = healthy and unallocated on a node that is not READY; "
        "tainted = usable and unallocated, withheld by a NO_SCHEDULE or NO_EXECUTE taint; "
        "reserved = usable and unallocated, set aside for a reservation).",
        samples,
    )

    out.family(
        "inventory_remediations",
        "gauge",
        "Remediations by state and action (SUPPRESSED: held back by the circuit breaker).",
        [
            ((("state", r.state), ("action", r.action)), int(r.n))
            for r in await conn.execute(_REMEDIATIONS)
        ],
    )
    out.family(
        "inventory_taints",
        "gauge",
        "Taints on GPUs and nodes by effect and source (cordons aside).",
        [
            ((("effect", r.effect), ("source", r.source)), int(r.n))
            for r in await conn.execute(_TAINTS)
        ],
    )
    out.family(
        "inventory_drift_findings",
        "gauge",
        "Nodes' differences from their hardware profile, by kind.",
        [((("kind", r.kind),), int(r.n)) for r in await conn.execute(_DRIFT)],
    )
    await _tenants(conn, out)
    for family in await records.families(conn):  # reservations': GPUs set aside, by state
        out.family(*family)
    out.family(
        "inventory_reservation_retries_total",
        "counter",
        "Tries by this process of a DEGRADED reservation's missing GPUs "
        "(service/scheduling/reservations/replacing.py), by outcome: replaced (none missing "
        "after), missing (some still are), skipped (another process tried it first). A "
        "reservation is tried again when more free GPUs of its class are offered, or "
        f"{replacing.RETRY_AFTER_SECONDS} s after its last try.",
        [((("outcome", o),), n) for o, n in replacing.RETRIES.snapshot().items()],
    )
    nodes = list(await conn.execute(_PER_NODE))
    known_disk = [n for n in nodes if n.local_disk_total is not None]
    out.family(
        "inventory_node_local_disk_free_bytes",
        "gauge",
        "Free bytes on the node's own (non-shared) filesystems; absent when unknown.",
        (((("node", n.id),), n.local_disk_free) for n in known_disk),
    )
    out.family(
        "inventory_node_local_disk_total_bytes",
        "gauge",
        "Total bytes of the node's own (non-shared) filesystems; absent when unknown.",
        (((("node", n.id),), n.local_disk_total) for n in known_disk),
    )
    out.family(
        "inventory_node_heartbeat_age_seconds",
        "gauge",
        "Seconds since the node's last heartbeat, by the database's clock.",
        (((("node", n.id),), max(0.0, float(n.heartbeat_age))) for n in nodes),
    )


async def _backups(conn: Connection, out: Exposition) -> None:
    """Backups and the WAL archive (service/backup_status.py); absent on a standby."""
    status = await backup_status.read(conn)
    if status is not None:
        for name, kind, help_text, samples in backup_status.families(status):
            out.family(name, kind, help_text, samples)


async def _tenants(conn: Connection, out: Exposition) -> None:
    """Per tenant and GPU class: held, borrowed (beyond the guarantee), limit, preempted."""
    usage = [(t.id, u) for t in await tenants.read_tenants(conn) for u in t.usage]
    counted = victims.PREEMPTED.snapshot()
    known = sorted({(t, u.gpu_class) for t, u in usage} | set(counted))
    for name, kind, help_text, values in (
        ("gpus_used", "gauge", "GPUs of the class the tenant holds (service/scheduling/tenancy/).",
         [(t, u.gpu_class, u.used) for t, u in usage]),
        ("gpus_borrowed", "gauge", "GPUs of the class the tenant holds beyond its guarantee.",
         [(t, u.gpu_class, u.borrowed) for t, u in usage]),
        ("gpus_limit", "gauge", "The tenant's limit for the class; absent when it has none.",
         [(t, u.gpu_class, u.limit) for t, u in usage if u.limit is not None]),
        ("replicas_preempted_total", "counter",
         "Replicas of the tenant holding the class that this process's places preempted.",
         [(t, c, counted.get((t, c), 0)) for t, c in known]),
    ):  # fmt: skip
        samples = [((("tenant", t), ("gpu_class", c)), v) for t, c, v in values]
        out.family(f"inventory_tenant_{name}", kind, help_text, samples)
    out.family(
        "inventory_preemption_searches_cut_total",
        "counter",
        "Victim searches of this process that stopped at their bound before finding a set or "
        "proving there was none (service/scheduling/placement/preemption.py: SEARCH_BOUND, "
        "MAX_SETS); their place was answered Unplaceable, saying so.",
        [((), preemption.SEARCH_CUT.count)],
    )
    out.family(
        "inventory_preemption_explain_trials_retried_total",
        "counter",
        "Victim trials of this process's explainPlacement that met a row a claim held, gave up "
        "what they held and were tried again (service/scheduling/placement/preemption.py: "
        "EXPLAIN_LOCK_WAIT); after MAX_ATTEMPTS the explain is answered CONFLICT.",
        [((), preemption.EXPLAIN_RETRIES.count)],
    )


def _process(out: Exposition) -> None:
    rejections, latency, fast_path = COUNTERS.snapshot()
    out.family(
        "inventory_gc_frozen_objects",
        "gauge",
        "Objects `serve` froze once started (service/web/heap.py): the cyclic garbage "
        "collector never walks them. 0: the heap was not settled.",
        [((), gc.get_freeze_count())],
    )
    out.family(
        "inventory_gc_collections_total",
        "counter",
        "Cyclic garbage collections by generation (0 the youngest) in this process.",
        [
            ((("generation", str(generation)),), stats["collections"])
            for generation, stats in enumerate(gc.get_stats())
        ],
    )
    out.family(
        "inventory_fast_path_requests_total",
        "counter",
        "GraphQL HTTP requests by fast-path route (front_door, heartbeat, page, node, graphql_core), "
        "counted after the route ran: answered, or declined with a reason (declined by "
        "front_door: Strawberry's view answered; reason bug: a logged bug, answered as an "
        "internal error). All zero with INVENTORY_FAST_PATH=false.",
        (
            ((("route", route), ("outcome", outcome), ("reason", reason)), count)
            for (route, outcome, reason), count in sorted(fast_path.items())
        ),
    )
    out.family(
        "inventory_allocation_rejections_total",
        "counter",
        "Allocations refused by this process, by rejection code.",
        (((("code", code),), count) for code, count in sorted(rejections.items())),
    )
    out.family(
        "inventory_place_transactions_total",
        "counter",
        "Transactions this process committed for `place` calls sharing them "
        "(service/scheduling/place_batches.py).",
        [((), place_batches.COUNTS.transactions)],
    )
    out.family(
        "inventory_place_batched_total",
        "counter",
        "`place` calls placed in a shared transaction by this process.",
        [((), place_batches.COUNTS.placed)],
    )
    out.family(
        "inventory_place_alone_total",
        "counter",
        "`place` calls this process ran in a transaction of their own instead, by why: waits "
        "(they waited for a lock, spread over nodes or found no room), error (the claim raised "
        "in the batch), abandoned (placed in a batch another claim's error rolled back), commit "
        "(the batch's COMMIT failed).",
        _by_reason(place_batches.COUNTS.alone),
    )
    out.family(
        "inventory_place_claimed_together_total",
        "counter",
        "`place` calls placed by their group's one claim statement in a shared transaction "
        "(service/scheduling/placement.place_several_without_waiting).",
        [((), place_batches.COUNTS.together)],
    )
    out.family(
        "inventory_place_claimed_apart_total",
        "counter",
        "`place` calls of a group claimed by the one-call path instead, in the same "
        "transaction, by why: stored (the replica id holds shards), repeated (the same replica "
        "id earlier in the group), no_room (the nodes the group locked had no room left), "
        "conflict (its shard ids or a GPU were taken meanwhile), charge (placed alone: a quota).",
        _by_reason(place_batches.COUNTS.apart),
    )
    out.family(
        "inventory_db_connections_dropped_total",
        "counter",
        "Pooled connections this process closed instead of reusing, by why: read_only (the "
        "server became a standby: a demoted primary), terminated (the session was ended: "
        "shutdown, pg_terminate_backend, a demotion), starting_up, lost (the connection failed). "
        "Each also closes every connection the pool opened before it.",
        _by_reason(connections.DROPPED.by_reason),
    )
    out.family(
        "inventory_db_write_retries_total",
        "counter",
        "Writes this process ran again, by cause: unavailable (the database away before COMMIT: "
        "nothing was written), commit_unknown (the connection failed during COMMIT; only "
        "idempotent writes), conflict (a deadlock or serialization victim).",
        (((("cause", c),), n) for c, n in sorted(transactions.RETRIES.retried.items())),
    )
    out.family(
        "inventory_db_write_retries_exhausted_total",
        "counter",
        "Writes this process stopped retrying and answered DATABASE_UNAVAILABLE (or CONFLICT), "
        "by cause: the retry budget (INVENTORY_WRITE_RETRY, the request's time limit) ran out, "
        "or COMMIT's outcome was lost for a write that is not idempotent.",
        (((("cause", c),), n) for c, n in sorted(transactions.RETRIES.gave_up.items())),
    )
    out.family(
        "inventory_reads_total",
        "counter",
        "Reads of requests that tolerate staleness (freeGpus, nodes, node, fabrics, gpuClasses, "
        "fit, explainPlacement), with read replicas configured, by where they went: source "
        "replica (reason within_lag), or primary because every replica was further behind "
        "than allowed (lagging), none answered (unavailable), or one failed the read "
        "(fallback).",
        (
            ((("source", source), ("reason", reason)), n)
            for (source, reason), n in sorted(read_routing.READS.by_route.items())
        ),
    )
    replicas = read_routing.replicas()
    out.family(
        "inventory_read_replica_up",
        "gauge",
        "1 while the read replica answers its probe (INVENTORY_READ_DATABASE_URL); 0 while it "
        "does not, and reads go to the primary.",
        (((("replica", r.shown),), 1 if r.up else 0) for r in replicas),
    )
    out.family(
        "inventory_read_replica_lag_seconds",
        "gauge",
        "How far behind the primary the read replica was at its last probe (0: nothing left "
        "to replay); absent while unknown.",
        (((("replica", r.shown),), r.lag) for r in replicas if r.up and r.lag is not None),
    )
    out.family(
        "inventory_writes_past_deadline_total",
        "counter",
        "Writes rolled back instead of committing after their client's deadline "
        "(X-Client-Timeout), by where it was found: before_begin, statement (the bounded "
        "statement_timeout), before_commit (the service's last check), at_commit (the server's "
        "own check, sent with COMMIT).",
        (((("at", w),), n) for w, n in sorted(request_state.DEADLINES.by_where.items())),
    )
    out.family(
        "inventory_pool_census_declined_total",
        "counter",
        "Reads this process could have counted by the pool census but read every pool of the "
        "class instead (service/scheduling/pool_census.py), by why: kinds (more kinds of pool "
        "than the census walks), last_resort (a placement group with nvlinkShards, and a kind "
        "whose pools send GPUs of different NVLink groups last: groups/reads.py).",
        _by_reason(pool_census.DECLINED.snapshot()),
    )
    token_ends, token_check_failures = COUNTERS.token_watch()
    out.family(
        "inventory_websockets_ended_by_token_total",
        "counter",
        "Websockets of this process whose token ended (revoked or expired) after they "
        "connected: their subscriptions were ended.",
        (((("status", status),), count) for status, count in sorted(token_ends.items())),
    )
    out.family(
        "inventory_token_recheck_failures_total",
        "counter",
        "Re-checks of open websockets' tokens that could not ask the database (the sockets "
        "stay open until a check succeeds).",
        [((), token_check_failures)],
    )
    with _XIDS_LOCK:
        xids = sorted(_XIDS.items())
    out.family(
        "inventory_gpu_xids_total",
        "counter",
        "XID errors reported to this process by agents, by GPU class and XID; critical ones "
        "(service/fleet/gpu_health.py) leave the GPU unhealthy until it is reset.",
        (((("gpu_class", cls), ("xid", xid)), count) for (cls, xid), count in xids),
    )
    out.family(
        "inventory_registrations_total",
        "counter",
        "Node reports stored by this process: path one_statement (a known, alive node whose "
        "GPUs did not change; reason changed or unchanged) or transaction (reason: why not "
        "one statement, service/fleet/re_registration.py).",
        (
            ((("path", path), ("reason", reason)), count)
            for (path, reason), count in sorted(registrations().items())
        ),
    )
    out.family(
        "inventory_report_clock_corrections_total",
        "counter",
        "Node reports stored by this process whose observedAt times were shifted: the agent's "
        "clock differed from the service's by more than INVENTORY_CLOCK_SKEW "
        "(Node.observedAtCorrection says by how much).",
        (((("node", node),), count) for node, count in sorted(clock_corrections().items())),
    )
    out.histogram(
        "inventory_http_request_duration_seconds",
        "HTTP request latency in this process, by method, route and status.",
        latency,
        ("method", "route", "status"),
    )
