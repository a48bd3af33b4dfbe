"""A known node re-sending its report: one statement, no transaction block, when nothing but its own rows moved.

Why: agents re-send their report every few minutes, and between two reports
usually only the disks' free space moved (or nothing did). The transactional
registration (service/fleet/node_writes.register_node) costs BEGIN, the node upsert, a
second statement for the child tables, pools and events, and COMMIT: four
round trips and about twice the raw statement's PostgreSQL CPU. A report
that changes no GPU and finds the node alive changes no pool and no GPU, so
it needs none of what makes that path two statements.

The one statement (_ONE_STATEMENT) locks the node's row, decides, and writes
only when the decision is "unchanged" (the node row's last-seen and digest)
or "changed" (the node row, fabrics, filesystems, weights and a
report_changed event). Any other verdict writes nothing, and the report
takes the transactional path, which handles every case:

| verdict | why one statement cannot |
| --- | --- |
| new_node | a new node's GPUs and pools are written (and counted) for the first time |
| coming_back | the node was unreachable or lost: its pools change, a "back" event |
| rebooted | a new boot id clears sticky GPU health (service/fleet/gpu_health.py) |
| gpus_changed | pools are counted from the GPUs, under the lock (node_writes._REPLACE_REPORT) |
| fabrics_changed | every pool of the node carries its fabrics and their rates (gpu_pools.attached_fabrics), written with the counts |
| profiled | a hardware profile selects the node, or it had drifted: the stored report is compared with the profile (service/fleet/health/drift.py) |
| written_meanwhile | the row changed while this statement waited for its lock (below) |

Reports carrying XIDs never try (reason `xids`), nor those carrying a GPU
reset the agent saw (reason `resets`): their events, remediations, sticky
reasons and pools are gpu_health.after_report's.
Reports carrying the agent's incarnation or running shards never come here
(reason `fencing`): their checks and reconciliation share the report's
transaction (service/fleet/fencing.py).

The same report again, when this process stored that digest last, is
lighter still: one guarded UPDATE of the node row (_SAME_AGAIN), no child
rows sent; when its guard fails it wrote nothing and the one statement
decides as above.

Why the check "written meanwhile" makes one statement safe: READ COMMITTED
takes a statement's snapshot when it starts, before it waits for the row
lock. The lock then returns the newest version of the row, but every other
read of the statement (the stored GPUs compared with the report, the child
rows a report no longer lists) still sees the snapshot. Every registration
updates the node row, so if one committed while this statement waited, the
row it locked is not the row its snapshot holds: the statement compares the
two versions (xmin) and writes nothing. (The transactional path reads after
the lock, in a second statement, and needs no such check.) A heartbeat that
landed meanwhile makes it fall back too: rare, and never wrong.

What the verdicts leave alone is safe to leave: pools count GPUs, their
health, cordons, allocations and the node's state, and none of these moves
(the GPUs are the stored ones, the node stays alive, an operator's cordon is
not in the upsert's SET list). Concurrent allocations and cordons lock the
node's row too, and only write what this statement does not touch.

Every outcome is counted: inventory_registrations_total{path, reason}
(service/metrics.py): path one_statement with reason changed, unchanged or
same_as_last_stored, or path transaction with the reason it was needed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service import metrics
from service.database import connections
from service.database.connections import Connection
from service.database.transactions import (
    RETRYABLE_SQLSTATES,
    in_transaction,
    retried,
    sqlstate,
)
from service.event_log.event_announcements import announce
from service.event_log.events import collecting_recorded, note_recorded
from service.fleet import node_writes
from service.fleet.node_reads import NODE_COLUMNS, node_from_row
from service.fleet.report_rows import (
    REPORTED_ROWS,
    came_back,
    fact_time_parameters,
    gpus_differ,
    hardware_rows,
    node_parameters,
    rebooted,
    upsert_node,
    write_own_rows,
)
from service.fleet.reports import NodeReport, validate_report

log = logging.getLogger(__name__)

ONE_STATEMENT: Final = "one_statement"
TRANSACTION: Final = "transaction"
# The verdicts _ONE_STATEMENT writes; any other is a reason to take the transaction.
WRITTEN = frozenset({"unchanged", "changed"})

_CHANGED = "(SELECT verdict = 'changed' FROM decision)"
_ONE_STATEMENT = text(
    f"""
    WITH seen AS (
        -- The node's row in this statement's snapshot.
        SELECT xmin AS version FROM nodes WHERE id = :id
    ), old AS (
        -- The same row, locked: the newest version, if a writer committed
        -- while this statement waited for the lock.
        SELECT xmin AS version, report_digest, liveness, boot_id
        FROM nodes WHERE id = :id FOR NO KEY UPDATE
    ), {REPORTED_ROWS}, decision AS (
        SELECT CASE
            WHEN old.version IS NULL THEN 'new_node'
            WHEN old.version IS DISTINCT FROM (SELECT version FROM seen)
                THEN 'written_meanwhile'
            WHEN {came_back("old")} THEN 'coming_back'
            WHEN {rebooted("old", "CAST(:boot_id AS text)")} THEN 'rebooted'
            WHEN old.report_digest IS NOT DISTINCT FROM CAST(:digest AS text) THEN 'unchanged'
            WHEN EXISTS (
                SELECT 1
                FROM g_in i FULL JOIN (SELECT * FROM gpus WHERE node_id = :id) g ON g.idx = i.idx
                WHERE g.idx IS NULL OR i.idx IS NULL OR {gpus_differ("g", "i")}
            ) THEN 'gpus_changed'
            WHEN EXISTS (
                SELECT 1
                FROM f_in i
                FULL JOIN (SELECT * FROM fabric_attachments WHERE node_id = :id) f
                    ON f.fabric = i.fabric
                WHERE f.fabric IS NULL OR i.fabric IS NULL OR f.rate_gbps IS DISTINCT FROM i.rate_gbps
            ) THEN 'fabrics_changed'
            WHEN EXISTS (SELECT 1 FROM drift_findings WHERE node_id = :id)
                OR EXISTS (SELECT 1 FROM hardware_profiles p
                           WHERE CAST(:labels AS jsonb) ->> p.selector_key = p.selector_value)
                THEN 'profiled'
            ELSE 'changed'
        END AS verdict
        FROM (SELECT 1) AS one LEFT JOIN old ON true
    ), upserted AS ({upsert_node("decision WHERE verdict IN ('unchanged', 'changed')")}
    ), {write_own_rows(_CHANGED)}, recorded AS (
        INSERT INTO events (kind, node_id, actor)
        SELECT 'report_changed', :id, :actor FROM decision WHERE verdict = 'changed'
        RETURNING id
    )
    SELECT u.*, v.verdict,
           ARRAY(SELECT id FROM recorded UNION ALL SELECT id FROM w_lost ORDER BY 1) AS event_ids
    FROM decision v LEFT JOIN upserted u ON true
    """
)


# The same report again, when this process stored that digest last: one row
# updated, no child rows sent. The guard is the unchanged verdict's, checked
# by the UPDATE on the row's newest version (READ COMMITTED re-checks an
# updated row's WHERE after waiting for its lock), and the statement reads
# nothing else, so no snapshot can be stale. Everything a report writes to
# the node row is in the digest but the boot id and the liveness, which an
# alive node's unchanged report leaves as they are (a new boot id fails the
# guard).
_SAME_AGAIN = text(
    f"""
    UPDATE nodes n SET last_seen = now(), boot_id = coalesce(CAST(:boot_id AS text), n.boot_id),
        gpus_observed_at = CAST(:gpus_observed_at AS timestamptz),
        fabrics_observed_at = CAST(:fabrics_observed_at AS timestamptz),
        storage_observed_at = CAST(:storage_observed_at AS timestamptz),
        observed_at_correction = CAST(:observed_at_correction AS text)
    WHERE n.id = :id AND n.report_digest = CAST(:digest AS text) AND NOT {came_back("n")}
      AND NOT {rebooted("n", "CAST(:boot_id AS text)")}
    RETURNING {NODE_COLUMNS}
    """
)

# The digest this process last stored for each node: only a hint of which
# statement to try first (_SAME_AGAIN's guard decides). Bounded: past this
# many nodes it starts over, and the next reports take the one statement.
_LAST_STORED: dict[str, str] = {}
MAX_REMEMBERED = 200_000


def _remember(node_id: str, digest: str) -> None:
    if len(_LAST_STORED) >= MAX_REMEMBERED:
        _LAST_STORED.clear()
    _LAST_STORED[node_id] = digest


@dataclass(frozen=True)
class NotInOneStatement:
    """The one statement wrote nothing: the report takes the transaction, for this reason."""

    reason: str


@dataclass(frozen=True)
class InOneStatement:
    registration: node_writes.Registration
    # changed, unchanged, or same_as_last_stored (by _SAME_AGAIN).
    reason: str


async def re_register(
    conn: Connection, report: NodeReport, actor: str | None = None
) -> InOneStatement | NotInOneStatement:
    """Store the report of a known, alive node whose GPUs did not change, in one statement.

    `conn` is outside a transaction block (each statement is its own
    transaction). Anything else writes nothing and says why.
    """
    validate_report(report)
    digest = report.digest()
    if _LAST_STORED.get(report.id) == digest:
        params = {
            "id": report.id,
            "digest": digest,
            "boot_id": report.boot_id,
            **fact_time_parameters(report),
        }
        same = (await conn.execute(_SAME_AGAIN, params)).one_or_none()
        if same is not None:
            registration = node_writes.Registration(report.id, False, False, node_from_row(same))
            return InOneStatement(registration, "same_as_last_stored")
    row = (
        await conn.execute(
            _ONE_STATEMENT,
            {
                **node_parameters(report, digest),
                "node_id": report.id,
                **hardware_rows(report),
                "actor": actor,
            },
        )
    ).one()
    if row.verdict not in WRITTEN:
        return NotInOneStatement(row.verdict)
    if row.event_ids:
        note_recorded(list(row.event_ids))
    _remember(report.id, digest)
    changed = row.verdict == "changed"
    registration = node_writes.Registration(report.id, False, changed, node_from_row(row))
    return InOneStatement(registration, row.verdict)


async def register(
    engine: AsyncEngine, report: NodeReport, actor: str | None = None
) -> node_writes.Registration:
    """Store an agent's report: in one statement when re_register can, else in one transaction.

    Idempotent (a report replaces what the node said before), so each step
    is run again while the database is away, whether or not a failed
    attempt's statement committed (transactions.retried, in_transaction).
    """
    registration = await _store(engine, report, actor)
    correction = registration.node.observed_at_correction
    if correction is not None:
        # Stored, and said: in the log, the counter and the node's own field.
        log.warning("node %s: %s", report.id, correction)
        metrics.count_clock_correction(report.id)
    return registration


async def _in_one_statement(
    engine: AsyncEngine, report: NodeReport, actor: str | None
) -> InOneStatement | NotInOneStatement:
    try:
        # Outside a transaction block: _SAME_AGAIN, when tried, writes
        # one row or nothing, then _ONE_STATEMENT writes it all or nothing.
        with collecting_recorded() as recorded:
            async with connections.autocommit(engine) as conn:
                outcome = await re_register(conn, report, actor)
    except asyncpg.PostgresError as error:
        # A deadlock victim wrote nothing: the transaction retries it.
        if sqlstate(error) not in RETRYABLE_SQLSTATES:
            raise
        return NotInOneStatement("lost_conflict")
    if isinstance(outcome, InOneStatement):
        # Committed: the statement was its own transaction.
        announce(engine, recorded)
    return outcome


async def _store(
    engine: AsyncEngine, report: NodeReport, actor: str | None = None
) -> node_writes.Registration:
    reason = "xids" if any(g.xids for g in report.gpus) else "resets"
    if not any(g.xids or g.reset_seen for g in report.gpus):
        outcome = await retried(lambda: _in_one_statement(engine, report, actor), engine)
        if isinstance(outcome, InOneStatement):
            metrics.count_registration(ONE_STATEMENT, outcome.reason)
            return outcome.registration
        reason = outcome.reason
    registration = await in_transaction(
        engine, lambda conn: node_writes.register_node(conn, report, actor), idempotent=True
    )
    _remember(report.id, report.digest())
    metrics.count_registration(TRANSACTION, reason)
    return registration
