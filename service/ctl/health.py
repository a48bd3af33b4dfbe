"""`ctl taints`, `ctl remediations`, `ctl drift`: fleet health as the operator reads it (issue 38).

Each is a table for people (`--output json` for scripts): the taints on nodes
and GPUs, the remediation policy's work and where it stands, and where nodes
differ from their hardware profile.
"""

from __future__ import annotations

import argparse
from typing import Any

from service.ctl.client import Client
from service.ctl.output import DASH, add_output_option, age, print_json, table

# Where `ctl --help` lists them (after groups).
HELP_ORDER = 27

TAINT = "key value effect source reason since"
NODES = f"""
query Taints($first: Int, $after: ID) {{
  nodes(first: $first, after: $after) {{
    id taints {{ {TAINT} }} gpus {{ index taints {{ {TAINT} }} }}
  }}
}}
"""
REMEDIATIONS = """
query Remediations($first: Int, $after: ID, $state: RemediationState, $node: ID) {
  remediations(first: $first, after: $after, state: $state, nodeId: $node) {
    id nodeId gpuIndices action state cause attempts failures since
  }
}
"""
DRIFT = """
query Drift($first: Int, $after: ID) {
  nodes(first: $first, after: $after) {
    id drift { kind expected observed gpuIndices since }
  }
}
"""
STATES = ("PENDING", "IN_PROGRESS", "AWAITING_VALIDATION", "DONE", "ESCALATED", "SUPPRESSED")


def _gpus(indices: list[int] | None) -> str:
    return "node" if indices is None else ",".join(str(i) for i in indices)


def taints(args: argparse.Namespace, client: Client) -> int:
    """Every taint, on a node (GPU `node`) or a GPU, cordons included."""
    found = []
    for n in client.every(NODES, "nodes", "id"):
        found += [{"nodeId": n["id"], "gpu": None, **t} for t in n["taints"]]
        for g in n["gpus"]:
            found += [{"nodeId": n["id"], "gpu": g["index"], **t} for t in g["taints"]]
    if args.node:
        found = [t for t in found if t["nodeId"] == args.node]
    if args.output == "json":
        print_json(found)
        return 0
    if not found:
        print("no taints")
        return 0
    rows = [
        [
            t["nodeId"],
            "node" if t["gpu"] is None else str(t["gpu"]),
            t["key"] if t["value"] is None else f"{t['key']}={t['value']}",
            t["effect"],
            t["source"],
            age(t["since"]),
            t["reason"],
        ]
        for t in found
    ]
    print(table(["NODE", "GPU", "KEY", "EFFECT", "SOURCE", "SINCE", "REASON"], rows))
    return 0


def remediations(args: argparse.Namespace, client: Client) -> int:
    variables = {"state": args.state, "node": args.node}
    found = client.every(REMEDIATIONS, "remediations", "id", variables)
    if args.output == "json":
        print_json(found)
        return 0
    if not found:
        print("no remediations")
        return 0
    rows = [
        [
            r["id"],
            r["nodeId"],
            _gpus(r["gpuIndices"]),
            r["action"],
            r["state"],
            f"{r['failures']}/{r['attempts']}" if r["attempts"] else DASH,
            age(r["since"]),
            r["cause"],
        ]
        for r in found
    ]
    print(table(["ID", "NODE", "GPUS", "ACTION", "STATE", "FAILED", "SINCE", "CAUSE"], rows))
    return 0


def drift(args: argparse.Namespace, client: Client) -> int:
    found = [
        {"nodeId": n["id"], **d} for n in client.every(DRIFT, "nodes", "id") for d in n["drift"]
    ]
    if args.output == "json":
        print_json(found)
        return 0
    if not found:
        print("no drift: every node matches its hardware profile (or has none)")
        return 0
    rows = [
        [d["nodeId"], d["kind"], _gpus(d["gpuIndices"]), d["expected"], d["observed"],
         age(d["since"])]
        for d in found
    ]  # fmt: skip
    print(table(["NODE", "KIND", "GPUS", "EXPECTED", "OBSERVED", "SINCE"], rows))
    return 0


def register(commands: Any) -> None:
    listing = commands.add_parser("taints", help="every taint on nodes and GPUs, cordons included")
    listing.add_argument("--node", help="one node's only")
    add_output_option(listing)
    listing.set_defaults(handler=taints)
    work = commands.add_parser(
        "remediations", help="the remediation policy's work: action, state, validations"
    )
    work.add_argument("--state", choices=STATES, help="only those in this state")
    work.add_argument("--node", help="one node's only")
    add_output_option(work)
    work.set_defaults(handler=remediations)
    differences = commands.add_parser(
        "drift", help="where nodes differ from their hardware profile"
    )
    add_output_option(differences)
    differences.set_defaults(handler=drift)
