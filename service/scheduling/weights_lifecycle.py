"""Weights on a node as a lifecycle: their states, when they are ready, and who pins them.

The one home of three rules, each as SQL (for statements) and, where Python
decides too, as Python, kept equal by tests/weights/test_weights_rules.py:

- Ready: the agent reported the weights READY (complete and verified; the
  agent's markers are told in docs/scheduler/weights.md). A report without a
  state (an older agent) says "present, state unknown": never ready.
- Rank: how much a node's copy is worth to a replica that will read it:
  READY, then present with no state, then DOWNLOADING, then anything else
  (EVICTING, FAILED, absent). Placement prefers lower ranks.
- Pinned by: the replicas with a shard on the node that was placed with the
  path (shards.weights). Derived from shards, so a pin is written and
  removed by the same statements as the shard itself: place pins, release
  unpins, nothing else can drift.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Final


class WeightsState(Enum):
    DOWNLOADING = "downloading"
    READY = "ready"
    EVICTING = "evicting"
    FAILED = "failed"


# By stored value, as WeightsState(value) finds it without the enum's call.
STATES: Final = {state.value: state for state in WeightsState}

# sha256:<64 lowercase hex>: the one digest form the API accepts.
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def weights_ready(alias: str) -> str:
    """SQL: the weights row `alias` is READY."""
    return f"({alias}.state = 'ready')"


def is_ready(state: str | None) -> bool:
    """weights_ready in Python, over a stored state (None: not said, or no row)."""
    return state == WeightsState.READY.value


def weights_rank(alias: str) -> str:
    """SQL: the rank of the weights row `alias` (NULL when the node has no such row); lower is better."""
    return (
        f"(CASE WHEN {alias}.path IS NULL THEN 3 WHEN {alias}.state = 'ready' THEN 0 "
        f"WHEN {alias}.state IS NULL THEN 1 WHEN {alias}.state = 'downloading' THEN 2 ELSE 3 END)"
    )


def rank(present: bool, state: str | None) -> int:
    """weights_rank in Python."""
    if not present:
        return 3
    if state is None:
        return 1
    return {"ready": 0, "downloading": 2}.get(state, 3)


def pinned_by(alias: str) -> str:
    """SQL: the replica ids pinning the weights row `alias` on its node, sorted (never NULL)."""
    return (
        "ARRAY(SELECT DISTINCT s.replica_id FROM shards s"
        f" WHERE s.node_id = {alias}.node_id AND s.weights = {alias}.path ORDER BY 1)"
    )


def unpinned(alias: str) -> str:
    """SQL: nothing pins the weights row `alias`: an eviction tool may delete it."""
    return (
        "NOT EXISTS (SELECT 1 FROM shards s"
        f" WHERE s.node_id = {alias}.node_id AND s.weights = {alias}.path)"
    )


def readiness_phrase(path: str, state: str | None, size: int | None, total: int | None) -> str:
    """'/models/llama-70b is DOWNLOADING, 41% of 140 GB': why a node's copy is not ready."""
    if state is None:
        return f"{path} is present, state not reported"
    phrase = f"{path} is {state.upper()}"
    if size is not None and total:
        percent = int(100 * size / total)
        return f"{phrase}, {percent}% of {_gigabytes(total)}"
    return phrase


def _gigabytes(n: int) -> str:
    value = n / 1e9
    return f"{value:.0f} GB" if value >= 10 else f"{value:.1f} GB"
