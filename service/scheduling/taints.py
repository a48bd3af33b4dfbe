"""Taints and tolerations: marks that keep work off a GPU, and the requests that may ignore them.

As Kubernetes' device taints (KEP-5055) have them: a taint on a GPU or on a
node has a key, an optional value and an effect; a request carries
tolerations, and a toleration matches a taint with the same key (and value,
for EQUAL; any value for EXISTS) and the same effect (any effect when the
toleration names none).

- NO_SCHEDULE: the GPU takes no new work unless the request tolerates the
  taint. What runs there keeps running.
- NO_EXECUTE: as NO_SCHEDULE, and what runs there is told to stop
  (shardsToStop, reason TAINTED) once its toleration runs out:
  tolerationSeconds after the taint (or after the shard was placed, if
  later), at once when the shard does not tolerate it at all.
- PREFER_NO_SCHEDULE: offered to everyone, used last (a term of the
  candidate ranking), unless the request tolerates it.

This module holds the vocabulary and the matching rule, in Python and in SQL;
what a taint means for "offered" is service/scheduling/availability.py's.
Cordons and drains stay what they are (the node's admin state, the GPU's
cordon): they are shown as taints with the reserved keys below and cannot be
tolerated, only lifted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from service.bounds import (
    MAX_ID_LENGTH,
    MAX_TEXT_LENGTH,
    MAX_TOLERATION_SECONDS,
    MAX_TOLERATIONS,
)
from service.errors import shown
from service.stored_text import storable


class TaintEffect(Enum):
    PREFER_NO_SCHEDULE = "PREFER_NO_SCHEDULE"
    NO_SCHEDULE = "NO_SCHEDULE"
    NO_EXECUTE = "NO_EXECUTE"


class TaintSource(Enum):
    OPERATOR = "OPERATOR"
    XID = "XID"
    DRIFT = "DRIFT"
    POLICY = "POLICY"
    VALIDATION = "VALIDATION"
    # A maintenance window's nodes (service/fleet/maintenance/): key
    # MAINTENANCE_KEY, PREFER_NO_SCHEDULE while it drains, NO_SCHEDULE from its start.
    MAINTENANCE = "MAINTENANCE"


class TolerationOperator(Enum):
    EXISTS = "EXISTS"
    EQUAL = "EQUAL"


# The effects that withhold a GPU from a request that does not tolerate them.
HARD_EFFECTS = frozenset({TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE})
# As SQL, over a taint row's `effect` column.
SOFT_EFFECT_SQL = f"'{TaintEffect.PREFER_NO_SCHEDULE.value}'"

# An operator's cordon and drain, shown as OPERATOR NO_SCHEDULE taints with
# these keys. Not taints of the taints table: they are lifted by uncordon,
# and no toleration passes them (a scheduler that could tolerate a cordon
# would place on the GPU the operator is replacing).
CORDON_KEY = "cordon"
DRAIN_KEY = "drain"
RESERVED_KEYS = frozenset({CORDON_KEY, DRAIN_KEY})
# The key of a maintenance window's taint (contract-time.graphql). A taint of
# the taints table, put and lifted by the window's transitions only.
MAINTENANCE_KEY = "maintenance"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str | None
    effect: TaintEffect
    source: TaintSource
    reason: str
    since: datetime
    actor: str | None = None
    # The GPU's index; None for a taint on the node.
    gpu_index: int | None = None
    remediation_id: int | None = None

    @property
    def withholds(self) -> bool:
        return self.effect in HARD_EFFECTS

    def describe(self) -> str:
        """How a verdict or a message names it: key=value:EFFECT (SOURCE: reason)."""
        return f"{label(self.key, self.value, self.effect)} ({self.source.value}: {self.reason})"


def label(key: str, value: str | None, effect: TaintEffect | str) -> str:
    """key[=value]:EFFECT, the way kubectl writes a taint."""
    shown_effect = effect.value if isinstance(effect, TaintEffect) else effect
    return f"{key}{'' if value is None else '=' + value}:{shown_effect}"


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str | None = None
    # None: every effect.
    effect: TaintEffect | None = None
    # For NO_EXECUTE: how long a shard may keep running after the taint. None: for ever.
    toleration_seconds: int | None = None

    def matches(self, key: str, value: str | None, effect: TaintEffect) -> bool:
        if self.key != key:
            return False
        if self.operator is TolerationOperator.EQUAL and self.value != value:
            return False
        return self.effect is None or self.effect is effect


def tolerates(tolerations: Sequence[Toleration], taint: Taint) -> bool:
    """Some toleration matches the taint (tolerated_sql in Python)."""
    return any(t.matches(taint.key, taint.value, taint.effect) for t in tolerations)


def check_key(field: str, key: str) -> str | None:
    """Why `key` is not a taint key, or None."""
    if not key:
        return "a taint key is not empty"
    if len(key) > MAX_ID_LENGTH:
        return f"a taint key is at most {MAX_ID_LENGTH} characters"
    if not storable(key) or any(c.isspace() for c in key):
        return "a taint key has no spaces or NUL characters"
    return None


def check_value(value: str | None) -> str | None:
    if value is not None and (len(value) > MAX_TEXT_LENGTH or not storable(value)):
        return f"a taint value is at most {MAX_TEXT_LENGTH} characters, without NUL"
    return None


def toleration_problem(
    tolerations: Sequence[Toleration], field: str = "tolerations"
) -> tuple[str, object, str] | None:
    """(field, value, problem) for the first toleration that cannot be honoured, or None.

    What can be refused without reading the database: an empty key, EXISTS
    with a value (EXISTS matches any value; naming one says the caller
    meant EQUAL), a negative tolerationSeconds, a reserved key (a cordon is
    lifted, not tolerated).
    """
    if len(tolerations) > MAX_TOLERATIONS:
        return field, f"{len(tolerations)} tolerations", f"at most {MAX_TOLERATIONS}"
    for i, t in enumerate(tolerations):
        at = f"{field}[{i}]"
        problem = check_key(at, t.key)
        if problem is not None:
            return f"{at}.key", t.key, problem
        if t.key in RESERVED_KEYS:
            return (
                f"{at}.key",
                t.key,
                f"'{shown(t.key)}' is an operator's {t.key}, which no request tolerates: lift it "
                "instead",
            )
        if t.operator is TolerationOperator.EXISTS and t.value is not None:
            return f"{at}.value", t.value, "EXISTS matches any value: give no value, or use EQUAL"
        problem = check_value(t.value)
        if problem is not None:
            return f"{at}.value", t.value, problem
        if t.toleration_seconds is not None and not (
            0 <= t.toleration_seconds <= MAX_TOLERATION_SECONDS
        ):
            return (
                f"{at}.tolerationSeconds",
                t.toleration_seconds,
                f"seconds from 0 to {MAX_TOLERATION_SECONDS}",
            )
        if t.toleration_seconds is not None and t.effect not in (None, TaintEffect.NO_EXECUTE):
            return (
                f"{at}.tolerationSeconds",
                t.toleration_seconds,
                "only a NO_EXECUTE toleration runs out: give no effect or NO_EXECUTE",
            )
    return None


def tolerations_json(tolerations: Sequence[Toleration]) -> str:
    """The :tolerations parameter of tolerated_sql."""
    return json.dumps(
        [
            {
                "key": t.key,
                "operator": t.operator.value,
                "value": t.value,
                "effect": None if t.effect is None else t.effect.value,
                "seconds": t.toleration_seconds,
            }
            for t in tolerations
        ],
        separators=(",", ":"),
    )


def tolerations_of(value: object) -> tuple[Toleration, ...]:
    """Tolerations back from tolerations_json's form (a stored shard's, read as JSON)."""
    if not value:
        return ()
    items = json.loads(value) if isinstance(value, str) else value
    assert isinstance(items, list)
    return tuple(
        Toleration(
            key=item["key"],
            operator=TolerationOperator(item["operator"]),
            value=item.get("value"),
            effect=None if item.get("effect") is None else TaintEffect(item["effect"]),
            toleration_seconds=item.get("seconds"),
        )
        for item in items
    )


# The columns of tolerations_json's form, as jsonb_to_recordset reads them.
_TOLERATION_ROWS = "o(key text, operator text, value text, effect text, seconds int)"


def _matches(o: str, t: str) -> str:
    """SQL: the toleration row `o` matches the taint row `t` (Toleration.matches)."""
    return (
        f"{o}.key = {t}.key"
        f" AND ({o}.operator = '{TolerationOperator.EXISTS.value}'"
        f" OR {o}.value IS NOT DISTINCT FROM {t}.value)"
        f" AND ({o}.effect IS NULL OR {o}.effect = {t}.effect)"
    )


def tolerated_sql(t: str, tolerations: str = "CAST(:tolerations AS jsonb)") -> str:
    """SQL: some toleration of `tolerations` (tolerations_json's form) matches the taint row `t`."""
    return (
        f"EXISTS (SELECT 1 FROM jsonb_to_recordset({tolerations}) AS {_TOLERATION_ROWS}"
        f" WHERE {_matches('o', t)})"
    )


def taint_applies(t: str, node: str, gpu: str) -> str:
    """SQL: the taint row `t` applies to GPU `gpu` of node `node`: it lies on that GPU or on the node.

    The one definition of "the taints on a GPU": a taint on a node applies to
    each of its GPUs. `gpu` is an index expression, or `ANY(indices)` for
    any of several GPUs. The node comes first, for the taints table's
    indexes, which all lead with node_id.
    """
    return f"{t}.node_id = {node} AND ({t}.gpu_index IS NULL OR {t}.gpu_index = {gpu})"


def taints_on(node: str, gpu: str) -> str:
    """SQL FROM ... WHERE: the taints table's rows `t` that apply to GPU `gpu` of node `node` (taint_applies).

    For a probe: `EXISTS (SELECT 1 {taints_on(...)} AND <the effect asked about>)`.
    """
    return f"FROM taints t WHERE {taint_applies('t', node, gpu)}"


def withholding(t: str, tolerating: bool = False) -> str:
    """SQL: the taint row `t` withholds the GPUs it applies to (NO_SCHEDULE, NO_EXECUTE: HARD_EFFECTS).

    `tolerating`: from the request, whose tolerations (:tolerations) do not
    match it (tolerated_sql).
    """
    untolerated = f" AND NOT {tolerated_sql(t)}" if tolerating else ""
    return f"{t}.effect <> {SOFT_EFFECT_SQL}{untolerated}"


def sending_last(t: str, tolerating: bool = False) -> str:
    """SQL: the taint row `t` is PREFER_NO_SCHEDULE: the GPUs it applies to are used last.

    `tolerating`: by the request, whose tolerations (:tolerations) do not match it.
    """
    untolerated = f" AND NOT {tolerated_sql(t)}" if tolerating else ""
    return f"{t}.effect = {SOFT_EFFECT_SQL}{untolerated}"


def evicting(t: str) -> str:
    """SQL: the taint row `t` is NO_EXECUTE: what runs on the GPUs it applies to is told to stop."""
    return f"{t}.effect = '{TaintEffect.NO_EXECUTE.value}'"


def taint_json(t: str) -> str:
    """SQL json: the taint row `t` in the one shape a statement returns a single taint in.

    Its columns by name, and `gpu`, the GPU's index (null: on the node).
    Read back whole by service/fleet/health/taint_rows.taint_of (with
    `gpu`; a GPU's own taints too, listed by taint_rows.gpu_taints_json), or
    as far as a verdict needs by verdicts.WithholdingTaint.of.
    """
    return (
        f"json_build_object('key', {t}.key, 'value', {t}.value, 'effect', {t}.effect,"
        f" 'source', {t}.source, 'reason', {t}.reason, 'actor', {t}.actor, 'since', {t}.since,"
        f" 'gpu', {t}.gpu_index)"
    )


def judged_taint(taint: str) -> str:
    """SQL jsonb: a taint_json value (`taint`, as jsonb) without what no verdict reads: its actor and time.

    For a statement that groups nodes by their withholding taint
    (placement/fit.py's survey): one taint set on many nodes at different
    times is one group, as judge() sees it.
    """
    return f"({taint} - 'actor' - 'since')"


def first_taint(node: str, gpu: str, effect: str) -> str:
    """SQL json: the first taint that applies to GPU `gpu` of node `node` and has `effect`, or NULL.

    As taint_json; `effect` is SQL over the taint row `t` (withholding,
    evicting). First: the node's own taint, then by GPU index, then by key:
    the one a verdict (TAINTED), a refused allocation (GPU_TAINTED) or a
    shard to move names, so that all three name the same taint.
    """
    return (
        f"(SELECT {taint_json('t')} {taints_on(node, gpu)} AND {effect}"
        " ORDER BY t.gpu_index NULLS FIRST, t.key LIMIT 1)"
    )


def stop_by_sql(s: str) -> str:
    """SQL timestamptz: by when the shard row `s` must stop for NO_EXECUTE taints; NULL: never.

    Each NO_EXECUTE taint on one of the shard's GPUs or on its node counts
    from when it was set, or from when the shard was placed if later: at
    once when none of the shard's tolerations (shards.tolerations, the
    request's when it was placed) matches it; else after the least
    tolerationSeconds among those that match, and never when none of those
    says a time. The earliest of these (Kubernetes' taint manager counts the
    same way: getMinTolerationTime). Read per shard through the taints
    table's node index, so a shard on an untainted node costs one descent.
    """
    start = f"greatest(t.since, {s}.created_at)"
    return f"""(SELECT min(CASE WHEN m.matched THEN {start} + make_interval(secs => m.seconds)
                                ELSE {start} END)
        FROM taints t CROSS JOIN LATERAL (
            SELECT count(*) > 0 AS matched, min(o.seconds) AS seconds
            FROM jsonb_to_recordset(coalesce({s}.tolerations, CAST('[]' AS jsonb)))
                AS {_TOLERATION_ROWS}
            WHERE {_matches("o", "t")}) m
        WHERE {taint_applies("t", f"{s}.node_id", f"ANY({s}.gpu_indices)")} AND {evicting("t")})"""


def stored_tolerations(tolerations: str = "CAST(:tolerations AS jsonb)") -> str:
    """SQL jsonb: what shards.tolerations keeps of a request's tolerations (NULL for none)."""
    return f"NULLIF({tolerations}, CAST('[]' AS jsonb))"


def last_resort_term(free: int, last_resort: int, need: int) -> int:
    """The ranking term of PREFER_NO_SCHEDULE: 1 when the node needs such GPUs for `need`, else 0.

    A node that can give `need` GPUs without its last-resort ones (the
    claim takes those last: availability.gpu_last_resort) ranks with the
    untainted; one that cannot goes after every node that can, whatever
    its fit. The first term of the candidate ranking after the weights
    (placement.plan's rank, statements' window: last_resort_term_sql).
    """
    return 1 if free - last_resort < need else 0


def last_resort_term_sql(free: str, last_resort: str, need: str = ":need") -> str:
    """SQL: last_resort_term over the expressions given."""
    return f"(CASE WHEN {free} - {last_resort} < {need} THEN 1 ELSE 0 END)"
