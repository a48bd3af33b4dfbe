"""`ctl nodes`, `ctl node ID`, and the operator's verbs: cordon, drain, uncordon, remove."""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

from service.ctl.client import Client, CtlError
from service.ctl.gpu_verbs import marks_text
from service.ctl.output import (
    DASH,
    add_output_option,
    age,
    free_of_total,
    human_bytes,
    print_json,
    table,
)

# Where `ctl --help` lists these (the operator's first question).
HELP_ORDER = 10


NODES = """
query Nodes($first: Int, $after: ID) {
  nodes(first: $first, after: $after) {
    id state stateReason lastSeen incarnation
    localDisk { freeBytes totalBytes }
    fabrics { fabric }
    gpus { index gpuClass cordonReason stickyReasons }
    freeGpus { gpuClass }
    nvlinkGroups largestFreeNvlinkGroup
  }
}
"""

NODE = """
query Node($id: ID!) {
  node(id: $id) {
    id hostname mgmtAddr state stateReason stateChangedBy lastSeen registeredAt memoryTotalMb
    incarnation
    agentVersion labels { key value } engineVersions { key value }
    localDisk { freeBytes totalBytes } sharedDisk { freeBytes totalBytes }
    fabrics { fabric hcas rateGbps }
    gpus {
      index gpuClass name healthy healthReasons stickyReasons cordonReason
      allocation { shardId replicaId }
    }
    storage { id mountPoint fsType shared freeBytes totalBytes directories }
    weights { path state sizeBytes totalBytes pinnedBy }
    knowsItsWeights
    nvlinkGroups largestFreeNvlinkGroup
  }
}
"""

VERB_RESULT = "id state stateReason"


def fetch_nodes(client: Client) -> list[dict[str, Any]]:
    """Every node."""
    return client.every(NODES, "nodes", "id")


def state_text(node: dict[str, Any]) -> str:
    state = str(node["state"]).lower()
    reason = node.get("stateReason")
    return f"{state} ({reason})" if reason else state


def gpu_counts(node: dict[str, Any]) -> str:
    """'H100-80GB 4/8': free out of total, per class.

    Free as the service says (Node.freeGpus): the rule has one home, service/scheduling/availability.py.
    """
    total: dict[str, int] = defaultdict(int)
    free: dict[str, int] = defaultdict(int)
    for gpu in node.get("gpus") or []:
        total[gpu["gpuClass"]] += 1
    for gpu in node.get("freeGpus") or []:
        free[gpu["gpuClass"]] += 1
    if not total:
        return DASH
    return ", ".join(f"{cls} {free[cls]}/{total[cls]}" for cls in sorted(total))


def nodes_table(nodes: list[dict[str, Any]]) -> str:
    rows = [
        [
            n["id"],
            state_text(n),
            gpu_counts(n),
            marks_text(n.get("gpus") or []),
            ",".join(f["fabric"] for f in n.get("fabrics") or []) or DASH,
            free_of_total(n.get("localDisk")),
            age(n.get("lastSeen")),
            str(n.get("incarnation", DASH)),
            nvlink_text(n),
        ]
        for n in nodes
    ]
    headers = ["NODE", "STATE", "GPUS FREE/TOTAL", "GPUS MARKED", "FABRICS", "LOCAL DISK"]
    # INCARNATION: one more each time the node came back from LOST or rebooted.
    return table([*headers, "LAST SEEN", "INCARNATION", "NVLINK"], rows)


def nvlink_text(node: dict[str, Any]) -> str:
    """'NVLink 4x2, largest free 4': the node's groups and the widest shard it can take now."""
    groups = node.get("nvlinkGroups") or "unknown"
    largest = node.get("largestFreeNvlinkGroup")
    return groups if largest is None else f"{groups}, largest free {largest}"


def list_nodes(args: argparse.Namespace, client: Client) -> int:
    nodes = fetch_nodes(client)
    if args.output == "json":
        print_json(nodes)
    elif nodes:
        print(nodes_table(nodes))
    else:
        print("no nodes registered")
    return 0


def _pairs(items: list[dict[str, str]] | None) -> str:
    return ", ".join(f"{kv['key']}={kv['value']}" for kv in items or []) or DASH


