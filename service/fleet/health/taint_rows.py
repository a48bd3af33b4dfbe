"""Taints as read back: the rows of the taints table, with the operator's cordons shown as taints.

One home for how a stored taint (or a cordon, or a drain) becomes a
scheduling.taints.Taint, for the GPUs' records (hardware.gpus_of, one JSON
column per GPU) and for the nodes' lists (fleet/health/taints.taints_of).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from service.scheduling.taints import CORDON_KEY, Taint, TaintEffect, TaintSource

_CORDON = f"'{CORDON_KEY}', NULL, '{TaintEffect.NO_SCHEDULE.value}', '{TaintSource.OPERATOR.value}'"


def gpu_taints_json(g: str) -> str:
    """SQL json: the GPU row `g`'s own taints (its node's aside), cordon first, then by key; NULL for none.

    The taints table is read only for a GPU whose marks say it has some
    (gpus.withheld, gpus.last_resort): a page of untainted GPUs pays a
    column test each.
    """
    return f"""(CASE WHEN {g}.withheld OR {g}.last_resort OR {g}.cordon_reason IS NOT NULL THEN (
        SELECT json_agg(json_build_object('key', x.key, 'value', x.value, 'effect', x.effect,
                                          'source', x.source, 'reason', x.reason,
                                          'actor', x.actor, 'since', x.since)
                        ORDER BY x.cordon DESC, x.key)
        FROM (SELECT true AS cordon, {_CORDON}, {g}.cordon_reason, {g}.cordon_actor,
                     coalesce({g}.cordon_since, now())
              WHERE {g}.cordon_reason IS NOT NULL
              UNION ALL
              SELECT false, t.key, t.value, t.effect, t.source, t.reason, t.actor, t.since
              FROM taints t WHERE t.node_id = {g}.node_id AND t.gpu_index = {g}.idx
             ) AS x(cordon, key, value, effect, source, reason, actor, since)
    ) END)"""


def taint_of(item: dict[str, Any], gpu_index: int | None = None) -> Taint:
    since = item["since"]
    return Taint(
        key=item["key"],
        value=item["value"],
        effect=TaintEffect(item["effect"]),
        source=TaintSource(item["source"]),
        reason=item["reason"],
        since=since if isinstance(since, datetime) else datetime.fromisoformat(since),
        actor=item["actor"],
        gpu_index=gpu_index,
    )


def taints_from_json(value: Any, gpu_index: int | None = None) -> tuple[Taint, ...]:
    """gpu_taints_json's value as Taints (none for NULL)."""
    if value is None:
        return ()
    items = json.loads(value) if isinstance(value, str) else value
    return tuple(taint_of(item, gpu_index) for item in items)
