"""A node's life as the agent and the operator shape it: register, heartbeat, cordon, drain, remove.

Functions here run inside the caller's transaction and never commit: the
resolver opens one transaction per mutation, so a report is stored whole or
not at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text

from service.database.connections import Connection
from service.errors import NodeNotFound
from service.event_log.events import note_recorded, record_event
from service.fleet import gpu_health
from service.fleet.gpu_changes import check_reason
from service.fleet.gpu_health import ReportedXid
from service.fleet.health import drift
from service.fleet.node_reads import (
    BEAT_COLUMNS,
    BeatRecord,
    NodeRecord,
    beat_from_row,
    node_from_row,
)
from service.fleet.report_rows import (
    REPORTED_ROWS,
    came_back,
    hardware_rows,
    new_life,
    node_parameters,
    rebooted,
    rows_json,
    upsert_node,
    write_gpus,
    write_own_rows,
)
from service.fleet.reports import NodeReport, validate_report
from service.scheduling.availability import (
    POOL_COLUMNS,
    gpu_usable,
    node_schedulable,
    pool_counts,
    taint_marks,
)
from service.scheduling.generations import bump_generations
from service.scheduling.gpu_pools import (
    POOL_INSERT_COLUMNS,
    POOL_UPSERT,
    attached_fabrics,
    counted,
    node_attachments,
    refresh_pools,
)


@dataclass(frozen=True)
class Registration:
    node_id: str
    created: bool
    changed: bool
    # The node's row as this registration left it (the caller's reply needs
    # no second read: nothing after the upsert changes the row).
    node: NodeRecord
    # The XIDs the report carried, for the caller to count once it commits.
    xids: tuple[ReportedXid, ...] = ()


# One round trip answers "new, changed or the same?": the old row is read
# (and locked) in the statement that upserts it. The upsert selects through
# `old`, so the old row is read (and locked) before this row is written: read
# after, in the same statement, the lock skips the row this statement just
# updated and every re-registration looked like a new node, rewriting its
# hardware and logging "registered" again.
_UPSERT_NODE = text(
    f"""
    WITH old AS (
        SELECT report_digest, liveness, boot_id FROM nodes WHERE id = :id FOR NO KEY UPDATE
    ), upserted AS ({upsert_node("(SELECT 1) AS one LEFT JOIN old ON true")})
    SELECT upserted.*,
           (SELECT report_digest FROM old) AS old_digest,
           (SELECT liveness FROM old) AS old_liveness,
           coalesce((SELECT {came_back("old")} FROM old), false) AS came_back,
           coalesce((SELECT {rebooted("old", "CAST(:boot_id AS text)")} FROM old), false)
               AS rebooted,
           NOT EXISTS (SELECT 1 FROM old) AS created
    FROM upserted
    """
)

# Everything a changed (or returning) report writes after the node row, in
# one round trip: the four child tables, the node's gpu_pools rows and the
# events. Round trips dominate a registration's cost (seven statements ran
# about half as fast as one here).
#
# It runs as a second statement, after _UPSERT_NODE holds the node's row lock,
# and not fused into it: READ COMMITTED gives each statement the snapshot of
# its start, and a statement that waited for the lock behind an allocation
# would count free GPUs from a snapshot without that allocation. Started under
# the lock, this one sees every allocation committed on the node, and none can
# commit until we do (allocate takes the same lock first). (A known, alive
# node whose GPUs did not change needs no counts: service/fleet/re_registration.py
# writes it in one statement.)
#
# Its own writes are invisible to its own reads, so the pool counts come from
# the report's GPUs when it changed (what the gpus table holds afterwards) and
# from the stored GPUs otherwise.
_CHANGED = "CAST(:changed AS boolean)"
# The node's fabric attachments as the table holds them after this statement.
_FABRICS_NOW = (
    f"(SELECT fabric, rate_gbps FROM f_in WHERE {_CHANGED} UNION ALL"
    f" SELECT fabric, rate_gbps FROM {node_attachments(':node_id')} AND NOT {_CHANGED}) fa"
)
_REPLACE_REPORT = text(
    f"""
    WITH {REPORTED_ROWS}, {write_gpus(_CHANGED)}, {write_own_rows(_CHANGED)}, gpus_now AS (
        -- The GPUs as the gpus table holds them after this statement, with
        -- the columns availability.pool_counts reads (POOL_COLUMNS): the
        -- report's, and the service's own (cordon, sticky reasons, taint
        -- marks) that a report does not overwrite; a new GPU's marks as
        -- write_gpus gives them.
        SELECT i.idx, i.gpu_class, i.healthy,
               coalesce(o.sticky_reasons, CAST('{{}}' AS text[])) AS sticky_reasons,
               o.cordon_reason, i.nvlink_group, i.nvlink_peers, i.nvlink_domain, m.withheld,
               m.last_resort, o.reservation
        FROM g_in i LEFT JOIN gpus o ON o.node_id = :node_id AND o.idx = i.idx
        CROSS JOIN LATERAL (
            SELECT o.withheld, o.last_resort WHERE o.idx IS NOT NULL
            UNION ALL
            SELECT {taint_marks("CAST(:node_id AS text)", "i.idx")} WHERE o.idx IS NULL
        ) m
        WHERE {_CHANGED}
        UNION ALL
        SELECT idx, gpu_class, {", ".join(POOL_COLUMNS)} FROM gpus
        WHERE node_id = :node_id AND NOT {_CHANGED}
    ), counts AS (
        SELECT g.gpu_class, {pool_counts("g", "a.gpu_index IS NOT NULL")}
        FROM gpus_now g
        LEFT JOIN allocated_gpus a ON a.node_id = :node_id AND a.gpu_index = g.idx
        GROUP BY g.gpu_class
    ), pools_gone AS (
        DELETE FROM gpu_pools p WHERE p.node_id = :node_id
          AND NOT EXISTS (SELECT 1 FROM counts c WHERE c.gpu_class = p.gpu_class)
    ), pools_up AS (
        INSERT INTO gpu_pools AS p ({POOL_INSERT_COLUMNS})
        SELECT :node_id, c.gpu_class, {counted("c")}, {node_schedulable("n")},
               {attached_fabrics(_FABRICS_NOW)}
        FROM counts c JOIN nodes n ON n.id = :node_id
        ORDER BY c.gpu_class
        {POOL_UPSERT}
    ), recorded AS (
        -- The rows service.event_log.events.record_event writes, in the order given.
        INSERT INTO events (kind, node_id, actor, reason)
        SELECT e.item ->> 'kind', :node_id, :actor, e.item ->> 'reason'
        FROM jsonb_array_elements(CAST(:events AS jsonb)) WITH ORDINALITY AS e(item, ord)
        ORDER BY e.ord
        RETURNING id
    ), failed AS (
        -- A held GPU this report makes unusable keeps its allocation; its
        -- holder is told (service/fleet/gpu_changes.after_change does the same for
        -- cordons and XIDs). `o` is the stored row, as before this statement.
        INSERT INTO events (kind, node_id, replica_id, shard_id, actor, reason, detail)
        SELECT 'gpu_failed_under_allocation', :node_id, s.replica_id, s.shard_id, :actor,
               'unhealthy: ' || array_to_string(i.health_reasons, ', '),
               jsonb_build_object('index', i.idx, 'uuid', i.uuid)
        FROM gpus_now g
        JOIN g_in i ON i.idx = g.idx
        JOIN gpus o ON o.node_id = :node_id AND o.idx = g.idx
        JOIN allocated_gpus a ON a.node_id = :node_id AND a.gpu_index = g.idx
        JOIN shards s ON s.shard_id = a.shard_id
        WHERE {_CHANGED} AND {gpu_usable("o")} AND NOT {gpu_usable("g")}
        ORDER BY g.idx
        RETURNING id
    )
    SELECT id FROM recorded UNION ALL SELECT id FROM failed UNION ALL SELECT id FROM w_lost
    """
)


async def register_node(
    conn: Connection, report: NodeReport, actor: str | None = None
) -> Registration:
    """Create or replace a node's report. Its cordon, drain and allocations survive."""
    validate_report(report)
    digest = report.digest()
    result = await conn.execute(_UPSERT_NODE, node_parameters(report, digest))
    row = result.one()
    created = bool(row.created)
    changed = created or row.old_digest != digest
    node = node_from_row(row)

    if not (changed or row.came_back):
        # The common case: an agent re-sending what it sent before. Only the
        # node row's last_seen moved; nothing else is rewritten.
        xids = await gpu_health.after_report(conn, report, row.rebooted, actor)
        if row.rebooted or any(g.reset_seen for g in report.gpus):
            # The same hardware after a reboot or a reset judges the drift
            # remediations it carried out (drift.py: still drifting, ESCALATED).
            await drift.evaluate(conn, [report.id], actor)
        return Registration(report.id, created, changed, node, xids)

    events: list[dict[str, str | None]] = []
    if created:
        events.append({"kind": "registered", "reason": None})
    elif changed:
        events.append({"kind": "report_changed", "reason": None})
    if row.came_back:
        events.append({"kind": "back", "reason": f"registered while {row.old_liveness}"})
    recorded = await conn.execute(
        _REPLACE_REPORT,
        {
            "node_id": report.id,
            "changed": changed,
            **hardware_rows(report),
            "events": rows_json(events),
            "actor": actor,
        },
    )
    note_recorded(list(recorded.scalars()))
    xids = await gpu_health.after_report(conn, report, row.rebooted, actor)
    # What it now has against what its profile says (one statement without a profile).
    await drift.evaluate(conn, [report.id], actor)
    return Registration(report.id, created, changed, node, xids)


