"""XIDs, and the health they leave behind until the GPU is reset.

A GPU that raised a critical XID (fallen off the bus, a double-bit ECC error,
an NVLink error) can look healthy to NVML a minute later: NVML keeps no memory
of the event, and a service that believed the next report would offer the GPU
to the next replica, which then fails the same way. So a critical XID leaves a
sticky reason `xid_<n>` on the GPU (gpus.sticky_reasons) that later healthy
reports do not clear. Only a reset clears it: the node came back with a new
boot id (a reboot resets every GPU), or an operator who reset the GPU by hand
says so (clearGpuHealth). Each is recorded as an event.

An application's XID (13, 31, 43, 45...) says the program misbehaved, not the
GPU: it is recorded and counted, and the GPU stays usable.

Whether a GPU with sticky reasons may be used is service/scheduling/availability.py's
rule; this module only keeps the reasons.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import text

from service.database.connections import Connection
from service.errors import InvalidInput, NodeNotFound
from service.event_log.events import note_recorded, unknown_kinds
from service.fleet.reports import NodeReport
from service.scheduling.availability import gpu_usable
from service.scheduling.gpu_pools import refresh_pools
from service.scheduling.rejections import index_ranges, shown

# The XIDs after which a GPU takes no new work until it is reset, and why,
# from NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors). Every other
# XID is the application's (13 graphics engine exception, 31 MMU fault,
# 43 a stopped channel, 45 preemptive cleanup...): counted, not held against
# the GPU.
CRITICAL_XIDS: Mapping[int, str] = {
    48: "double-bit ECC error: memory contents were corrupted",
    63: "ECC page retirement or row remapping recorded: takes effect only after a reset",
    64: "ECC page retirement or row remapping failed: the bad memory stays in use",
    74: "NVLink error: a link is down or degraded, collectives hang or crawl",
    79: "the GPU has fallen off the bus: it answers nothing until a reset",
    92: "high single-bit ECC error rate: memory is failing",
    94: "contained ECC error: the application was stopped, the GPU needs a reset",
    95: "uncontained ECC error: every application on the GPU is affected",
    119: "GSP RPC timeout: the GPU's system processor stopped answering",
    120: "GSP error: the GPU's system processor faulted",
}
STICKY_PREFIX = "xid_"


def sticky_reason(xid: int) -> str:
    return f"{STICKY_PREFIX}{xid}"


@dataclass(frozen=True)
class ReportedXid:
    gpu_class: str
    xid: int


@dataclass(frozen=True)
class _Gpu:
    idx: int
    uuid: str | None
    gpu_class: str
    usable: bool
    sticky: tuple[str, ...]
    shard_id: str | None
    replica_id: str | None


# A node's GPUs as this module and gpu_cordons need them, read under the
# node's row lock (taken first: every writer of a node's GPUs, allocations or
# pools takes it, so the pools this module refreshes cannot race).
_LOCK_NODE = text("SELECT id FROM nodes WHERE id = :node_id FOR NO KEY UPDATE")
_GPUS = text(
    f"""
    SELECT g.idx, g.uuid, g.gpu_class, {gpu_usable("g")} AS usable, g.sticky_reasons,
           a.shard_id, s.replica_id
    FROM gpus g
    LEFT JOIN allocated_gpus a ON a.node_id = g.node_id AND a.gpu_index = g.idx
    LEFT JOIN shards s ON s.shard_id = a.shard_id
    WHERE g.node_id = :node_id
    ORDER BY g.idx
    """
)


async def lock_gpus(conn: Connection, node_id: str) -> dict[int, _Gpu]:
    """Lock the node's row and read its GPUs; NodeNotFound when it is not registered."""
    if (await conn.execute(_LOCK_NODE, {"node_id": node_id})).one_or_none() is None:
        raise NodeNotFound(node_id)
    rows = await conn.execute(_GPUS, {"node_id": node_id})
    return {
        r.idx: _Gpu(
            r.idx, r.uuid, r.gpu_class, r.usable, tuple(r.sticky_reasons), r.shard_id, r.replica_id
        )
        for r in rows
    }


def gpu_of(gpus: Mapping[int, _Gpu], node_id: str, index: int) -> _Gpu:
    """The GPU at `index`, or a BAD_INPUT naming the index and the GPUs the node has."""
    gpu = gpus.get(index)
    if gpu is None:
        raise InvalidInput(
            "index",
            index,
            f"node {shown(node_id)} has no GPU {index}; its GPUs are {index_ranges(gpus)}",
        )
    return gpu


_RECORD_MANY = text(
    """
    INSERT INTO events (kind, node_id, replica_id, shard_id, actor, reason, detail)
    SELECT e.item ->> 'kind', CAST(:node_id AS text), e.item ->> 'replica_id',
           e.item ->> 'shard_id', CAST(:actor AS text), e.item ->> 'reason',
           coalesce(e.item -> 'detail', '{}')
    FROM jsonb_array_elements(CAST(:events AS jsonb)) WITH ORDINALITY AS e(item, ord)
    ORDER BY e.ord
    RETURNING id
    """
)


