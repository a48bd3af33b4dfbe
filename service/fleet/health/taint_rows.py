"""Taints as read back: the rows of the taints table, with the operator's cordons shown as taints.

One home for how a stored taint (or a cordon, or a drain) becomes a
scheduling.taints.Taint, for the GPUs' records (node_details.gpus_of, one JSON
column per GPU) and for the nodes' lists (fleet/health/taints.taints_of).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from service.scheduling.taints import (
    CORDON_KEY,
    DRAIN_KEY,
    Taint,
    TaintEffect,
    TaintSource,
    taint_json,
)

_CORDON = f"'{CORDON_KEY}', NULL, '{TaintEffect.NO_SCHEDULE.value}', '{TaintSource.OPERATOR.value}'"


def gpu_cordon_taint(g: str) -> str:
    """SQL: the columns key, value, effect, source, reason, actor, since of the GPU row `g`'s
    cordon shown as a taint; a row only WHERE gpu_cordoned(g)."""
    return f"{_CORDON}, {g}.cordon_reason, {g}.cordon_actor, coalesce({g}.cordon_since, now())"


def gpu_cordoned(g: str) -> str:
    return f"{g}.cordon_reason IS NOT NULL"


# The columns of a taint row (TAINT_ROW), as gpu_taints_sql and node_taints_sql name them:
# the taints table's own (gpu_index null on the node), so that taints.taint_json reads it.
TAINT_ROW = "x(cordon, key, value, effect, source, reason, actor, since, gpu_index)"


def gpu_taints_sql(g: str, entry: str) -> str:
    """SQL json: `entry` (over TAINT_ROW) for each of the GPU row `g`'s own taints (its node's
    aside), cordon first, then by key; NULL for none.

    The taints table is read only for a GPU whose marks say it has some
    (gpus.withheld, gpus.last_resort): a page of untainted GPUs pays a
    column test each. Also the compiled page's Gpu.taints (service/graphql/fast/json_pages.py).
    """
    return f"""(CASE WHEN {g}.withheld OR {g}.last_resort OR {gpu_cordoned(g)} THEN (
        SELECT json_agg({entry} ORDER BY x.cordon DESC, x.key)
        FROM (SELECT true AS cordon, {gpu_cordon_taint(g)}, {g}.idx WHERE {gpu_cordoned(g)}
              UNION ALL
              SELECT false, t.key, t.value, t.effect, t.source, t.reason, t.actor, t.since,
                     t.gpu_index
              FROM taints t WHERE t.node_id = {g}.node_id AND t.gpu_index = {g}.idx
             ) AS {TAINT_ROW}
    ) END)"""


def gpu_taints_json(g: str) -> str:
    """SQL json: gpu_taints_sql's taints, each in taints.taint_json's one shape, as taint_of
    reads them (node_details.gpus_of)."""
    return gpu_taints_sql(g, taint_json("x"))


def node_admin_taint(n: str) -> str:
    """SQL: the columns key, value, effect, source, reason, actor, since of the node row `n`'s
    cordon or drain shown as a taint; a row only WHERE node_admin_tainted(n)."""
    return (
        f"CASE {n}.admin_state WHEN 'cordoned' THEN '{CORDON_KEY}' ELSE '{DRAIN_KEY}' END, NULL,"
        f" '{TaintEffect.NO_SCHEDULE.value}', '{TaintSource.OPERATOR.value}',"
        f" coalesce({n}.admin_reason, {n}.admin_state), {n}.admin_actor,"
        f" coalesce({n}.admin_since, now())"
    )


def node_admin_tainted(n: str) -> str:
    return f"{n}.admin_state IS NOT NULL"


def node_taints_sql(n: str, entry: str) -> str:
    """SQL json: `entry` (over TAINT_ROW) for each of the node row `n`'s own taints (not its
    GPUs'), its cordon or drain included, by key (as fleet/health/taints.taints_of lists them);
    [] for none. The compiled page's Node.taints (service/graphql/fast/json_pages.py)."""
    return f"""(SELECT coalesce(json_agg({entry} ORDER BY x.key), '[]')
        FROM (SELECT false, t.key, t.value, t.effect, t.source, t.reason, t.actor, t.since,
                     t.gpu_index
              FROM taints t WHERE t.node_id = {n}.id AND t.gpu_index IS NULL
              UNION ALL
              SELECT true, {node_admin_taint(n)}, NULL WHERE {node_admin_tainted(n)}
             ) AS {TAINT_ROW})"""


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
