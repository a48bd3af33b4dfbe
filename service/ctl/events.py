"""`ctl events [--follow]`: what happened, and (with --follow) what happens next.

--follow uses the `events` subscription (graphql-transport-ws on the same
/graphql URL) resumed from the last event printed, so nothing falls between
the history and the live stream.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

from service.ctl.client import NO_TOKEN_SENT, Client, CtlError
from service.ctl.output import (
    DASH,
    add_output_option,
    column_widths,
    print_json,
    table,
    table_row,
)
from service.ctl.times import since as parse_since

# Where `ctl --help` lists these (after nodes).
HELP_ORDER = 30


EVENTS = """
query Events($nodeId: ID, $replicaId: ID, $kinds: [String!], $since: DateTime,
             $first: Int, $after: ID) {
  events(nodeId: $nodeId, replicaId: $replicaId, kinds: $kinds, since: $since,
         first: $first, after: $after) {
    id at kind nodeId replicaId shardId actor reason detail
  }
}
"""

SUBSCRIPTION = """
subscription Follow($nodeId: ID, $replicaId: ID, $kinds: [String!], $after: ID) {
  events(nodeId: $nodeId, replicaId: $replicaId, kinds: $kinds, after: $after) {
    id at kind nodeId replicaId shardId actor reason detail
  }
}
"""


def _time(value: str) -> str:
    return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def event_row(e: dict[str, Any]) -> list[str]:
    return [
        _time(e["at"]),
        e["kind"],
        e.get("nodeId") or DASH,
        e.get("replicaId") or DASH,
        e.get("shardId") or DASH,
        e.get("actor") or DASH,
        e.get("reason") or "",
    ]


HEADERS = ["TIME", "KIND", "NODE", "REPLICA", "SHARD", "BY", "REASON"]
# --follow prints rows one at a time under a header printed first, so the
# columns cannot be sized by the rows to come: these widths hold the usual
# ids (a time is always 19 characters, the longest kind is report_changed).
FOLLOW_WIDTHS = [19, 14, 12, 16, 20, 16, 0]


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {"nodeId": args.node, "replicaId": args.replica, "kinds": args.kind or None}


def history(args: argparse.Namespace, client: Client) -> list[dict[str, Any]]:
    since = args.since.isoformat() if args.since is not None else None
    return client.every(EVENTS, "events", "id", {**_filters(args), "since": since})


def show_events(args: argparse.Namespace, client: Client) -> int:
    found = history(args, client)
    shown = found[-args.limit :] if args.limit else found
    widths: list[int] = []
    if args.output == "json":
        if args.follow:
            for event in shown:
                print(json.dumps(event), flush=True)
        else:
            print_json(shown)
    elif args.follow:
        # The live rows go under the same header, in the same columns.
        rows = [event_row(e) for e in shown]
        widths = column_widths(HEADERS, rows, FOLLOW_WIDTHS)
        print(table(HEADERS, rows, widths), flush=True)
    elif shown:
        print(table(HEADERS, [event_row(e) for e in shown]), flush=True)
    else:
        print("no events")
    if args.follow:
        last_id = found[-1]["id"] if found else None
        follow(args, client, last_id, widths)
    return 0


class StreamLost(Exception):
    """The event stream dropped after it was working: worth resuming."""


class TokenRefused(CtlError):
    """Retrying cannot help: the token is wrong or was revoked."""


# Waits between attempts to resume a dropped stream (the last one repeats).
RESUME_DELAYS = (0.5, 1.0, 2.0, 5.0)


def follow(args: argparse.Namespace, client: Client, after: str | None, widths: list[int]) -> None:
    """Stream events until Ctrl-C, resuming after the last one printed if the stream drops.

    A service restarting under a `--follow` (a rolling deploy) is a pause,
    not an exit: the subscription resumes with `after`, so nothing is missed
    or printed twice. Failing to connect at all is still an error.
    """
    cursor = [after]
    attempts = 0  # since the stream last worked; 0 before it ever did
    try:
        while True:
            try:
                _stream(args, client, cursor, widths)
                return
            except StreamLost as lost:
                attempts = 1
                print(f"llmgw-inventory ctl: {lost}; resuming", file=sys.stderr, flush=True)
            except TokenRefused:
                raise
            except CtlError:
                if attempts == 0:
                    raise  # never connected: the service is down or the URL is wrong
                attempts += 1  # still restarting: keep trying, as tail -F would
            time.sleep(RESUME_DELAYS[min(attempts, len(RESUME_DELAYS)) - 1])
    except KeyboardInterrupt:
        sys.stdout.flush()


def _stream(
    args: argparse.Namespace, client: Client, cursor: list[str | None], widths: list[int]
) -> None:
    """One subscription; cursor[0] follows the last event printed."""
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
    from websockets.sync.client import connect

    ws_url = re.sub(r"^http", "ws", client.url, count=1)
    init_payload = {"Authorization": f"Bearer {client.token}"} if client.token else {}
    streaming = False
    try:
        with connect(
            ws_url,
            subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
            additional_headers=client.headers,
            open_timeout=10,
        ) as socket:
            socket.send(json.dumps({"type": "connection_init", "payload": init_payload}))
            ack = json.loads(socket.recv(timeout=10))
            if ack.get("type") != "connection_ack":
                raise CtlError(f"the service refused the event stream: {ack}")
            variables = {**_filters(args), "after": cursor[0]}
            socket.send(
                json.dumps(
                    {
                        "id": "events",
                        "type": "subscribe",
                        "payload": {"query": SUBSCRIPTION, "variables": variables},
                    }
                )
            )
            streaming = True
            for raw in socket:
                message = json.loads(raw)
                kind = message.get("type")
                if kind == "ping":
                    socket.send(json.dumps({"type": "pong"}))
                elif kind == "next":
                    payload = message.get("payload") or {}
                    if payload.get("errors"):
                        raise CtlError(str(payload["errors"][0].get("message")))
                    event = payload["data"]["events"]
                    if args.output == "json":
                        print(json.dumps(event), flush=True)
                    else:
                        print(table_row(event_row(event), widths), flush=True)
                    cursor[0] = event["id"]
                elif kind == "error":
                    errors = message.get("payload") or [{}]
                    raise CtlError(str(errors[0].get("message", "subscription refused")))
                elif kind == "complete":
                    return
    except ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd is not None else None
        reason = closed.rcvd.reason if closed.rcvd is not None else ""
        if code == 4403 and not client.token:
            raise TokenRefused(NO_TOKEN_SENT) from None
        if code == 4403:
            raise TokenRefused(
                f"the service refused the token: {reason} (pass --token or set INVENTORY_TOKEN)"
            ) from None
        said = f"the event stream closed ({code}{': ' + reason if reason else ''})"
        if streaming:
            raise StreamLost(said) from None
        raise CtlError(said) from None
    except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as error:
        if streaming:
            raise StreamLost(f"the event stream dropped: {error}") from None
        raise CtlError(f"cannot follow events at {ws_url}: {error}") from None


def register(commands: Any) -> None:
    events = commands.add_parser("events", help="the event log; --follow streams new events")
    events.add_argument("--node", help="only this node's events")
    events.add_argument("--replica", help="only this replica's events")
    events.add_argument(
        "--kind", action="append", help="only events of this kind (repeatable), e.g. lost"
    )
    events.add_argument(
        "--since",
        type=parse_since,
        default=None,
        help="only events since then: 15m, 2h, 7d, or an ISO-8601 time (default: all kept)",
    )
    events.add_argument(
        "--limit", type=int, default=100, help="show the last N (default 100; 0 for all)"
    )
    events.add_argument(
        "--follow", "-f", action="store_true", help="keep streaming new events (Ctrl-C to stop)"
    )
    add_output_option(events)
    events.set_defaults(handler=show_events)
