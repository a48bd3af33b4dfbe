"""`ctl reservations`: the reservations, their windows, states and what each sets aside.

    ID          TENANT   STATE     START                 END                   GPUS  USED  MISSING
    v2-rollout  rollout  ACTIVE    2027-03-01T14:00:00Z  2027-03-01T16:00:00Z  16    1/2   0

GPUS is how many GPUs it sets aside now, USED the replicas placed into it of
its `count`, MISSING the GPUs it could not replace (DEGRADED when > 0).
`--release ID` ends one now (releaseReservation).
"""

from __future__ import annotations

import argparse
from typing import Any

from service.ctl.client import Client
from service.ctl.output import DASH, add_output_option, print_json, table

# Where `ctl --help` lists it (after tenants).
HELP_ORDER = 28

FIELDS = """
id tenant count start end state gpus { nodeId gpuIndices } used missingGpus
releaseIfUnusedAfter reason
"""
RESERVATIONS = f"""
query Reservations($tenant: ID, $state: ReservationState) {{
  reservations(tenant: $tenant, state: $state) {{ {FIELDS} }}
}}
"""
RELEASE = f"mutation Release($id: ID!) {{ releaseReservation(id: $id) {{ {FIELDS} }} }}"
STATES = ("SCHEDULED", "ACTIVE", "DEGRADED", "ENDED")


def reservations_table(found: list[dict[str, Any]]) -> str:
    rows = [
        [
            r["id"],
            r["tenant"],
            r["state"],
            r["start"],
            r["end"] or "until released",
            str(sum(len(g["gpuIndices"]) for g in r["gpus"])),
            f"{r['used']}/{r['count']}",
            str(r["missingGpus"]),
            r["reason"] or DASH,
        ]
        for r in found
    ]
    headers = ["ID", "TENANT", "STATE", "START", "END", "GPUS", "USED", "MISSING", "REASON"]
    return table(headers, rows)


def show_reservations(args: argparse.Namespace, client: Client) -> int:
    if args.release is not None:
        found = [client.execute(RELEASE, {"id": args.release})["releaseReservation"]]
    else:
        variables = {"tenant": args.tenant, "state": args.state}
        found = client.execute(RESERVATIONS, variables)["reservations"]
    if args.output == "json":
        print_json(found)
        return 0
    if not found:
        print("no reservations")
        return 0
    print(reservations_table(found))
    return 0


def register(commands: Any) -> None:
    reservations = commands.add_parser(
        "reservations",
        help="reservations: windows, states, the GPUs each sets aside (--release ID ends one)",
    )
    reservations.add_argument("--tenant", help="one tenant's reservations")
    reservations.add_argument("--state", type=str.upper, choices=STATES, help="a state")
    reservations.add_argument("--release", metavar="ID", help="end this reservation now")
    add_output_option(reservations)
    reservations.set_defaults(handler=show_reservations)
