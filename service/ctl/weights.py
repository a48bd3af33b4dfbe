"""`ctl weights`: every node's weights with their state, size and the replicas that pin them.

`ctl weights --evictable NODE` lists what an eviction tool may delete on one
node (Query.weightsEvictable): the weights no replica pins.
"""

from __future__ import annotations

import argparse
from typing import Any

from service.ctl.client import Client
from service.ctl.output import DASH, add_output_option, human_bytes, print_json, table

HELP_ORDER = 25


WEIGHTS = """
query Weights($first: Int, $after: ID) {
  nodes(first: $first, after: $after) {
    id
    weights { path revision state sizeBytes totalBytes observedAt pinnedBy }
  }
}
"""

EVICTABLE = """
query Evictable($nodeId: ID!) {
  weightsEvictable(nodeId: $nodeId) { path state sizeBytes }
}
"""


def _fetch(client: Client) -> list[dict[str, Any]]:
    """Every node with its weights."""
    return client.every(WEIGHTS, "nodes", "id")


def size_text(w: dict[str, Any]) -> str:
    """'41.0 GB of 100.0 GB (41%)' while incomplete; '140.0 GB' when whole or the total is unknown."""
    size, total = w.get("sizeBytes"), w.get("totalBytes")
    if size is None or not total or size == total:
        return human_bytes(size if size is not None else total)
    return f"{human_bytes(size)} of {human_bytes(total)} ({int(100 * size / total)}%)"


def weights_table(nodes: list[dict[str, Any]]) -> str:
    rows = [
        [
            n["id"],
            w["path"],
            (w.get("state") or "unknown").lower(),
            size_text(w),
            ",".join(w.get("pinnedBy") or []) or DASH,
        ]
        for n in nodes
        for w in n.get("weights") or []
    ]
    return table(["NODE", "PATH", "STATE", "SIZE", "PINNED BY"], rows)


def list_weights(args: argparse.Namespace, client: Client) -> int:
    if args.evictable is not None:
        found = client.execute(EVICTABLE, {"nodeId": args.evictable})["weightsEvictable"]
        if args.output == "json":
            print_json(found)
        else:
            rows = [[w["path"], (w.get("state") or "unknown").lower(), size_text(w)] for w in found]
            print(table(["PATH", "STATE", "SIZE"], rows))
        return 0
    nodes = _fetch(client)
    if args.node is not None:
        nodes = [n for n in nodes if n["id"] == args.node]
    if args.output == "json":
        print_json(nodes)
    else:
        print(weights_table(nodes))
    return 0


def register(commands: Any) -> None:
    weights = commands.add_parser(
        "weights", help="every node's weights: path, state, size, pinned by"
    )
    weights.add_argument("--node", help="only this node")
    weights.add_argument(
        "--evictable", metavar="NODE", help="what an eviction tool may delete on NODE (unpinned)"
    )
    add_output_option(weights)
    weights.set_defaults(handler=list_weights)
