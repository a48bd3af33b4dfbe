"""Taints as operators and the policy set them: written, lifted, read back with the cordons they show.

A taint is a row of the taints table, on a GPU or on the whole node, one per
key on each (service/scheduling/taints.py says what it means). Every write
here holds the node's row lock (taken first, as every writer of a node's
GPUs, allocations or pools takes it), refreshes the GPUs' marks and the
node's pools in the same transaction (gpu_pools.refresh_taint_marks), and
records an event; a report never touches the rows, so taints survive
re-registration, and a GPU that leaves a report and comes back comes back
tainted.

Reading: a node's taints, and its GPUs', come with the operator's cordon and
drain shown as OPERATOR NO_SCHEDULE taints (keys `cordon` and `drain`),
which are lifted by uncordon, not by untaint.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import text

from service.database.connections import Connection
from service.errors import InvalidInput
from service.event_log.events import note_recorded
from service.fleet.gpu_changes import check_reason, lock_gpus, record_events
from service.fleet.health.taint_rows import (
    gpu_cordon_taint,
    gpu_cordoned,
    node_admin_taint,
    node_admin_tainted,
)
from service.scheduling.gpu_pools import refresh_taint_marks
from service.scheduling.rejections import index_ranges, shown
from service.scheduling.taints import (
    CORDON_KEY,
    DRAIN_KEY,
    RESERVED_KEYS,
    Taint,
    TaintEffect,
    TaintSource,
    check_key,
    check_value,
    label,
    stop_by_sql,
)


@dataclass(frozen=True)
class TaintRequest:
    """A taint as an operator (or the policy) asks for it."""

    key: str
    value: str | None
    effect: TaintEffect
    reason: str
    source: TaintSource = TaintSource.OPERATOR


def checked(request: TaintRequest, field: str = "taint") -> TaintRequest:
    """The request with its reason trimmed, or BAD_INPUT naming the field."""
    problem = check_key(f"{field}.key", request.key)
    if problem is not None:
        raise InvalidInput(f"{field}.key", request.key, problem)
    if request.key in RESERVED_KEYS:
        verb = "cordonGpu or cordonNode" if request.key == CORDON_KEY else "drainNode"
        raise InvalidInput(f"{field}.key", request.key, f"{request.key!r} is reserved: use {verb}")
    problem = check_value(request.value)
    if problem is not None:
        raise InvalidInput(f"{field}.value", request.value, problem)
    try:
        reason = check_reason(request.reason)
    except InvalidInput as error:
        raise InvalidInput(f"{field}.reason", request.reason, error.message) from None
    return TaintRequest(request.key, request.value, request.effect, reason, request.source)


def _indices(gpus: Mapping[int, object], node_id: str, indices: Sequence[int]) -> list[int]:
    if not indices:
        raise InvalidInput("indices", list(indices), "name at least one GPU")
    seen: set[int] = set()
    for i, index in enumerate(indices):
        if index not in gpus:
            raise InvalidInput(
                f"indices[{i}]",
                index,
                f"node {shown(node_id)} has no GPU {index}; its GPUs are {index_ranges(gpus)}",
            )
        if index in seen:
            raise InvalidInput(f"indices[{i}]", index, "listed twice")
        seen.add(index)
    return sorted(seen)


# One row per GPU (or one with gpu_index NULL for the node: indices [NULL]); a taint of the
# same key there is replaced, and keeps its `since` unless its effect changed.
_PUT = text(
    """
    INSERT INTO taints AS t (node_id, gpu_index, key, value, effect, source, reason, actor)
    SELECT :node_id, i, :key, :value, :effect, :source, :reason, :actor
    FROM unnest(CAST(:indices AS int[])) AS i
    ORDER BY i
    ON CONFLICT (node_id, gpu_index, key) DO UPDATE
    SET value = excluded.value, effect = excluded.effect, source = excluded.source,
        reason = excluded.reason, actor = excluded.actor,
        since = CASE WHEN t.effect = excluded.effect THEN t.since ELSE now() END
    RETURNING gpu_index
    """
)
_LIFT = text(
    """
    DELETE FROM taints
    WHERE node_id = :node_id AND key = :key
      AND gpu_index = ANY(CAST(:indices AS int[]))
    RETURNING gpu_index, value, effect, source
    """
)
_LIFT_NODE = text(
    """
    DELETE FROM taints WHERE node_id = :node_id AND key = :key AND gpu_index IS NULL
    RETURNING gpu_index, value, effect, source
    """
)
_KEYS = text(
    """
    SELECT coalesce(array_agg(DISTINCT key ORDER BY key), '{}') FROM taints
    WHERE node_id = :node_id AND gpu_index IS NOT DISTINCT FROM :index
    """
)


def _detail(request: TaintRequest, index: int | None) -> dict[str, object]:
    detail: dict[str, object] = {
        "key": request.key,
        "value": request.value,
        "effect": request.effect.value,
        "source": request.source.value,
    }
    if index is not None:
        detail["index"] = index
    return detail


# The GPUs of the node (gpu_index NULL: the node itself) that already carry
# the key as NO_EXECUTE: setting it again moves no replica again.
_EXECUTING = text(
    f"""
    SELECT gpu_index FROM taints
    WHERE node_id = :node_id AND key = :key AND effect = '{TaintEffect.NO_EXECUTE.value}'
    """
)
# Each replica holding a GPU that a NO_EXECUTE taint just reached, once per
# shard, when its time to stop is known (taints.stop_by_sql: NULL when it
# tolerates every such taint for ever): the scheduler's subscription learns to
# replace it, and its engine is told TAINTED once the time has come.
_MUST_MOVE = text(
    f"""
    INSERT INTO events (kind, node_id, replica_id, shard_id, actor, reason, detail)
    SELECT 'replica_must_move', s.node_id, s.replica_id, s.shard_id, :actor, :reason,
           jsonb_build_object('key', CAST(:key AS text), 'value', CAST(:value AS text),
                              'effect', '{TaintEffect.NO_EXECUTE.value}',
                              'gpuIndices', to_jsonb(s.gpu_indices), 'stopBy', x.stop_by)
    FROM shards s CROSS JOIN LATERAL (SELECT {stop_by_sql("s")} AS stop_by) x
    WHERE s.node_id = :node_id AND x.stop_by IS NOT NULL
      AND (CAST(:whole_node AS boolean) OR s.gpu_indices && CAST(:indices AS int[]))
    ORDER BY s.shard_id
    RETURNING id
    """
)


async def put_taint(
    conn: Connection,
    node_id: str,
    indices: Sequence[int] | None,
    request: TaintRequest,
    actor: str | None,
) -> None:
    """Put the taint on these GPUs of a node whose row this transaction has locked (None: the node).

    Marks, pools and events follow in the same transaction. For the policy
    (service/fleet/health/) and the operator's verbs below alike. A
    NO_EXECUTE taint new to a GPU (or node) tells each replica holding it
    that it must move (replica_must_move, with the taint and by when).
    """
    moving: list[int | None] = []
    if request.effect is TaintEffect.NO_EXECUTE:
        before = {
            r.gpu_index
            for r in await conn.execute(_EXECUTING, {"node_id": node_id, "key": request.key})
        }
        moving = [i for i in (indices if indices is not None else [None]) if i not in before]
    params = {
        "node_id": node_id,
        "key": request.key,
        "value": request.value,
        "effect": request.effect.value,
        "source": request.source.value,
        "reason": request.reason,
        "actor": actor,
    }
    if indices is None:
        await conn.execute(_PUT, {**params, "indices": [None]})
        events = [
            {"kind": "node_tainted", "reason": request.reason, "detail": _detail(request, None)}
        ]
    else:
        await conn.execute(_PUT, {**params, "indices": list(indices)})
        events = [
            {"kind": "gpu_tainted", "reason": request.reason, "detail": _detail(request, i)}
            for i in indices
        ]
    await refresh_taint_marks(conn, [node_id])
    await record_events(conn, node_id, actor, events)
    if moving:
        where = (
            "the node"
            if moving == [None]
            else f"GPU {index_ranges(i for i in moving if i is not None)}"
        )
        moved = await conn.execute(
            _MUST_MOVE,
            {
                "node_id": node_id,
                "actor": actor,
                "reason": f"{label(request.key, request.value, request.effect)} on {where}: "
                f"{request.reason}",
                "key": request.key,
                "value": request.value,
                "whole_node": moving == [None],
                "indices": [i for i in moving if i is not None],
            },
        )
        note_recorded(list(moved.scalars()))


async def taint_gpus(
    conn: Connection, node_id: str, indices: Sequence[int], request: TaintRequest, actor: str | None
) -> list[int]:
    """An operator taints GPUs of a node: BAD_INPUT naming the field for a bad taint or GPU."""
    request = checked(request)
    gpus = await lock_gpus(conn, node_id)
    chosen = _indices(gpus, node_id, indices)
    await put_taint(conn, node_id, chosen, request, actor)
    return chosen


async def taint_node(
    conn: Connection, node_id: str, request: TaintRequest, actor: str | None
) -> None:
    request = checked(request)
    await lock_gpus(conn, node_id)
    await put_taint(conn, node_id, None, request, actor)


def _lift_check(key: str) -> None:
    problem = check_key("key", key)
    if problem is not None:
        raise InvalidInput("key", key, problem)
    if key == CORDON_KEY:
        raise InvalidInput("key", key, "a cordon is lifted with uncordonGpu or uncordonNode")
    if key == DRAIN_KEY:
        raise InvalidInput("key", key, "a drain is lifted with uncordonNode")


async def lift_taint(
    conn: Connection, node_id: str, indices: Sequence[int] | None, key: str, actor: str | None
) -> int:
    """Lift the taint `key` from these GPUs (None: from the node), locked by the caller: how many went."""
    params = {"node_id": node_id, "key": key}
    if indices is None:
        rows = list(await conn.execute(_LIFT_NODE, params))
    else:
        rows = list(await conn.execute(_LIFT, {**params, "indices": list(indices)}))
    if rows:
        await refresh_taint_marks(conn, [node_id])
        await record_events(
            conn,
            node_id,
            actor,
            [
                {
                    "kind": "node_untainted" if r.gpu_index is None else "gpu_untainted",
                    "detail": {
                        "key": key,
                        "value": r.value,
                        "effect": r.effect,
                        "source": r.source,
                        **({} if r.gpu_index is None else {"index": r.gpu_index}),
                    },
                }
                for r in sorted(rows, key=lambda r: -1 if r.gpu_index is None else r.gpu_index)
            ],
        )
    return len(rows)


async def untaint_gpus(
    conn: Connection, node_id: str, indices: Sequence[int], key: str, actor: str | None
) -> list[int]:
    """An operator lifts a taint from GPUs; a GPU without it is BAD_INPUT naming the GPU."""
    _lift_check(key)
    gpus = await lock_gpus(conn, node_id)
    chosen = _indices(gpus, node_id, indices)
    rows = await conn.execute(
        text(
            """
            SELECT gpu_index FROM taints
            WHERE node_id = :node_id AND key = :key AND gpu_index = ANY(CAST(:indices AS int[]))
            """
        ),
        {"node_id": node_id, "key": key, "indices": chosen},
    )
    tainted = {r.gpu_index for r in rows}
    for index in chosen:
        if index not in tainted:
            have = (await conn.execute(_KEYS, {"node_id": node_id, "index": index})).scalar_one()
            raise InvalidInput(
                "key",
                key,
                f"GPU {index} of node {shown(node_id)} has no taint {key!r}; "
                f"its taints: {', '.join(have) or 'none'}",
            )
    await lift_taint(conn, node_id, chosen, key, actor)
    return chosen


async def untaint_node(conn: Connection, node_id: str, key: str, actor: str | None) -> None:
    _lift_check(key)
    await lock_gpus(conn, node_id)
    if not await lift_taint(conn, node_id, None, key, actor):
        have = (await conn.execute(_KEYS, {"node_id": node_id, "index": None})).scalar_one()
        raise InvalidInput(
            "key",
            key,
            f"node {shown(node_id)} has no taint {key!r}; its taints: {', '.join(have) or 'none'}",
        )


# Every taint of the nodes, on them and on their GPUs, with the cordons and
# drains shown as taints (CORDON_KEY, DRAIN_KEY), in (node, GPU: the node's
# first, key) order.
_OF_NODES = text(
    f"""
    SELECT node_id, gpu_index, key, value, effect, source, reason, actor, since
    FROM taints WHERE node_id = ANY(CAST(:ids AS text[]))
    UNION ALL
    SELECT g.node_id, g.idx, {gpu_cordon_taint("g")}
    FROM gpus g WHERE g.node_id = ANY(CAST(:ids AS text[])) AND {gpu_cordoned("g")}
    UNION ALL
    SELECT n.id, NULL, {node_admin_taint("n")}
    FROM nodes n WHERE n.id = ANY(CAST(:ids AS text[])) AND {node_admin_tainted("n")}
    ORDER BY 1, 2 NULLS FIRST, 3
    """
)


async def taints_of(conn: Connection, node_ids: Sequence[str]) -> dict[str, list[Taint]]:
    """Each node's taints, its own and its GPUs' (Taint.gpu_index), cordons and drains included."""
    out: dict[str, list[Taint]] = defaultdict(list)
    for r in await conn.execute(_OF_NODES, {"ids": list(node_ids)}):
        out[r.node_id].append(
            Taint(
                key=r.key,
                value=r.value,
                effect=TaintEffect(r.effect),
                source=TaintSource(r.source),
                reason=r.reason,
                since=r.since,
                actor=r.actor,
                gpu_index=r.gpu_index,
            )
        )
    return out


def described(taints: Sequence[Taint]) -> str:
    """key=value:EFFECT, ... for a listing."""
    return ", ".join(label(t.key, t.value, t.effect) for t in taints)
