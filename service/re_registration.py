"""A known node re-sending its report: one statement, no transaction block, when nothing but its own rows moved.

Why: agents re-send their report every few minutes, and between two reports
usually only the disks' free space moved (or nothing did). The transactional
registration (service/nodes.register_node) costs BEGIN, the node upsert, a
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
| rebooted | a new boot id clears sticky GPU health (service/gpu_health.py) |
| gpus_changed | pools are counted from the GPUs, under the lock (nodes._REPLACE_REPORT) |
| written_meanwhile | the row changed while this statement waited for its lock (below) |

Reports carrying XIDs never try (reason `xids`): their events, sticky
reasons and pools are gpu_health.after_report's.

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
(service/metrics.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service import metrics, nodes
from service.connections import Connection
from service.event_announcements import announce
from service.events import collecting_recorded, note_recorded
from service.node_views import node_from_row
from service.report_rows import (
    REPORTED_ROWS,
    came_back,
    gpus_differ,
    hardware_rows,
    node_parameters,
    rebooted,
    upsert_node,
    write_own_rows,
)
from service.reports import NodeReport, validate_report
from service.transactions import RETRYABLE_SQLSTATES, in_statement, in_transaction, sqlstate

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
            ELSE 'changed'
        END AS verdict
        FROM (SELECT 1) AS one LEFT JOIN old ON true
    ), upserted AS ({upsert_node("decision WHERE verdict IN ('unchanged', 'changed')")}
    ), {write_own_rows(_CHANGED)}, recorded AS (
        INSERT INTO events (kind, node_id, actor)
        SELECT 'report_changed', :id, :actor FROM decision WHERE verdict = 'changed'
        RETURNING id
    )
    SELECT u.*, v.verdict, (SELECT id FROM recorded) AS event_id
    FROM decision v LEFT JOIN upserted u ON true
    """
)


@dataclass(frozen=True)
class NotInOneStatement:
    """The one statement wrote nothing: the report takes the transaction, for this reason."""

    reason: str


async def re_register(
    conn: Connection, report: NodeReport, actor: str | None = None
) -> nodes.Registration | NotInOneStatement:
    """Store the report of a known, alive node whose GPUs did not change, in one statement.

    `conn` is outside a transaction block (the statement is its own
    transaction). Anything else writes nothing and says why.
    """
    validate_report(report)
    row = (
        await conn.execute(
            _ONE_STATEMENT,
            {
                **node_parameters(report, report.digest()),
                "node_id": report.id,
                **hardware_rows(report),
                "actor": actor,
            },
        )
    ).one()
    if row.verdict not in WRITTEN:
        return NotInOneStatement(row.verdict)
    if row.event_id is not None:
        note_recorded([row.event_id])
    changed = row.verdict == "changed"
    return nodes.Registration(report.id, False, changed, node_from_row(row))


async def register(
    engine: AsyncEngine, report: NodeReport, actor: str | None = None
) -> nodes.Registration:
    """Store an agent's report: in one statement when re_register can, else in one transaction."""
    reason = "xids"
    if not any(g.xids for g in report.gpus):
        try:
            with collecting_recorded() as recorded:
                outcome = await in_statement(engine, lambda conn: re_register(conn, report, actor))
        except asyncpg.PostgresError as error:
            # A deadlock victim wrote nothing: the transaction retries it.
            if sqlstate(error) not in RETRYABLE_SQLSTATES:
                raise
            outcome = NotInOneStatement("lost_conflict")
        if isinstance(outcome, nodes.Registration):
            # Committed: the statement was its own transaction.
            announce(engine, recorded)
            metrics.count_registration(ONE_STATEMENT, "changed" if outcome.changed else "unchanged")
            return outcome
        reason = outcome.reason
    registration = await in_transaction(
        engine, lambda conn: nodes.register_node(conn, report, actor)
    )
    metrics.count_registration(TRANSACTION, reason)
    return registration
