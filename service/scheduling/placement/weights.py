"""Placement's weights rule, in SQL: which nodes a request with `weights` may use, and in what order.

The readiness predicate and the rank are service/scheduling/weights_lifecycle.py's;
this module places them in the candidate windows (statements.py), and judge()
(service/scheduling/verdicts.py) re-checks every row with the same rule in
Python, so the window and the verdicts cannot drift apart.

- weightsReady: only nodes whose copy of the path is READY; nodes that did
  not report weights are out too (nothing says their copy is ready).
- Otherwise: READY, then present with no state, then DOWNLOADING, then the
  rest (weights_lifecycle.rank); nodes that reported weights without this
  path are out (NO_WEIGHTS), nodes that did not look are kept, ranked last.
"""

from __future__ import annotations

from service.scheduling.place_request import PlaceRequest
from service.scheduling.weights_lifecycle import weights_rank, weights_ready

# The columns every window row carries about the node's copy of the path:
# its rank (lower is better) and its facts for judge() (NodeFacts.weights_copy).
NO_COPY = "3 AS weights_rank, CAST(NULL AS json) AS weights_copy"


def _copy(alias: str) -> str:
    """SQL json: the weights row `alias` as judge() reads a node's copy (verdicts.WeightsCopy.of)."""
    return (
        f"json_build_object('state', {alias}.state, 'size', {alias}.size_bytes,"
        f" 'total', {alias}.total_bytes)"
    )


def _row_of(node: str) -> str:
    """SQL FROM ... WHERE: node id `node`'s weights row `w` for :weights."""
    return f"FROM weights w WHERE w.node_id = {node} AND w.path = :weights"


def copy_columns(alias: str) -> str:
    """The window columns of a node whose weights row for the path is `alias`."""
    return f"{weights_rank(alias)} AS weights_rank, {_copy(alias)} AS weights_copy"


def holds(node: str) -> str:
    """SQL: whether node id `node` reported a copy of :weights (any state; false without :weights)."""
    return f"(CAST(:weights AS text) IS NOT NULL AND EXISTS (SELECT 1 {_row_of(node)}))"


def copy_of(node: str) -> str:
    """SQL: the weights_copy column of node id `node` for :weights (NULL without a row)."""
    return f"(SELECT {_copy('w')} {_row_of(node)})"


def holder_filter(request: PlaceRequest) -> str:
    """SQL over the weights row `w`: the holders the request may use."""
    return weights_ready("w") if request.weights_ready else "true"


def others_allowed(request: PlaceRequest) -> bool:
    """Whether nodes that reported no weights may take a request naming weights."""
    return not request.weights_ready
