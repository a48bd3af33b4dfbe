"""`ctl fit`: how many more replicas of a shape (or groups, --group FILE) fit now, and what stops one more.

The `fit` query, or `fitGroup` for a placement group described in a JSON file
as placeGroup's input (PlaceGroupInput).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from service.ctl.client import Client, CtlError
from service.ctl.output import add_output_option, print_json, table

# Where `ctl --help` lists it (after gpus and allocations).
HELP_ORDER = 25

# Nodes listed in the table; --output json has up to the service's page size.
SHOWN_NODES = 20

FIT = """
query Fit($shape: PlaceInput!, $exclude: [ID!], $first: Int) {
  fit(shape: $shape, excludeNodes: $exclude, first: $first) {
    replicas nodes { nodeId shards gpus } nodesOmitted limitedBy { code nodes }
  }
}
"""


def shape_of(args: argparse.Namespace) -> dict[str, Any]:
    """The PlaceInput the flags describe; fit names no replica, so any id place accepts."""
    shape: dict[str, Any] = {
        "replicaId": "ctl-fit",
        "gpuClass": args.gpu_class,
        "shards": args.shards,
        "gpusPerShard": args.gpus_per_shard,
        "nvlinkShards": args.nvlink_shards,
        "sameNvlinkDomain": args.same_nvlink_domain,
        "railAligned": args.rail_aligned,
    }
    optional = {"fabric": args.fabric, "weights": args.weights, "maxAge": args.max_age}
    shape.update({key: value for key, value in optional.items() if value is not None})
    return shape


FIT_GROUP = "query FitGroup($g: PlaceGroupInput!) { fitGroup(group: $g) { groups limitedBy } }"


def group_of(path: str) -> dict[str, Any]:
    """The PlaceGroupInput in a JSON file; groupId may be left out (fitGroup names no group)."""
    try:
        found = json.loads(Path(path).read_text())
    except OSError as error:
        raise CtlError(f"--group {path}: {error.strerror}", "group") from error
    except json.JSONDecodeError as error:
        raise CtlError(f"--group {path}: not JSON ({error})", "group") from error
    if not isinstance(found, dict):
        raise CtlError(f"--group {path}: a JSON object (PlaceGroupInput) is wanted", "group")
    return {"groupId": "ctl-fit", **found}


def fit_group(args: argparse.Namespace, client: Client) -> int:
    found = client.execute(FIT_GROUP, {"g": group_of(args.group)})["fitGroup"]
    if args.output == "json":
        print_json(found)
        return 0
    count = found["groups"]
    print(f"{count} more {'group' if count == 1 else 'groups'} fit now")
    if found["limitedBy"]:
        print()
        print("what stops one more:")
        for line in found["limitedBy"]:
            print(f"  {line}")
    return 0


def fit(args: argparse.Namespace, client: Client) -> int:
    if args.group is not None:
        return fit_group(args, client)
    missing = [
        flag
        for flag, value in (("--class", args.gpu_class), ("--gpus-per-shard", args.gpus_per_shard))
        if value is None
    ]
    if missing:
        raise CtlError(f"{' and '.join(missing)} required (or --group FILE)", missing[0])
    variables = {
        "shape": shape_of(args),
        "exclude": args.exclude or None,
        "first": None if args.output == "json" else SHOWN_NODES,
    }
    found = client.execute(FIT, variables)["fit"]
    if not found["replicas"] and not found["limitedBy"]:
        # No node of the class at all (limitedBy counts the class's nodes): a
        # typo such as H200 for H200-141GB, which "0 more fit" would hide.
        unknown_class(client, args.gpu_class)
    if args.output == "json":
        print_json(found)
        return 0
    shards = "1 shard" if args.shards == 1 else f"{args.shards} shards"
    after = f" after draining {', '.join(args.exclude)}" if args.exclude else ""
    print(
        f"{found['replicas']} more {'replica' if found['replicas'] == 1 else 'replicas'} "
        f"of {shards} of {args.gpus_per_shard} "
        f"{args.gpu_class} fit now{after}"
    )
    if found["nodes"]:
        print()
        rows = [[n["nodeId"], str(n["shards"]), str(n["gpus"])] for n in found["nodes"]]
        print(table(["NODE", "SHARDS", "GPUS"], rows))
        if found["nodesOmitted"]:
            print(f"... and {found['nodesOmitted']} more nodes (--output json lists them)")
    if found["limitedBy"]:
        print()
        print("what stops one more (nodes of the class, by first failed check):")
        print(table(["CHECK", "NODES"], [[c["code"], str(c["nodes"])] for c in found["limitedBy"]]))
    return 0


CLASSES = "{ gpuClasses { gpuClass } }"


def unknown_class(client: Client, gpu_class: str) -> None:
    """Raise CtlError naming the known classes, as place's Unplaceable does, if none is gpu_class."""
    classes = [c["gpuClass"] for c in client.execute(CLASSES)["gpuClasses"]]
    if gpu_class in classes:
        return
    known = f"; classes here: {', '.join(classes)}" if classes else "; no GPUs are registered"
    raise CtlError(f"--class {gpu_class}: no node has {gpu_class} GPUs{known}", "gpuClass")


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "fit",
        help="how many more replicas of a shape (or groups: --group FILE) fit now, and what "
        "stops one more",
    )
    parser.add_argument("--class", dest="gpu_class", help="GPU class, e.g. H100-80GB")
    parser.add_argument("--shards", type=int, default=1, help="shards per replica (default 1)")
    parser.add_argument("--gpus-per-shard", type=int)
    parser.add_argument(
        "--group",
        metavar="FILE",
        help="a placement group (placeGroup's input as JSON): how many more whole groups fit",
    )
    parser.add_argument("--fabric", help="only nodes on this fabric")
    parser.add_argument("--weights", metavar="PATH", help="a weights path the nodes must hold")
    parser.add_argument(
        "--nvlink-shards", action="store_true", help="each shard in one NVLink group"
    )
    parser.add_argument(
        "--same-nvlink-domain", action="store_true", help="every shard in one NVLink domain"
    )
    parser.add_argument(
        "--rail-aligned", action="store_true", help="rail-aligned HCAs on --fabric for each GPU"
    )
    parser.add_argument(
        "--max-age", type=int, metavar="SECONDS", help="only nodes whose GPU facts are this fresh"
    )
    parser.add_argument(
        "--exclude",
        action="append",
        metavar="NODE",
        help="count this node as gone (after draining it); repeatable",
    )
    add_output_option(parser)
    parser.set_defaults(handler=fit)
