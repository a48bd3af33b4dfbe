"""`ctl maintenance schedule|list|cancel`: an operator books, reads and cancels maintenance windows.

    llmgw-inventory ctl maintenance schedule rack-7-fw --nodes hgx-70,hgx-71 \\
        --start 2026-12-12T02:00Z --end 2026-12-12T06:00Z --drain-lead 2h \\
        --reason "rack 7 firmware 1.2"
    llmgw-inventory ctl maintenance list [--state DRAINING]
    llmgw-inventory ctl maintenance cancel rack-7-fw

A refused booking prints the service's one line (the field and the value),
and exits non-zero. docs/operations/maintenance.md walks a rack upgrade.
"""

from __future__ import annotations

import argparse
from typing import Any

from service.ctl.client import Client
from service.ctl.output import add_output_option, print_json, table
from service.ctl.times import EXAMPLES, from_now, seconds

HELP_ORDER = 28

FIELDS = "id nodeIds start end reason state replicasLeft"
SCHEDULE = f"""
mutation Schedule($input: MaintenanceInput!) {{ scheduleMaintenance(input: $input) {{ {FIELDS} }} }}
"""
LIST = f"""
query Windows($state: MaintenanceState, $first: Int, $after: ID) {{
  maintenanceWindows(state: $state, first: $first, after: $after) {{ {FIELDS} }}
}}
"""
CANCEL = f"mutation Cancel($id: ID!) {{ cancelMaintenance(id: $id) {{ {FIELDS} }} }}"


def windows_table(found: list[dict[str, Any]]) -> str:
    rows = [
        [
            w["id"],
            w["state"],
            w["start"],
            w["end"],
            str(w["replicasLeft"]),
            ",".join(w["nodeIds"]),
            w["reason"],
        ]
        for w in found
    ]
    return table(["WINDOW", "STATE", "START", "END", "LEFT", "NODES", "REASON"], rows)


def _show(found: list[dict[str, Any]], output: str) -> int:
    if output == "json":
        print_json(found)
    elif not found:
        print("no maintenance windows")
    else:
        print(windows_table(found))
    return 0


def schedule_window(args: argparse.Namespace, client: Client) -> int:
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    spec = {
        "id": args.id,
        "nodeIds": nodes,
        "start": args.start.isoformat(),
        "end": args.end.isoformat(),
        "reason": args.reason,
        "drainLead": args.drain_lead,
    }
    window = client.execute(SCHEDULE, {"input": spec})["scheduleMaintenance"]
    return _show([window], args.output)


def list_windows(args: argparse.Namespace, client: Client) -> int:
    variables = {"state": args.state} if args.state else {}
    return _show(client.every(LIST, "maintenanceWindows", "id", variables), args.output)


def cancel_window(args: argparse.Namespace, client: Client) -> int:
    window = client.execute(CANCEL, {"id": args.id})["cancelMaintenance"]
    return _show([window], args.output)


def register(commands: Any) -> None:
    maintenance = commands.add_parser(
        "maintenance", help="maintenance windows: schedule, list, cancel"
    )
    sub = maintenance.add_subparsers(dest="maintenance_command", required=True)

    book = sub.add_parser("schedule", help="book a window on some nodes")
    book.add_argument("id", help="the window's id (re-sending the same booking is harmless)")
    book.add_argument("--nodes", required=True, help="node ids, comma-separated")
    book.add_argument("--start", required=True, type=from_now("--start"), help=EXAMPLES)
    book.add_argument("--end", required=True, type=from_now("--end"), help=EXAMPLES)
    book.add_argument("--reason", required=True, help="why, for the next operator to read")
    book.add_argument(
        "--drain-lead",
        type=seconds,
        default=3600,
        help="how long before start replicas are asked to move (e.g. 2h; default 1h)",
    )
    add_output_option(book)
    book.set_defaults(handler=schedule_window)

    listing = sub.add_parser("list", help="the windows, by id")
    listing.add_argument(
        "--state", choices=["SCHEDULED", "DRAINING", "IN_PROGRESS", "DONE", "CANCELLED"]
    )
    add_output_option(listing)
    listing.set_defaults(handler=list_windows)

    cancel = sub.add_parser("cancel", help="cancel a window: undo what has not happened")
    cancel.add_argument("id")
    add_output_option(cancel)
    cancel.set_defaults(handler=cancel_window)
