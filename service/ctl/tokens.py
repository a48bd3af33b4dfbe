"""`ctl tokens create|list|revoke`: token admin, as an operator (or on a fresh loopback service).

`create` prints the secret as the LAST line of its output, alone, so a script
can take it with `| tail -n 1`; it is never shown again.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from service.ctl import times
from service.ctl.client import Client, CtlError, flag_error
from service.ctl.output import DASH, add_output_option, age, print_json, table

ROLES = ("reader", "agent", "scheduler", "operator")

CREATE = """
mutation CreateToken(
  $role: Role!, $nodeId: ID, $description: String, $expiresAt: DateTime, $tenant: ID
) {
  createToken(
    role: $role, nodeId: $nodeId, description: $description, expiresAt: $expiresAt,
    tenant: $tenant
  ) {
    secret
    warning
    token { id role nodeId description createdAt expiresAt tenant }
  }
}
"""

# The API's argument -> the flag an operator typed, for errors.
FLAGS = {
    "role": "--role",
    "nodeId": "--node",
    "description": "--description",
    "expiresAt": "--expires",
    "tenant": "--tenant",
}

LIST = """
query Tokens($includeRevoked: Boolean!, $first: Int, $after: ID) {
  tokens(includeRevoked: $includeRevoked, first: $first, after: $after) {
    id role nodeId description createdAt revokedAt expiresAt status
  }
}
"""

REVOKE = "mutation Revoke($id: ID!) { revokeToken(id: $id) { id revokedAt } }"


def create_token(args: argparse.Namespace, client: Client) -> int:
    variables = {
        "role": args.role.upper(),
        "nodeId": args.node,
        "description": args.description,
        "expiresAt": args.expires.isoformat() if args.expires is not None else None,
        "tenant": args.tenant,
    }
    try:
        data = client.execute(CREATE, variables)["createToken"]
    except CtlError as error:
        raise flag_error(error, FLAGS) from None
    token = data["token"]
    bound = f" for node {token['nodeId']}" if token.get("nodeId") else ""
    if token.get("tenant"):
        bound += f" for tenant {token['tenant']}"
    until = f", expires {_utc(token['expiresAt'])}" if token.get("expiresAt") else ""
    print(f"created {token['role'].lower()} token {token['id']}{bound}{until}")
    if data.get("warning"):
        # On stderr: the secret stays the last line of stdout for `| tail -n 1`.
        print(f"warning: {data['warning']}", file=sys.stderr)
    print("the secret below is shown once; send it as 'Authorization: Bearer <secret>'")
    print(data["secret"])
    return 0


def list_tokens(args: argparse.Namespace, client: Client) -> int:
    # Page by page: one agent token per node makes this list long.
    found = client.every(LIST, "tokens", "id", {"includeRevoked": args.all})
    if args.output == "json":
        print_json(found)
        return 0
    rows = [
        [
            t["id"],
            t["role"].lower(),
            t["status"].lower(),
            t.get("nodeId") or DASH,
            age(t["createdAt"]),
            _utc(t["expiresAt"]) if t.get("expiresAt") else DASH,
            age(t["revokedAt"]) if t.get("revokedAt") else DASH,
            t.get("description") or DASH,
        ]
        for t in found
    ]
    headers = ["ID", "ROLE", "STATUS", "NODE", "CREATED", "EXPIRES", "REVOKED", "DESCRIPTION"]
    print(table(headers, rows))
    return 0


def _utc(value: str) -> str:
    return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def revoke_token(args: argparse.Namespace, client: Client) -> int:
    client.execute(REVOKE, {"id": args.id})
    print(f"token {args.id} revoked; the service refuses it from the next request on")
    return 0


def register(commands: Any) -> None:
    tokens = commands.add_parser("tokens", help="create, list and revoke API tokens")
    sub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")

    create = sub.add_parser("create", help="a new token; prints its secret as the last line")
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--node", help="the one node an agent token may report for (agent only)")
    create.add_argument("--description", help="who or what holds it, e.g. 'scheduler-a'")
    create.add_argument(
        "--tenant", help="the one tenant a scheduler token places as (scheduler only)"
    )
    create.add_argument(
        "--expires",
        type=times.expires,
        metavar="WHEN",
        help="refuse it from then on: 30d, 12h, 2w from now, or a date or time "
        "(2027-01-31, midnight UTC); default: never",
    )
    create.set_defaults(handler=create_token)

    listing = sub.add_parser(
        "list", help="active and expired tokens, with their status (--all: revoked ones too)"
    )
    listing.add_argument("--all", action="store_true", help="include revoked tokens")
    add_output_option(listing)
    listing.set_defaults(handler=list_tokens)

    revoke = sub.add_parser("revoke", help="stop accepting a token")
    revoke.add_argument("id")
    revoke.set_defaults(handler=revoke_token)
