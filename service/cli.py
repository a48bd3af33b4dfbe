"""`llmgw-inventory`: serve the API, migrate the database, and (ctl) operate the cluster."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.config import SettingError, Settings, default_data_dir, deprecation_warnings
from service.fleet.health import policy

if TYPE_CHECKING:
    from service.database.embedded import EmbeddedPostgres

log = logging.getLogger("llmgw-inventory")

# Seconds `migrate` waits for an unreachable database before it gives up.
MIGRATE_WAIT = 60.0


def configure_logging(settings: Settings) -> None:
    from service.web.logs import configure

    # Text or one JSON object per line (INVENTORY_LOG_FORMAT), with request ids.
    configure(settings.log_level, settings.log_format)


def _data_dir(settings: Settings, data_dir: str | None) -> Path:
    """The embedded PostgreSQL's data directory: --data-dir, else INVENTORY_DATA_DIR, else the user's."""
    return Path(data_dir or settings.data_dir or default_data_dir())


def _database(settings: Settings, data_dir: str | None) -> tuple[str, EmbeddedPostgres | None]:
    """The database URL to use and, when embedded, the server to stop at shutdown."""
    if settings.database_url:
        return settings.database_url, None
    from service.database.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(_data_dir(settings, data_dir))
    return server.url, server


KEEP_ALIVE_SECONDS = 5


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """How uvicorn runs the service (the benchmarks' bare-Starlette floor runs the same way)."""
    return {
        "log_level": "warning",
        # uvicorn logs through our handler (JSON when configured).
        "log_config": None,
        # service.access logs each request (web/logs.py); uvicorn's own
        # access line would be built and dropped on every request.
        "access_log": False,
        # A websocket message is bounded like a request body (uvicorn's default is 16 MiB).
        "ws_max_size": settings.max_body_bytes,
        # Seconds an idle keep-alive connection is kept (uvicorn's default). A
        # proxy's idle timeout must be shorter (deploy/nginx.conf: 2 s), or a
        # connection closed here as the proxy reuses it loses a request.
        "timeout_keep_alive": KEEP_ALIVE_SECONDS,
    }


def wait_for_database(url: str, settings: Settings, within: float | None) -> str | None:
    """None once DATABASE_URL answers; else the reason to stop (hosts named, password hidden)."""
    import asyncio

    from service.database.database_wait import DatabaseStartupError, wait_until_reachable

    try:
        asyncio.run(wait_until_reachable(url, connect_timeout=settings.db_timeout, within=within))
    except DatabaseStartupError as error:
        return str(error)
    return None


@dataclass(frozen=True)
class Census:
    """What `serve` reads from the database once at start, to say what to do next."""

    # Stored tokens, revoked ones included: each locks token-less callers out
    # (access_control/tokens.any_tokens), so each counts here.
    tokens: int
    nodes: int
    bootstrap: bool  # INVENTORY_BOOTSTRAP_TOKEN is set

    @property
    def tokens_in_force(self) -> bool:
        """The rule the running service applies (service/access_control/auth.py)."""
        return self.bootstrap or self.tokens > 0


def census(database_url: str, settings: Settings) -> Census:
    import asyncio

    from service.access_control.tokens import count_tokens
    from service.database.connections import autocommit
    from service.database.db import create_engine, dispose
    from service.fleet.node_writes import count_nodes

    async def ask() -> Census:
        engine = create_engine(database_url, settings.replace(db_pool_size=1, db_max_overflow=1))
        try:
            async with autocommit(engine) as conn:
                tokens = await count_tokens(conn)
                nodes = await count_nodes(conn)
        finally:
            await dispose(engine)
        return Census(tokens=tokens, nodes=nodes, bootstrap=bool(settings.bootstrap_token))

    return asyncio.run(ask())


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def next_steps(
    settings: Settings, found: Census, *, assets_missing: bool, data_dir: Path | None = None
) -> list[str]:
    """What an operator does next, printed when `serve` starts: where to go, what is missing,
    where the data is, and whether callers need a token (the first one locks out every
    caller that sends none)."""
    base = f"http://{settings.host}:{settings.port}"
    steps = [f"next: the dashboard is {base}/ and GraphiQL {base}/graphql"]
    if assets_missing:
        steps.append(
            "next: GraphiQL's scripts are not here, so GraphiQL needs unpkg.com (its page says "
            "so): run `llmgw-inventory fetch-assets` where the npm registry is reachable (in a "
            "checkout: `python3 dev.py fetch-assets`)"
        )
    if data_dir is not None:
        steps.append(
            f"next: the embedded PostgreSQL keeps its data in {data_dir}; to start over, stop "
            "serve and run `llmgw-inventory reset` (in a checkout: `python3 dev.py reset`), "
            "which deletes it: nodes, allocations, events and tokens"
        )
    if found.nodes == 0:
        steps.append(
            "next: no nodes yet? `llmgw-inventory demo` (in a checkout: `python3 dev.py demo`) "
            "registers a demo cluster and keeps it alive"
        )
    else:
        steps.append(f"next: {_plural(found.nodes, 'node')} stored: `llmgw-inventory ctl nodes`")
    if found.tokens:
        steps.append(
            f"next: tokens are required: {_plural(found.tokens, 'token')} "
            f"{'exists' if found.tokens == 1 else 'exist'} (revoked ones count), so ctl and demo need --token or INVENTORY_TOKEN, the dashboard its Token "
            "field and GraphiQL its Headers pane. Lost them? Restart with "
            "INVENTORY_BOOTSTRAP_TOKEN=<a secret> and use that secret"
            + (", or start over (above)" if data_dir is not None else "")
        )
    elif found.bootstrap:
        steps.append(
            "next: tokens are required: INVENTORY_BOOTSTRAP_TOKEN is set, so every caller needs "
            "a token (--token or INVENTORY_TOKEN for ctl and demo)"
        )
    else:
        steps.append(
            "next: no tokens yet, so every caller on loopback is an operator. "
            "`llmgw-inventory ctl tokens create --role operator` makes the first token; from "
            "then on every caller without one (running agents, ctl, the dashboard) is refused "
            "with HTTP 401, so give each its own token"
        )
    return steps


def fetch_missing_assets() -> None:
    """GraphiQL's scripts into the package's vendor directory, when missing (checkouts: dev.py).

    A failure (no network to the npm registry) does not stop the service: its
    GraphiQL page then says what to run (service/web/graphiql.py), and so does
    this warning.
    """
    from service.web.assets import VENDOR_DIR, AssetError, fetch

    try:
        stored = fetch()
    except AssetError as error:
        log.warning(
            "GraphiQL's scripts could not be fetched, so GraphiQL needs unpkg.com: %s", error
        )
        return
    if stored:
        log.info(
            "fetched GraphiQL's scripts into %s (checked against Strawberry's hashes)", VENDOR_DIR
        )


def serve(args: argparse.Namespace, settings: Settings) -> int:
    from service.database.migrations import NewerSchema, upgrade
    from service.web import heap
    from service.web.app import create_app
    from service.web.draining import DrainingServer

    settings = settings.replace(host=args.host or settings.host, port=args.port or settings.port)
    if args.fetch_assets:
        fetch_missing_assets()
    url, server = _database(settings, args.data_dir)

    def stop_embedded() -> None:
        if server is not None:
            server.stop()

    try:
        # Not listening until the database answers: a load balancer sees
        # this replica as down rather than failing its requests.
        if server is None and (problem := wait_for_database(url, settings, within=None)):
            print(f"llmgw-inventory: {problem}", file=sys.stderr)
            return 2
        try:
            upgrade(url)
        except NewerSchema as error:
            print(f"llmgw-inventory: {error}", file=sys.stderr)
            return 2
        from service.access_control.bind_policy import bind_decision

        found = census(url, settings)
        decision = bind_decision(
            settings.host, found.tokens_in_force, args.insecure or settings.insecure
        )
        if not decision.start:
            print(f"llmgw-inventory: {decision.message}", file=sys.stderr)
            return 2
        if decision.message:
            log.warning("%s", decision.message)
        from service.web.tracing import from_environment

        app = create_app(
            settings, database_url=url, on_shutdown=stop_embedded, tracing=from_environment()
        )
        log.info("serving on http://%s:%d/graphql", settings.host, settings.port)
        from service.web.assets import VENDOR_DIR, missing_or_altered, pinned_assets

        assets_missing = bool(missing_or_altered(VENDOR_DIR, pinned_assets()))
        data_dir = server.data_dir if server is not None else None
        for line in next_steps(settings, found, assets_missing=assets_missing, data_dir=data_dir):
            log.info("%s", line)
        heap.settle()
        DrainingServer.run_app(
            app, settings, host=settings.host, port=settings.port, **uvicorn_options(settings)
        )
    finally:
        # Reached on startup failures and on a plain return; after SIGTERM
        # uvicorn re-raises the signal, and the lifespan has already stopped it.
        stop_embedded()
    return 0


def migrate(args: argparse.Namespace, settings: Settings) -> int:
    from service.database.migrations import NewerSchema, upgrade

    url, server = _database(settings, args.data_dir)
    try:
        # A one-shot job: waits like a replica, but not forever.
        if server is None and (problem := wait_for_database(url, settings, within=MIGRATE_WAIT)):
            print(f"llmgw-inventory migrate: {problem}", file=sys.stderr)
            return 1
        try:
            upgrade(url)
        except NewerSchema as error:
            print(f"llmgw-inventory migrate: {error}", file=sys.stderr)
            return 2
    finally:
        if server is not None:
            server.stop()
    print("database is at the latest schema")
    return 0


def after_restore(args: argparse.Namespace, settings: Settings) -> int:
    """Once a restore brought the database back (deploy/restore.sh): service/restores.py."""
    import asyncio

    from service.database.db import create_engine, dispose
    from service.database.transactions import in_transaction
    from service.errors import InvalidInput
    from service.event_log.event_announcements import drain_announcements
    from service.restores import after_restore as fix_up

    url = settings.database_url
    if not url:
        print("llmgw-inventory after-restore: DATABASE_URL is not set", file=sys.stderr)
        return 2
    if problem := wait_for_database(url, settings, within=MIGRATE_WAIT):
        print(f"llmgw-inventory after-restore: {problem}", file=sys.stderr)
        return 1

    async def run() -> Any:
        engine = create_engine(url, settings.replace(db_pool_size=1, db_max_overflow=1))
        try:
            done = await in_transaction(
                engine, lambda conn: fix_up(conn, args.target, args.fence_floor, args.margin)
            )
            # The event's NOTIFY goes out after commit, on this engine: before it closes.
            await drain_announcements(engine)
            return done
        finally:
            await dispose(engine)

    try:
        done = asyncio.run(run())
    except InvalidInput as error:
        print(f"llmgw-inventory after-restore: {error}", file=sys.stderr)
        return 2
    print(
        f"restored to {args.target}: event recorded; fences continue from {done.fence_after + 1} "
        f"(were at {done.fence_before})"
    )
    return 0


def reset(args: argparse.Namespace, settings: Settings) -> int:
    from service.database.embedded import ResetRefused
    from service.database.embedded import reset as delete_data

    if settings.database_url:
        print(
            "llmgw-inventory reset: DATABASE_URL is set; reset deletes only the embedded "
            "PostgreSQL's data directory, never a database of yours: nothing deleted",
            file=sys.stderr,
        )
        return 2
    directory = _data_dir(settings, args.data_dir)
    if not directory.exists():
        print(f"nothing to delete: {directory} does not exist")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            print(
                f"llmgw-inventory reset: would delete {directory} (the embedded PostgreSQL's "
                "data: nodes, allocations, events and tokens); pass --yes to do it",
                file=sys.stderr,
            )
            return 2
        answer = input(f"delete {directory}: nodes, allocations, events and tokens? [y/N] ")
        if answer.strip().lower() not in {"y", "yes"}:
            print("nothing deleted")
            return 1
    try:
        delete_data(directory)
    except ResetRefused as refused:
        print(f"llmgw-inventory reset: {refused}", file=sys.stderr)
        return 1
    print(
        f"deleted {directory}: the embedded PostgreSQL's data (nodes, allocations, events and "
        "tokens); the next serve starts on an empty database, without tokens"
    )
    return 0


def fetch_assets(args: argparse.Namespace, settings: Settings) -> int:
    from service.web.assets import VENDOR_DIR, AssetError, fetch, missing_or_altered, pinned_assets

    try:
        if args.check:
            bad = missing_or_altered(VENDOR_DIR, pinned_assets())
            for path in bad:
                print(f"missing or altered: {VENDOR_DIR / path}", file=sys.stderr)
            return 1 if bad else 0
        stored = fetch()
    except AssetError as error:
        print(f"llmgw-inventory fetch-assets: {error}", file=sys.stderr)
        return 1
    for path in stored:
        print(f"stored {VENDOR_DIR / path}")
    print(f"GraphiQL's assets are in {VENDOR_DIR}, checked against Strawberry's pinned hashes")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmgw-inventory", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve_cmd = commands.add_parser(
        "serve", help="serve the GraphQL API (applies migrations first)"
    )
    serve_cmd.add_argument(
        "--host", help="address to listen on (INVENTORY_HOST, default 127.0.0.1)"
    )
    serve_cmd.add_argument("--port", type=int, help="port (INVENTORY_PORT, default 8080)")
    serve_cmd.add_argument(
        "--data-dir",
        help=(
            "embedded PostgreSQL's data directory, when DATABASE_URL is unset "
            f"(INVENTORY_DATA_DIR, default {default_data_dir()})"
        ),
    )
    serve_cmd.add_argument(
        "--fetch-assets",
        action="store_true",
        help=(
            "first fetch GraphiQL's scripts when they are missing (`python3 dev.py serve` "
            "passes it; a wheel carries them); a failure is a warning"
        ),
    )
    serve_cmd.add_argument(
        "--insecure",
        action="store_true",
        help="serve a non-loopback address without tokens (INVENTORY_INSECURE); warns at start",
    )
    serve_cmd.set_defaults(run=serve)

    reset_cmd = commands.add_parser(
        "reset",
        help="delete the embedded PostgreSQL's data directory, to start over (asks first)",
        description=(
            "Delete the embedded PostgreSQL's data directory (--data-dir, else "
            "INVENTORY_DATA_DIR, else the per-user default): every node, allocation, event and "
            "token. The next serve starts empty, without tokens. Refused while serve runs on "
            "it, and when DATABASE_URL is set."
        ),
    )
    reset_cmd.add_argument("--data-dir", help="the data directory (as given to serve)")
    reset_cmd.add_argument("--yes", action="store_true", help="do not ask")
    reset_cmd.set_defaults(run=reset)

    migrate_cmd = commands.add_parser("migrate", help="apply pending migrations and exit")
    migrate_cmd.add_argument("--data-dir", help="embedded PostgreSQL's data directory")
    migrate_cmd.set_defaults(run=migrate)

    restored_cmd = commands.add_parser(
        "after-restore",
        help="after a restore of the database (deploy/restore.sh): move the fence sequence "
        "past the lost history and record the restore",
    )
    restored_cmd.add_argument(
        "--target", required=True, help="the restore's target: a time or latest"
    )
    restored_cmd.add_argument(
        "--fence-floor",
        type=int,
        help="the old cluster's last fence, when it could be read before it stopped",
    )
    restored_cmd.add_argument(
        "--margin", type=int, default=1_000_000, help="fences skipped past the floor"
    )
    restored_cmd.set_defaults(run=after_restore)

    assets_cmd = commands.add_parser(
        "fetch-assets",
        help="fetch GraphiQL's scripts from the npm registry, so GraphiQL works without internet access",
    )
    assets_cmd.add_argument(
        "--check",
        action="store_true",
        help="only check they are present and intact (exit 1 if not)",
    )
    assets_cmd.set_defaults(run=fetch_assets)

    from service.ctl import add_ctl_parser
    from service.demo_cluster import add_parser as add_demo_parser

    add_ctl_parser(commands)
    add_demo_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env(os.environ)
        # The remediation policy stops the service here too, naming the line.
        policy.install(policy.load(settings.remediation_policy))
    except SettingError as error:
        print(f"llmgw-inventory: {error}", file=sys.stderr)
        return 2
    configure_logging(settings)
    for line in deprecation_warnings(os.environ):
        log.warning("%s", line)
    code: int = args.run(args, settings)
    return code


if __name__ == "__main__":
    sys.exit(main())