async def record_events(
    conn: Connection, node_id: str, actor: str | None, events: Sequence[Mapping[str, object]]
) -> None:
    """Several events of one node in one statement, in order (the rows record_event writes).

    The kinds are checked against the closed set as record_event checks them:
    a kind no reader can ask for would be an event nobody ever sees.
    """
    stray = unknown_kinds([str(e["kind"]) for e in events])
    if stray:
        raise ValueError(f"event kinds {stray!r} are not in EVENT_KINDS")
    if events:
        rows = await conn.execute(
            _RECORD_MANY, {"node_id": node_id, "actor": actor, "events": json.dumps(events)}
        )
        note_recorded(list(rows.scalars()))


def gpu_detail(gpu: _Gpu, **more: object) -> dict[str, object]:
    return {"index": gpu.idx, "uuid": gpu.uuid, **more}


async def after_change(
    conn: Connection,
    node_id: str,
    before: Mapping[int, _Gpu],
    why: Mapping[int, str],
    events: list[dict[str, object]],
) -> None:
    """Refresh the node's pools; tell the holders of GPUs that just became unusable.

    What runs on such a GPU keeps running (its allocation stays): the event
    gpu_failed_under_allocation names the shard and the replica, so a
    scheduler's subscription learns to move it.
    """
    await refresh_pools(conn, [node_id])
    after = await conn.execute(_GPUS, {"node_id": node_id})
    for row in after:
        old = before.get(row.idx)
        if old is None or not old.usable or row.usable or row.shard_id is None:
            continue
        events.append(
            {
                "kind": "gpu_failed_under_allocation",
                "replica_id": row.replica_id,
                "shard_id": row.shard_id,
                "reason": why.get(row.idx, "unusable"),
                "detail": gpu_detail(old),
            }
        )


_SET_STICKY = text(
    """
    UPDATE gpus g SET sticky_reasons = r.sticky
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(idx int, sticky text[])
    WHERE g.node_id = :node_id AND g.idx = r.idx AND g.sticky_reasons IS DISTINCT FROM r.sticky
    """
)


async def _set_sticky(conn: Connection, node_id: str, sticky: Mapping[int, Sequence[str]]) -> None:
    rows = [{"idx": i, "sticky": sorted(set(s))} for i, s in sorted(sticky.items())]
    await conn.execute(_SET_STICKY, {"node_id": node_id, "rows": json.dumps(rows)})


async def after_report(
    conn: Connection, report: NodeReport, rebooted: bool, actor: str | None
) -> tuple[ReportedXid, ...]:
    """A stored report's XIDs and reboot: events, sticky reasons, pools. No statement when neither.

    Runs after the report's GPUs are stored. A new boot id clears first: the
    XIDs in the same report happened after that boot.
    """
    reported = [(g.index, xid) for g in report.gpus for xid in g.xids]
    if not (reported or rebooted):
        return ()
    gpus = await lock_gpus(conn, report.id)
    sticky = {i: list(g.sticky) for i, g in gpus.items()}
    events: list[dict[str, object]] = []
    if rebooted:
        for gpu in gpus.values():
            if gpu.sticky:
                sticky[gpu.idx] = []
                events.append(
                    {
                        "kind": "gpu_health_cleared",
                        "reason": "the node rebooted (new boot id): its GPUs were reset",
                        "detail": gpu_detail(gpu, cleared=list(gpu.sticky)),
                    }
                )
    counted: list[ReportedXid] = []
    why_unusable: dict[int, str] = {}
    for index, xid in reported:
        gpu = gpus[index]  # the report's GPUs are stored
        counted.append(ReportedXid(gpu.gpu_class, xid))
        why = CRITICAL_XIDS.get(xid)
        events.append(
            {
                "kind": "gpu_xid",
                "reason": why,
                "detail": gpu_detail(gpu, xid=xid, critical=why is not None),
            }
        )
        if why is not None:
            sticky[index].append(sticky_reason(xid))
            why_unusable.setdefault(index, f"{sticky_reason(xid)}: {why}")
    await _set_sticky(conn, report.id, sticky)
    await after_change(conn, report.id, gpus, why_unusable, events)
    await record_events(conn, report.id, actor, events)
    return tuple(counted)


async def clear_gpu_health(conn: Connection, node_id: str, index: int, actor: str | None) -> None:
    """An operator reset the GPU by hand: its sticky reasons go (an event says which)."""
    gpus = await lock_gpus(conn, node_id)
    gpu = gpu_of(gpus, node_id, index)
    await _set_sticky(conn, node_id, {index: []})
    await refresh_pools(conn, [node_id])
    await record_events(
        conn,
        node_id,
        actor,
        [
            {
                "kind": "gpu_health_cleared",
                "reason": "cleared by an operator",
                "detail": gpu_detail(gpu, cleared=list(gpu.sticky)),
            }
        ],
    )
