"""`ctl groups`: placement groups, their members and the KV path each pair gets (the `groups` and `group` queries)."""

from __future__ import annotations

import argparse
from typing import Any

from service.ctl.client import Client, CtlError
from service.ctl.output import DASH, add_output_option, print_json, table

# Where `ctl --help` lists it (after fit).
HELP_ORDER = 26

GROUP_FIELDS = """
groupId generation
members { role replicaId allocations { shardId nodeId gpuIndices fabric } }
kvPaths { from to kind }
"""
GROUPS = f"query Groups($first: Int, $after: ID) {{ groups(first: $first, after: $after) {{ {GROUP_FIELDS} }} }}"
GROUP = f"query Group($id: ID!) {{ group(groupId: $id) {{ {GROUP_FIELDS} }} }}"


def _where(member: dict[str, Any]) -> tuple[str, str]:
    """(nodes, GPUs) of a member as a person reads them: node:indices per shard."""
    shards = member["allocations"]
    if not shards:
        return DASH, "released"
    nodes = ",".join(dict.fromkeys(a["nodeId"] for a in shards))
    gpus = " ".join(f"{a['nodeId']}:{','.join(str(i) for i in a['gpuIndices'])}" for a in shards)
    return nodes, gpus


def members_table(found: list[dict[str, Any]]) -> str:
    rows = []
    for g in found:
        for m in g["members"]:
            nodes, gpus = _where(m)
            rows.append(
                [g["groupId"], str(g["generation"]), m["role"], m["replicaId"], nodes, gpus]
            )
    return table(["GROUP", "GEN", "ROLE", "REPLICA", "NODES", "GPUS"], rows)


def groups(args: argparse.Namespace, client: Client) -> int:
    if args.group is not None:
        one = client.execute(GROUP, {"id": args.group})["group"]
        if one is None:
            raise CtlError(f"no placement group {args.group!r}", "groupId")
        found = [one]
    else:
        found = client.every(GROUPS, "groups", "groupId")
    if args.output == "json":
        print_json(found if args.group is None else found[0])
        return 0
    if not found:
        print("no placement groups")
        return 0
    print(members_table(found))
    paths = [(g["groupId"], p) for g in found for p in g["kvPaths"]]
    if args.group is not None and paths:
        print()
        print("KV paths (kvFrom -> kvTo):")
        print(table(["FROM", "TO", "PATH"], [[p["from"], p["to"], p["kind"]] for _, p in paths]))
    return 0


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "groups",
        help="placement groups: their members, where each is, and (one group) its KV paths",
    )
    parser.add_argument("group", nargs="?", help="one group's id: also its KV paths")
    add_output_option(parser)
    parser.set_defaults(handler=groups)