# Many nodes' heartbeats in one statement: service/fleet/heartbeats.py gathers the
# beats that arrive while a batch is in flight. Rows are locked in id order,
# the order every writer of several nodes uses, so two batches (or a batch
# and an allocation) queue instead of deadlocking. The new row comes back
# whole, so the reply needs no second read.
_HEARTBEATS = text(
    f"""
    WITH old AS (
        SELECT id, liveness, boot_id FROM nodes WHERE id = ANY(CAST(:ids AS text[]))
        ORDER BY id FOR NO KEY UPDATE
    )
    UPDATE nodes n SET last_seen = now(), liveness = 'alive', liveness_reason = NULL,
        incarnation = n.incarnation + CASE WHEN {new_life("old", "NULL")} THEN 1 ELSE 0 END
    FROM old WHERE n.id = old.id
    RETURNING {BEAT_COLUMNS}, old.liveness AS old_liveness
    """
)


# The common case alone: known nodes that were alive and stay alive. Nothing
# else changes with such a beat (no pools, no event), so it is one statement,
# which its caller runs without BEGIN and COMMIT: two round trips of the
# three a batch cost. Rows are locked in id order, like _HEARTBEATS, so two
# processes' batches cannot deadlock; a node the sweep marked unreachable
# meanwhile fails the re-checked liveness test and is left to heartbeat_many.
#
# Its commit does not wait for its WAL to reach disk (synchronous_commit off
# for this statement's own transaction: set_config's third argument; the
# connection's setting is back to the server's when it ends). A stamp is
# the one thing such a beat writes, and a crash loses at most the last
# 3 x wal_writer_delay of stamps, far below the liveness thresholds; the agents keep beating anyway. PostgreSQL's
# manual offers asynchronous commit for exactly such writes ("Asynchronous
# Commit"), and a later synchronous commit flushes them too, so nothing is
# seen out of order. Waiting for the flush would be most of a batch's time,
# while the process has no beat left to answer. A node coming back
# (heartbeat_many) records events and refreshes pools: that commit waits.
_ALIVE_HEARTBEATS = text(
    f"""
    WITH no_flush_wait AS (
        SELECT set_config('synchronous_commit', 'off', true)
    ), alive AS (
        SELECT id FROM nodes WHERE id = ANY(CAST(:ids AS text[])) AND liveness = 'alive'
        ORDER BY id FOR NO KEY UPDATE
    )
    UPDATE nodes n SET last_seen = now()
    FROM alive, no_flush_wait WHERE n.id = alive.id
    RETURNING {BEAT_COLUMNS}
    """
)


