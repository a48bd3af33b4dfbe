"""`llmgw-inventory ctl ...`: the operator's view of the cluster, over the service's GraphQL API.

The ctl package is a GraphQL client and nothing else: it never imports the
service's database code, so it runs on an operator's laptop against any
service process and sees exactly what a scheduler would see.

Adding a subcommand module (e.g. `ctl tokens create|list|revoke`):

1. Create `service/ctl/<name>.py` with a module-level function

       def register(commands: Commands) -> None:
           tokens = commands.add_parser("tokens", help="...")
           sub = tokens.add_subparsers(dest="tokens_command", required=True)
           create = sub.add_parser("create", help="...")
           create.add_argument("--role", required=True)
           create.set_defaults(handler=create_token)

   where every leaf parser sets `handler`, a function
   `(args: argparse.Namespace, client: Client) -> int` returning the exit code.
2. That's all: every public module in this package that defines `register` is
   discovered and registered (no shared list to edit, so two engineers adding
   subcommands never touch the same line). `--help` lists them by the
   module's optional `HELP_ORDER` (default 50), then by module name.

A handler talks to the service with `client.execute(query, variables)`
(service/ctl/client.py), which returns `data` or raises CtlError with one line
for the operator; the runner below prints that line and exits non-zero. Print
results with the helpers in service/ctl/output.py (tables, `--output json`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from typing import Any

from service.ctl.client import DEFAULT_URL, Client, CtlError

# argparse's subparsers action; private in typeshed, public in practice.
Commands = Any

__all__ = [
    "DEFAULT_URL",
    "Client",
    "Commands",
    "CtlError",
    "add_connection_options",
    "add_ctl_parser",
    "connect",
]


def _subcommand_modules() -> list[Any]:
    modules = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if callable(getattr(module, "register", None)):
            modules.append(module)
    return sorted(modules, key=lambda m: (getattr(m, "HELP_ORDER", 50), m.__name__))


def add_ctl_parser(subparsers: Commands) -> argparse.ArgumentParser:
    """Add `ctl` and every discovered subcommand to the top-level CLI."""
    ctl: argparse.ArgumentParser = subparsers.add_parser(
        "ctl",
        help="operate the cluster through a running service (GraphQL over HTTP)",
        description="Operate the cluster through a running service's GraphQL API.",
    )
    add_connection_options(ctl, default=None)
    commands = ctl.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")
    for module in _subcommand_modules():
        module.register(commands)
    # `ctl nodes --url X` as well as `ctl --url X nodes`: operators append
    # flags to the command they just ran. Below `ctl` the options default to
    # SUPPRESS, so a subcommand that does not repeat them keeps ctl's value.
    for parser in _parsers_below(ctl):
        add_connection_options(parser, default=argparse.SUPPRESS)
    ctl.set_defaults(run=run_ctl)
    return ctl


def add_connection_options(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """--url, --token and --timeout, as ctl and `llmgw-inventory demo` take them."""
    group = parser.add_argument_group("connection (accepted before or after the command)")
    group.add_argument(
        "--url",
        default=default,
        help=f"the service's GraphQL endpoint (INVENTORY_URL, default {DEFAULT_URL})",
    )
    group.add_argument(
        "--token", default=default, help="bearer token (INVENTORY_TOKEN); sent as Authorization"
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=default if default is argparse.SUPPRESS else 10.0,
        help="seconds to wait for the service (default 10)",
    )


def _parsers_below(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every subcommand's parser under `parser`, nested ones included (`tokens create`)."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases share a parser
                found.append(child)
                found.extend(_parsers_below(child))
    return found


def connect(args: argparse.Namespace) -> Client:
    """A client for --url or INVENTORY_URL, with --token or INVENTORY_TOKEN."""
    url = args.url or os.environ.get("INVENTORY_URL") or DEFAULT_URL
    token = args.token or os.environ.get("INVENTORY_TOKEN") or None
    return Client(url, token=token, timeout=args.timeout)


def run_ctl(args: argparse.Namespace, settings: object = None) -> int:
    """Run the chosen handler; an expected failure is one line on stderr and exit 1."""
    # httpx logs every request at INFO: on an operator's terminal that is
    # noise around the one line that matters.
    for chatty in ("httpx", "httpcore", "websockets"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    client = connect(args)
    try:
        code: int = args.handler(args, client)
        return code
    except CtlError as error:
        print(f"llmgw-inventory ctl: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        client.close()