def node_details(node: dict[str, Any]) -> str:
    lines = [
        f"node:        {node['id']} ({node['hostname']}, {node['mgmtAddr']})",
        f"state:       {state_text(node)}"
        + (f" by {node['stateChangedBy']}" if node.get("stateChangedBy") else ""),
        f"last seen:   {age(node.get('lastSeen'))}",
        f"incarnation: {node.get('incarnation', DASH)}",
        f"memory:      {node['memoryTotalMb']} MiB"
        if node.get("memoryTotalMb") is not None
        else f"memory:      {DASH}",
        f"local disk:  {free_of_total(node.get('localDisk'))}",
        f"shared disk: {free_of_total(node.get('sharedDisk'))}",
        f"labels:      {_pairs(node.get('labels'))}",
        f"nvlink:      {nvlink_text(node)}",
        f"agent:       {node.get('agentVersion') or DASH}; engines: "
        f"{_pairs(node.get('engineVersions'))}",
        "",
    ]
    gpu_rows = []
    for gpu in node.get("gpus") or []:
        held = gpu.get("allocation")
        gpu_rows.append(
            [
                str(gpu["index"]),
                gpu["gpuClass"],
                "ok" if gpu["healthy"] else ", ".join(gpu["healthReasons"]) or "unhealthy",
                ", ".join(gpu.get("stickyReasons") or []) or DASH,
                gpu.get("cordonReason") or DASH,
                f"{held['shardId']} (replica {held['replicaId']})" if held else DASH,
            ]
        )
    headers = ["GPU", "CLASS", "HEALTH", "UNTIL RESET", "CORDONED", "HELD BY"]
    lines.append(table(headers, gpu_rows) if gpu_rows else "no GPUs")
    fabrics = node.get("fabrics") or []
    if fabrics:
        lines.append("")
        lines.append(
            table(
                ["FABRIC", "HCAS", "RATE"],
                [[f["fabric"], ",".join(f["hcas"]), f"{f['rateGbps']} Gb/s"] for f in fabrics],
            )
        )
    storage = node.get("storage") or []
    lines.append("")
    if storage:
        lines.append(
            table(
                ["FILESYSTEM", "MOUNT", "TYPE", "SHARED", "FREE / TOTAL", "DIRECTORIES"],
                [
                    [
                        fs["id"],
                        fs["mountPoint"],
                        fs.get("fsType") or DASH,
                        "yes" if fs["shared"] else "no",
                        free_of_total(fs),
                        ",".join(fs["directories"]) or DASH,
                    ]
                    for fs in storage
                ],
            )
        )
    else:
        lines.append("storage: not reported (unknown, not empty)")
    weights = node.get("weights") or []
    lines.append("")
    if weights:
        lines.append(
            table(
                ["WEIGHTS", "STATE", "SIZE", "PINNED BY"],
                [
                    [
                        w["path"],
                        (w.get("state") or "unknown").lower(),
                        human_bytes(w.get("sizeBytes")),
                        ",".join(w.get("pinnedBy") or []) or DASH,
                    ]
                    for w in weights
                ],
            )
        )
    elif node.get("knowsItsWeights"):
        lines.append("weights: none")
    else:
        lines.append("weights: not asked to look")
    return "\n".join(lines)


def show_node(args: argparse.Namespace, client: Client) -> int:
    node = client.execute(NODE, {"id": args.id})["node"]
    if node is None:
        raise CtlError(f"node {args.id!r} is not registered")
    if args.output == "json":
        print_json(node)
    else:
        print(node_details(node))
    return 0


def _verb(mutation: str, past: str, with_reason: bool) -> Any:
    def run(args: argparse.Namespace, client: Client) -> int:
        arguments: dict[str, tuple[str, Any]] = {"id": ("ID!", args.id)}
        if with_reason:
            arguments["reason"] = ("String!", args.reason)
        node = client.mutate(mutation, arguments, VERB_RESULT)
        print(f"node {node['id']} {past}: now {state_text(node)}")
        return 0

    return run


def remove(args: argparse.Namespace, client: Client) -> int:
    removed = client.execute("mutation Remove($id: ID!) { removeNode(id: $id) }", {"id": args.id})
    if not removed["removeNode"]:
        raise CtlError(f"node {args.id!r} is not registered")
    print(f"node {args.id} removed, with its allocations")
    return 0


def register(commands: Any) -> None:
    listing = commands.add_parser("nodes", help="every node: state, free GPUs, disk, last seen")
    add_output_option(listing)
    listing.set_defaults(handler=list_nodes)

    details = commands.add_parser("node", help="one node: GPUs and their holders, storage, weights")
    details.add_argument("id")
    add_output_option(details)
    details.set_defaults(handler=show_node)

    for name, mutation, past, help_text in (
        ("cordon", "cordonNode", "cordoned", "exclude from new placement; what runs keeps running"),
        ("drain", "drainNode", "draining", "mark its replicas for moving off"),
    ):
        verb = commands.add_parser(name, help=help_text)
        verb.add_argument("id")
        verb.add_argument("--reason", required=True, help="why, for the next operator to read")
        verb.set_defaults(handler=_verb(mutation, past, with_reason=True))

    uncordon = commands.add_parser("uncordon", help="accept placement again")
    uncordon.add_argument("id")
    uncordon.set_defaults(handler=_verb("uncordonNode", "uncordoned", with_reason=False))

    removal = commands.add_parser("remove", help="forget a node and its allocations")
    removal.add_argument("id")
    removal.set_defaults(handler=remove)