async def count_nodes(conn: Connection) -> int:
    """How many nodes are stored, whatever their state."""
    return int(await conn.scalar(text("SELECT count(*) FROM nodes")))


async def heartbeat_alive(conn: Connection, node_ids: Sequence[str]) -> dict[str, BeatRecord]:
    """Stamp the beats of nodes that were alive, in one statement; the others are absent.

    Whatever is absent (an unknown node, one coming back) goes to heartbeat_many.
    """
    rows = await conn.execute(_ALIVE_HEARTBEATS, {"ids": sorted(set(node_ids))})
    # The id from the record: a row's `.id` is a __getattr__ after a failed lookup.
    return {beat.id: beat for beat in map(beat_from_row, rows)}


async def heartbeat_many(conn: Connection, node_ids: Sequence[str]) -> dict[str, BeatRecord]:
    """Record that these nodes are alive, by the database's clock; bring back any that were not.

    The database's clock, because several service processes stamp the same
    column and the liveness sweep compares against now() on the same server.
    Unknown ids are absent from the answer. Returns each node's id and state as they are now.
    """
    rows = list(await conn.execute(_HEARTBEATS, {"ids": sorted(set(node_ids))}))
    back = [r for r in rows if r.old_liveness != "alive"]
    if back:
        await refresh_pools(conn, [r.id for r in back])
        for r in sorted(back, key=lambda r: r.id):
            await record_event(
                conn, "back", node_id=r.id, reason=f"heartbeat while {r.old_liveness}"
            )
    return {r.id: beat_from_row(r) for r in rows}


