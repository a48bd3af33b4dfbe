"""Order among candidates that every check passes: the one home of the ranking.

Every planner that chooses between nodes that can all take a shard (place's
one-node window in SQL, the multi-node plan, fit's counts, placeGroup's
members) orders them by this key and nothing else, so that the same cluster
gives the same plan and fit counts what place does. Its terms, in order:

0. last resort (issue 38): a node that needs GPUs a PREFER_NO_SCHEDULE taint
   sends last (one the request does not tolerate) for the GPUs it would give
   (taints.last_resort_term) goes after every node that does not, whatever
   its fit: such GPUs are used last;
1. the node's copy of the weights (weights_lifecycle.rank: READY holders first);
2. free GPUs of the class, fewest first: packing, so small holes get filled and
   large ones stay open for large replicas;
3. flexibility, least first: how many fabrics the node is on. A node on one
   fabric is spent before a node on two, which can later join a spread on
   either side. Without this term, four free 8-GPU nodes (one on ib-a and
   ib-b, two on ib-a, one on ib-b) took a 2 x 8 replica on the two-fabric node
   and an ib-a one 75% of the time, stranding the other two (issue 39): one
   replica placed where two fit. Placement groups pack the zones they
   choose (NVLink domains, label values) by the same idea;
4. the node id, so that nothing random decides a plan or a count. Placement
   groups hand the planner each node under a planning id (its class's
   digest, then its id: service/scheduling/groups/board.py), so that among
   nodes equal on every term they take classes in a fixed order, which lets
   fitGroup count many identical rounds at once.

The SQL form (`order_sql`) orders place's one-node window the same way, with
a random draw after these terms among nodes still equal: concurrent callers
of one shape then spread over equal nodes instead of queueing on the first.
Which of two fully equal nodes takes a one-node replica changes no count
(each node's room decides how many it takes), so fit stays exact.
"""

from __future__ import annotations

from service.scheduling.place_request import PlaceRequest
from service.scheduling.taints import last_resort_term
from service.scheduling.verdicts import NodeFacts


def flexibility(f: NodeFacts) -> int:
    """How many ways the node can still be combined: the fabrics it is on."""
    return len(f.fabrics)


def node_rank(
    f: NodeFacts, request: PlaceRequest, need: int | None = None
) -> tuple[int, int, int, int, str]:
    """The ranking as a sort key (lowest first) for a node that can take the request.

    `need`: the GPUs the node would give (the whole replica's, or a shard's
    in a spread; a shard's when not said), for the last-resort term.
    """
    weights = f.weights_rank if request.weights is not None else 0
    last = last_resort_term(f.free, f.last_resort, need or request.gpus_per_shard)
    return (last, weights, f.free, flexibility(f), f.node_id)


def flexibility_sql(node_id: str) -> str:
    """SQL: flexibility() of node id `node_id` (a count on fabric_attachments' primary key)."""
    return f"(SELECT count(*) FROM fabric_attachments fa WHERE fa.node_id = {node_id})"


def order_sql(c: str) -> str:
    """SQL ORDER BY terms over a window row `c` with last_resort_term, weights_rank, free and flexibility.

    node_rank's terms (last_resort_term is taints.last_resort_term_sql's, for
    the window's :need), then `c.tiebreak` (random() in the window) among equals.
    """
    return f"{c}.last_resort_term, {c}.weights_rank, {c}.free, {c}.flexibility, {c}.tiebreak"
