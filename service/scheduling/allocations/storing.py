"""store_statement(): the one write path that holds GPUs, and running it (store, store_calls).

Every claim also writes its replica id's row in `replicas`, in the same
statement, and is refused when that row holds a live tombstone: the release
of a replica id that held nothing (releases.release_replica) leaves one for
INVENTORY_RELEASE_TOMBSTONE seconds, so a place or allocate of that id
arriving late, after its scheduler gave up on it and released it, holds
nothing. The row is what the two serialize on: a release that finds nothing
writes it too, so it waits for a claim of the id that is committing at that
very moment (and then frees what it stored), or the claim waits for the
release and sees its tombstone. Whatever the order, no GPU stays held for a
replica its scheduler believes gone. Because it is here, every path that holds
GPUs has the check: place (one call or a batch's several), allocate, and
anything built on them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn

from sqlalchemy import TextClause, text
from sqlalchemy.engine import Row

from service.database.connections import Connection
from service.errors import InventoryError, shown
from service.event_log.events import note_recorded
from service.scheduling.allocations.records import Allocated, shard_from_row
from service.scheduling.gpu_pools import move_to_allocated
from service.scheduling.tenancy.charges import ChargeRefused, Refusal
from service.scheduling.tenancy.quota_claims import CHARGE_CTES, charged_calls, refusal_of

# The columns store_statement reads of each CTE a caller writes (Wanted),
# every row keyed by `call` (an integer the caller chooses, one per replica
# being placed; allocate() has one call, 0).
# want_shards: one row per shard; gpu_indices sorted; fabric and hcas as
# allocate's fabric rule gives them; weights, the path the shard pins (or
# NULL); tolerations, taints.stored_tolerations of the request's; tenant,
# priority and deployment, the call's charge (tenancy.charges.Charge: the
# claim is charged to the tenant, tenancy/quota_claims.charged_calls).
WANT_SHARDS = (
    "call", "replica_id", "actor", "shard_id", "node_id", "gpu_indices", "fabric", "hcas",
    "weights", "tolerations", "tenant", "priority", "deployment",
)  # fmt: skip
# want_gpus: one row per GPU held, naming its shard.
WANT_GPUS = ("call", "node_id", "idx", "shard_id")
# go: one row per call; ok, whether the caller's checks, made in SQL, passed
# (nothing of the call is written otherwise). A call without a go row is not answered.
GO = ("call", "ok")
# The names of store_statement's own CTEs, which a caller's may not take.
_STORE_CTES = frozenset(
    {"want_shards", "want_gpus", "go", "marked", "s", "placed", "held", "whole", "kept",
     "pools_moved", "logged", *CHARGE_CTES}
)  # fmt: skip


class WantedMismatch(ValueError):
    """A statement builder gave store_statement a CTE without a column it reads, or a name it takes."""


@dataclass(frozen=True)
class Rows:
    """A CTE's body written by its columns: SELECT <columns> <source>.

    `columns`: each output column's SQL expression by name, in order (an
    expression that is the column itself, `r.idx` for idx, is not renamed).
    `source`: the rest of the SELECT (FROM, WHERE, GROUP BY), empty for one row.
    """

    columns: Mapping[str, str]
    source: str = ""

    @staticmethod
    def of_json(parameter: str, typed: Mapping[str, str]) -> tuple[dict[str, str], str]:
        """(columns, source) of the rows of a JSON array parameter (`:shards`), its fields `typed`.

        The columns are r.<field> by name, for a caller to put among its own;
        the source is the FROM that reads them (jsonb_to_recordset).
        """
        fields = ", ".join(f"{name} {kind}" for name, kind in typed.items())
        columns = {name: f"r.{name}" for name in typed}
        return columns, f"FROM jsonb_to_recordset(CAST({parameter} AS jsonb)) AS r({fields})"

    def sql(self) -> str:
        listed = ", ".join(
            sql if sql == name or sql.endswith(f".{name}") else f"{sql} AS {name}"
            for name, sql in self.columns.items()
        )
        return f"SELECT {listed} {self.source}".rstrip()


@dataclass(frozen=True)
class Wanted:
    """What a claim asks store_statement to hold: the three CTEs it reads, checked when built.

    The contract between the builders of a claim (allocating.py's _STORE and
    _STORE_SEVERAL, topology_fit.claim_wanted) and the statement that writes
    it, in code: a builder that leaves out a column store_statement reads
    fails here, when its statement is built (at import, or the first time a
    shape is asked for; tests/scheduling/test_golden_sql.py builds every
    shape), not as a wrong row in production.

    `shards`, `gpus`, `go`: want_shards (WANT_SHARDS), want_gpus (WANT_GPUS)
    and go (GO); more columns are the builder's own (a claim's want_gpus
    carries each GPU's near HCAs for its want_shards). `steps`: CTEs those
    three read, (name, body) in order; the statement gives them first, then
    want_gpus, want_shards (which may read want_gpus) and go (which may read
    both).
    """

    shards: Rows
    gpus: Rows
    go: Rows
    steps: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        for name, rows, needed in (
            ("want_shards", self.shards, WANT_SHARDS),
            ("want_gpus", self.gpus, WANT_GPUS),
            ("go", self.go, GO),
        ):
            missing = [c for c in needed if c not in rows.columns]
            if missing:
                raise WantedMismatch(
                    f"{name} has no column {', '.join(missing)}: store_statement reads "
                    f"{', '.join(needed)}"
                )
        taken = [name for name, _ in self.steps if name in _STORE_CTES]
        if taken:
            raise WantedMismatch(f"CTE name {', '.join(taken)} is store_statement's own")

    def ctes(self) -> str:
        """The CTEs, as a WITH list."""
        parts = [
            *self.steps,
            ("want_gpus", self.gpus.sql()),
            ("want_shards", self.shards.sql()),
            ("go", self.go.sql()),
        ]
        return ", ".join(f"{name} AS (\n        {body}\n    )" for name, body in parts)


# want_shards columns a builder may add (None: NULL stored): the replica's
# `until` and the reservation it is placed into (issue 47).
OPTIONAL_SHARDS = ("until", "reservation")


def store_statement(wanted: Wanted) -> TextClause:
    """One round trip that holds GPUs for one or more calls: the shards, their GPUs, the pools and the events.

    `wanted`: the calls' shards, GPUs and checks (Wanted, which says what
    each must carry, and checks it).

    Each call that passed its checks is then charged to its tenant in this
    same statement (tenancy/quota_claims.charged_calls: the limit, checked
    under the quota's lock, from every process); one that its charge
    refuses writes nothing and is answered Refused. The statement's
    :quota_wait parameter (store_calls' `wait`) says whether a claim waits
    for another transaction's lock on a quota.

    Each call stands alone: its pools and events are written only when every
    one of its rows went in (`done`), whatever happened to the other calls of
    the statement, and store_calls() takes back what an incomplete call
    wrote. So several schedulers' claims can share one statement (service/
    scheduling/place_batches.py) and each is answered as if it had been made
    by itself.

    Run it only while holding the nodes' row locks, in a statement started
    after they were taken (see gpu_pools.move_to_allocated). A separate
    SAVEPOINT per claim would cost two more round trips, so a shard id or GPU
    that a concurrent commit took is not an error here: both inserts say ON
    CONFLICT DO NOTHING (an insert that meets an uncommitted row still waits
    for it, so the primary key of allocated_gpus stays the final guard).
    Shard ids must differ between the calls of one statement.

    The SQL generated below looks like this, with allocate's CTEs: docs/internals/sql/scheduling.allocations.allocating/_STORE.sql
    (the claim's: its claim_statement files).
    """
    optional = [c for c in OPTIONAL_SHARDS if c in wanted.shards.columns]
    extra_columns = "".join(f", {c}" for c in optional)
    extra_values = "".join(f", w.{c}" for c in optional)
    return text(
        f"""
        WITH {wanted.ctes()}, {charged_calls()}, marked AS (
            -- The replica ids' rows (see the module's docstring), in id order:
            -- a release of the id that left a tombstone, or is leaving one now
            -- (this insert waits for it), is seen here as its latest row
            -- version; an expired tombstone is cleared.
            INSERT INTO replicas AS r (replica_id)
            SELECT DISTINCT w.replica_id FROM want_shards w
            JOIN admitted go ON go.call = w.call AND go.ok
            ORDER BY 1
            ON CONFLICT (replica_id) DO UPDATE SET
                released_at = CASE WHEN r.tombstone_until > now() THEN r.released_at END,
                released_by = CASE WHEN r.tombstone_until > now() THEN r.released_by END,
                tombstone_until = CASE WHEN r.tombstone_until > now() THEN r.tombstone_until END
            RETURNING r.replica_id, r.released_at, r.tombstone_until
        ), s AS (
            INSERT INTO shards (shard_id, replica_id, node_id, gpu_indices, fabric, hcas, weights,
                                tolerations, tenant, priority, deployment, borrowed{extra_columns})
            SELECT w.shard_id, w.replica_id, w.node_id, w.gpu_indices, w.fabric, w.hcas, w.weights,
                   w.tolerations, w.tenant, w.priority, w.deployment, go.borrowed{extra_values}
            FROM want_shards w JOIN admitted go ON go.call = w.call AND go.ok
            JOIN marked m ON m.replica_id = w.replica_id AND m.released_at IS NULL
            ORDER BY w.call, w.shard_id
            ON CONFLICT (shard_id) DO NOTHING
            RETURNING shard_id, replica_id, node_id, gpu_indices, fabric, hcas, created_at, fence,
                      held_since, tenant, priority, deployment, borrowed
        ), placed AS (
            SELECT w.call, w.actor, s.* FROM s JOIN want_shards w ON w.shard_id = s.shard_id
        ), held AS (
            INSERT INTO allocated_gpus (node_id, gpu_index, shard_id, tenant, gpu_class)
            SELECT c.node_id, c.idx, c.shard_id, s.tenant, c.gpu_class
            FROM classed c JOIN s ON s.shard_id = c.shard_id
            ORDER BY c.node_id, c.idx
            ON CONFLICT (node_id, gpu_index) DO NOTHING
            RETURNING node_id, gpu_index, shard_id
        ), whole AS (
            SELECT go.call, go.checked, go.refusal, t.replica_id AS released_id, t.released_at,
                   t.tombstone_until,
                   go.ok
                   AND (SELECT count(*) FROM placed p WHERE p.call = go.call)
                       = (SELECT count(*) FROM want_shards w WHERE w.call = go.call)
                   AND (SELECT count(*) FROM held h JOIN placed p ON p.shard_id = h.shard_id
                        WHERE p.call = go.call)
                       = (SELECT count(*) FROM want_gpus w WHERE w.call = go.call) AS done
            FROM admitted go
            LEFT JOIN LATERAL (
                SELECT m.replica_id, m.released_at, m.tombstone_until
                FROM marked m JOIN want_shards w ON w.replica_id = m.replica_id
                WHERE w.call = go.call AND m.released_at IS NOT NULL
                LIMIT 1
            ) t ON true
        ), kept AS (
            SELECT h.node_id, h.gpu_index
            FROM held h JOIN placed p ON p.shard_id = h.shard_id
            JOIN whole d ON d.call = p.call AND d.done
        ), {move_to_allocated("kept", "true")}, logged AS (
            -- The rows service.event_log.events.record_event writes, one per shard, in shard order.
            INSERT INTO events (kind, node_id, replica_id, shard_id, actor, detail)
            SELECT 'allocated', p.node_id, p.replica_id, p.shard_id, p.actor,
                   jsonb_build_object('gpuIndices', to_jsonb(p.gpu_indices), 'fabric', p.fabric,
                                      'hcas', to_jsonb(p.hcas))
            FROM placed p JOIN whole d ON d.call = p.call AND d.done
            ORDER BY p.call, p.shard_id
            RETURNING id, shard_id
        )
        SELECT d.call, d.checked, d.done, d.refusal, d.released_id, d.released_at,
               d.tombstone_until,
               ARRAY(SELECT l.id FROM logged l JOIN placed q ON q.shard_id = l.shard_id
                     WHERE q.call = d.call ORDER BY l.id) AS event_ids,
               p.shard_id, p.replica_id, p.node_id, p.gpu_indices, p.fabric, p.hcas, p.created_at,
               p.fence, p.held_since, p.tenant, p.priority, p.deployment, p.borrowed,
               -- The replica's generation: its newest fence, this call's (the
               -- sequence makes it larger than any earlier value of the replica;
               -- this statement's own rows are invisible to a read of shards).
               max(p.fence) OVER (PARTITION BY d.call) AS generation
        FROM whole d LEFT JOIN placed p ON p.call = d.call
        ORDER BY d.call, p.shard_id
        """
    )


# What an incomplete claim wrote, taken back: the ids come from the claim's
# own RETURNING, so only this transaction's rows go (their held GPUs with
# them, by the foreign key's cascade).
_UNDO = text("DELETE FROM shards WHERE shard_id = ANY(CAST(:ids AS text[]))")


class ReplicaReleased(InventoryError):
    """A claim of a replica id released while it held nothing, before its tombstone expired."""

    code = "CONFLICT"

    def __init__(self, replica_id: str, released_at: datetime, until: datetime) -> None:
        super().__init__(
            f"replica '{shown(replica_id)}' was released at {_shown_time(released_at)} while it held "
            f"nothing (its scheduler had given up on placing it), so nothing is held for it "
            f"until {_shown_time(until)}: place it under a new replica id"
        )
        self.replica_id = replica_id
        self.released_at = released_at
        self.until = until

    @property
    def extensions(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "replicaId": self.replica_id,
            "releasedAt": _shown_time(self.released_at),
            "tombstoneUntil": _shown_time(self.until),
        }


def _shown_time(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Tombstoned:
    """A claim that wrote nothing: its replica id was released while holding nothing (see above)."""

    replica_id: str
    released_at: datetime
    until: datetime

    def refusal(self) -> ReplicaReleased:
        return ReplicaReleased(self.replica_id, self.released_at, self.until)


@dataclass(frozen=True)
class Refused:
    """A claim that wrote nothing because its charge refused it (tenancy/quota_claims.py).

    raise_it() raises it as ChargeRefused, for the paths that answer it
    themselves (place(), allocate(), placeGroup).
    """

    refusal: Refusal

    def raise_it(self) -> NoReturn:
        raise ChargeRefused(self.refusal)


@dataclass(frozen=True)
class NotStored:
    """A claim that wrote nothing.

    `checked` is False when the statement's own checks failed, True when a
    concurrent commit took one of its shard ids or GPUs first: reading again
    says whose.
    """

    checked: bool


Stored = Allocated | NotStored | Tombstoned | Refused


async def store(
    conn: Connection, statement: TextClause, params: dict[str, Any], *, wait: bool = True
) -> Stored:
    """Run a store_statement() of one call: every shard held, pools and events written, or nothing left."""
    return (await store_calls(conn, statement, params, wait=wait))[0]


async def store_calls(
    conn: Connection, statement: TextClause, params: dict[str, Any], *, wait: bool = True
) -> dict[int, Stored]:
    """Run a store_statement(): per call answered (its go row), Allocated, NotStored, Tombstoned or Refused.

    An incomplete call's rows are taken back (one statement for all such
    calls), so a call either holds every shard, with its pools and events,
    or nothing. `wait` false: a call whose tenant's quota another
    transaction holds locked is not waited for but Refused (QuotaBusy), for
    a transaction that must never wait (place_batches.py).
    """
    by_call: dict[int, list[Row[Any]]] = defaultdict(list)
    for row in await conn.execute(statement, {**params, "quota_wait": wait}):
        by_call[row.call].append(row)
    answers: dict[int, Stored] = {}
    partial: list[str] = []
    for call, mine in by_call.items():
        head = mine[0]
        if head.released_at is not None:
            answers[call] = Tombstoned(head.released_id, head.released_at, head.tombstone_until)
        elif head.refusal is not None:
            answers[call] = Refused(refusal_of(head.refusal))
        elif head.done:
            note_recorded(list(head.event_ids))
            answers[call] = Allocated(tuple(shard_from_row(r) for r in mine))
        else:
            partial += [r.shard_id for r in mine if r.shard_id is not None]
            answers[call] = NotStored(bool(head.checked))
    if partial:
        await conn.execute(_UNDO, {"ids": partial})
    return answers
