"""place(): the service picks the GPUs for a replica and holds them in the same transaction.

How it packs: a replica goes on one node when one node has room for all its
shards, choosing the node that will be left with the fewest free GPUs (small
holes get filled, large holes stay open for large replicas). Otherwise its
shards spread over nodes of one fabric, smallest holes first, never splitting
a shard. Nodes that already hold the weights come before all others, and
among nodes equal so far the least flexible (on the fewest fabrics) is spent
first: service/scheduling/ranking.py is the one ranking. A multi-node plan is
deterministic; a one-node window draws at random among nodes equal on every
term, so a crowd of schedulers asking for the same class does not all queue
on the same first node.

How it stays correct under concurrency: candidates are read from gpu_pools
(indexed by class; every check is in the SQL, so a one-node placement reads
a small window of the best nodes however large the cluster). The common case,
every shard on one node, is two statements: one checks the replica id, reads
the window and locks its best node that nobody else holds (FOR NO KEY UPDATE
SKIP LOCKED, LIMIT 1); the next, started under that lock, recounts the node's
free GPUs and holds them with the pools and events (allocations.
store_statement). A multi-node placement locks its planned nodes with SKIP
LOCKED and goes through allocate()'s checks. Both run inside a savepoint, so
a node found full or busy is let go at once.
"Unplaceable" is only said after a plan fails on committed data with no
candidate skipped: when candidates were busy, place() waits for their holders
to finish and looks again, so N concurrent calls on room for K replicas
place exactly K.

The package, by idea: plan.py (where shards would go, pure), statements.py
(the SQL and the candidate reads), claims.py (place() and its
transactions), several.py (a batch's calls of one shape claimed together),
explanation.py (verdicts, unplaceable and explain()).
"""

from service.scheduling.placement.claims import (
    claim_calls,
    place,
    place_without_waiting,
)
from service.scheduling.placement.explanation import Explanation, Unplaceable, explain, unplaceable
from service.scheduling.placement.plan import (
    MAX_REPLICA_ID_LENGTH,
    Plan,
    plan_placement,
    same_shape,
    shard_ids,
    validate_place,
)
from service.scheduling.placement.several import place_several_without_waiting
from service.scheduling.placement.statements import candidates, spread_plan

__all__ = [
    "MAX_REPLICA_ID_LENGTH",
    "Explanation",
    "Plan",
    "Unplaceable",
    "candidates",
    "claim_calls",
    "explain",
    "place",
    "place_several_without_waiting",
    "place_without_waiting",
    "plan_placement",
    "same_shape",
    "shard_ids",
    "spread_plan",
    "unplaceable",
    "validate_place",
]
