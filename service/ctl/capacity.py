"""`ctl gpus` (capacity per class) and `ctl allocations` (who holds what)."""

from __future__ import annotations

import argparse
from typing import Any

from service.ctl.client import Client
from service.ctl.gpu_verbs import add_verbs
from service.ctl.output import DASH, add_output_option, age, print_json, table

# Where `ctl --help` lists these (after nodes).
HELP_ORDER = 20


GPU_CLASSES = "{ gpuClasses { gpuClass total free allocated unhealthy unschedulable } }"

ALLOCATIONS = """
query Allocations($nodeId: ID, $replicaId: ID, $first: Int, $after: ID, $held: Boolean!) {
  allocations(nodeId: $nodeId, replicaId: $replicaId, first: $first, after: $after, held: $held) {
    shardId replicaId nodeId gpuIndices fabric hcas createdAt fence generation heldSince
  }
}
"""


def gpus(args: argparse.Namespace, client: Client) -> int:
    classes = client.execute(GPU_CLASSES)["gpuClasses"]
    if args.output == "json":
        print_json(classes)
        return 0
    if not classes:
        print("no GPUs registered")
        return 0
    print(
        table(
            ["CLASS", "TOTAL", "FREE", "ALLOCATED", "UNHEALTHY", "UNSCHEDULABLE"],
            [
                [
                    c["gpuClass"],
                    str(c["total"]),
                    str(c["free"]),
                    str(c["allocated"]),
                    str(c["unhealthy"]),
                    str(c.get("unschedulable", DASH)),
                ]
                for c in classes
            ],
        )
    )
    return 0


SHARDS_TO_MOVE = """
query ShardsToMove($nodeId: ID, $first: Int, $after: ID) {
  shardsToMove(nodeId: $nodeId, first: $first, after: $after) {
    shardId stopBy overdue maintenanceWindow taint { key value effect source reason }
    allocation {
      shardId replicaId nodeId gpuIndices fabric hcas createdAt fence generation heldSince
    }
  }
}
"""


def _stale(args: argparse.Namespace, client: Client) -> list[tuple[dict[str, Any], str]]:
    """The stale shards, each with why: held for a LOST node, moved by a NO_EXECUTE taint or a maintenance window."""
    held = client.every(
        ALLOCATIONS,
        "allocations",
        "shardId",
        {"nodeId": args.node, "replicaId": args.replica, "held": True},
    )
    found = [(a, f"held for the lost node since {age(a.get('heldSince'))}") for a in held]
    moved = client.every(SHARDS_TO_MOVE, "shardsToMove", "shardId", {"nodeId": args.node})
    for m in moved:
        a, taint = m["allocation"], m["taint"]
        if args.replica is not None and a["replicaId"] != args.replica:
            continue
        value = f"={taint['value']}" if taint.get("value") else ""
        when = (
            f"stop overdue since {age(m['stopBy'])}" if m["overdue"] else f"stop by {m['stopBy']}"
        )
        by = (
            f"maintenance {m['maintenanceWindow']} asks it to move"
            if m.get("maintenanceWindow")
            else f"taint {taint['key']}{value}:{taint['effect']}"
        )
        found.append((a, f"{by}: {when}"))
    return sorted(found, key=lambda entry: entry[0]["shardId"])


def allocations(args: argparse.Namespace, client: Client) -> int:
    if args.stale:
        stale = _stale(args, client)
        found = [a for a, _ in stale]
        why = [reason for _, reason in stale]
    else:
        found = client.every(
            ALLOCATIONS,
            "allocations",
            "shardId",
            {"nodeId": args.node, "replicaId": args.replica, "held": False},
        )
        why = []
    if args.output == "json":
        print_json(
            [{**a, "stale": reason} for a, reason in zip(found, why, strict=True)]
            if args.stale
            else found
        )
        return 0
    if not found:
        print("no stale allocations" if args.stale else "no allocations")
        return 0
    headers = ["SHARD", "REPLICA", "NODE", "GPUS", "FABRIC", "HCAS", "CREATED", "FENCE", "GEN"]
    print(
        table(
            [*headers, "STALE"] if args.stale else headers,
            [
                [
                    a["shardId"],
                    a["replicaId"],
                    a["nodeId"],
                    ",".join(str(i) for i in a["gpuIndices"]),
                    a.get("fabric") or DASH,
                    ",".join(a.get("hcas") or []) or DASH,
                    age(a.get("createdAt")),
                    str(a["fence"]),
                    str(a["generation"]),
                    *([why[k]] if args.stale else []),
                ]
                for k, a in enumerate(found)
            ],
        )
    )
    return 0


def register(commands: Any) -> None:
    summary = commands.add_parser(
        "gpus",
        help="GPUs per class (total, free, allocated, unhealthy); cordon|uncordon|clear-health one",
    )
    add_output_option(summary)
    summary.set_defaults(handler=gpus)
    add_verbs(summary)

    held = commands.add_parser(
        "allocations",
        help="shards of replicas and the GPUs they hold",
        description="Shards of replicas and the GPUs they hold.",
        epilog=(
            "FENCE is the shard's fencing token: start its engine with it; a later placement "
            "on the same GPUs always carries a larger one. GEN is the replica's generation, "
            "moved by every change of its shards: releaseReplica(generation: GEN) releases "
            "only the replica as read (docs/operations/fencing.md)."
        ),
    )
    held.add_argument("--node", help="only shards on this node")
    held.add_argument("--replica", help="only this replica's shards")
    held.add_argument(
        "--stale",
        action="store_true",
        help=(
            "only stale shards, and why: held for a LOST node (INVENTORY_LOST_POLICY=hold: their "
            "GPUs stay allocated until the node confirms them or `freeHeldShards` frees them), "
            "or told to stop by a NO_EXECUTE taint (the scheduler replaces and releases them)"
        ),
    )
    add_output_option(held)
    held.set_defaults(handler=allocations)