async def heartbeat(conn: Connection, node_id: str) -> None:
    """One node's heartbeat in the caller's transaction; see heartbeat_many."""
    if node_id not in await heartbeat_many(conn, [node_id]):
        raise NodeNotFound(node_id)


_SET_ADMIN = text(
    """
    UPDATE nodes SET admin_state = :admin_state, admin_reason = :reason, admin_actor = :actor,
        admin_since = CASE WHEN CAST(:admin_state AS text) IS NULL THEN NULL
                           WHEN admin_state IS NOT DISTINCT FROM CAST(:admin_state AS text)
                           THEN admin_since ELSE now() END
    WHERE id = :id
    RETURNING id
    """
)


async def _set_admin_state(
    conn: Connection,
    node_id: str,
    admin_state: str | None,
    reason: str | None,
    actor: str | None,
) -> None:
    params = {"id": node_id, "admin_state": admin_state, "reason": reason, "actor": actor}
    if (await conn.execute(_SET_ADMIN, params)).one_or_none() is None:
        raise NodeNotFound(node_id)
    await refresh_pools(conn, [node_id])


async def cordon_node(conn: Connection, node_id: str, reason: str, actor: str | None) -> None:
    """Exclude the node from new placement; what runs there keeps running."""
    reason = check_reason(reason)
    await _set_admin_state(conn, node_id, "cordoned", reason, actor)
    await record_event(conn, "cordoned", node_id=node_id, actor=actor, reason=reason)


async def drain_node(conn: Connection, node_id: str, reason: str, actor: str | None) -> None:
    """Mark the node's replicas for moving off; like a cordon, it takes no new ones."""
    reason = check_reason(reason)
    await _set_admin_state(conn, node_id, "draining", reason, actor)
    await record_event(conn, "drained", node_id=node_id, actor=actor, reason=reason)


async def uncordon_node(conn: Connection, node_id: str, actor: str | None) -> None:
    await _set_admin_state(conn, node_id, None, None, actor)
    await record_event(conn, "uncordoned", node_id=node_id, actor=actor)


_REMOVE = text("DELETE FROM nodes WHERE id = :id RETURNING id")
# The replicas that keep shards elsewhere when this node's go.
_SPLIT_REPLICAS = text(
    """
    SELECT DISTINCT replica_id FROM shards
    WHERE replica_id IN (SELECT replica_id FROM shards WHERE node_id = :id) AND node_id <> :id
    """
)


async def remove_node(conn: Connection, node_id: str, actor: str | None) -> bool:
    """Forget the node; its GPUs, reports and allocations go with it (foreign keys cascade).

    A replica that keeps shards on other nodes changed: its generation moves up.
    """
    split = list((await conn.execute(_SPLIT_REPLICAS, {"id": node_id})).scalars())
    removed = (await conn.execute(_REMOVE, {"id": node_id})).one_or_none() is not None
    await bump_generations(conn, split)
    if removed:
        await record_event(conn, "removed", node_id=node_id, actor=actor)
    return removed
