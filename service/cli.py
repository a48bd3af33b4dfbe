"""`llmgw-inventory`: serve the API, migrate the database, and (ctl) operate the cluster."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from service.config import SettingError, Settings, default_data_dir

log = logging.getLogger("llmgw-inventory")

# Seconds `migrate` waits for an unreachable database before it gives up.
MIGRATE_WAIT = 60.0


def configure_logging(settings: Settings) -> None:
    from service.web.logs import configure

    # Text or one JSON object per line (INVENTORY_LOG_FORMAT), with request ids.
    configure(settings.log_level, settings.log_format)


def _database(settings: Settings, data_dir: str | None) -> tuple[str, object | None]:
    """The database URL to use and, when embedded, the server to stop at shutdown."""
    if settings.database_url:
        return settings.database_url, None
    from service.database.embedded import EmbeddedPostgres

    directory = Path(data_dir or settings.data_dir or default_data_dir())
    server = EmbeddedPostgres(directory)
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


def next_steps(settings: Settings, *, tokens_in_force: bool, assets_missing: bool) -> list[str]:
    """What an operator does next, printed when `serve` starts: where to go, what is missing,
    and what the first token changes (it locks out every caller that sends none)."""
    base = f"http://{settings.host}:{settings.port}"
    steps = [f"next: the dashboard is {base}/ and GraphiQL {base}/graphql"]
    if assets_missing:
        steps.append(
            "next: GraphiQL's scripts are not here, so it loads them from a CDN (offline it "
            "stays at 'Loading...'): run `llmgw-inventory fetch-assets` "
            "(in a checkout: `python3 dev.py fetch-assets`)"
        )
    steps.append(
        "next: no nodes yet? `llmgw-inventory demo` (in a checkout: `python3 dev.py demo`) "
        "registers a demo cluster and keeps it alive"
    )
    if not tokens_in_force:
        steps.append(
            "next: no tokens yet, so every caller on loopback is an operator. "
            "`llmgw-inventory ctl tokens create --role operator` makes the first token; from "
            "then on every caller without one (running agents, ctl, the dashboard) is refused "
            "with HTTP 401, so give each its own token"
        )
    return steps


def serve(args: argparse.Namespace, settings: Settings) -> int:
    from service.database.migrations import upgrade
    from service.web import heap
    from service.web.app import create_app
    from service.web.draining import DrainingServer

    settings = settings.replace(host=args.host or settings.host, port=args.port or settings.port)
    url, server = _database(settings, args.data_dir)

    def stop_embedded() -> None:
        if server is not None:
            server.stop()  # type: ignore[attr-defined]

    try:
        # Not listening until the database answers: a load balancer sees
        # this replica as down rather than failing its requests.
        if server is None and (problem := wait_for_database(url, settings, within=None)):
            print(f"llmgw-inventory: {problem}", file=sys.stderr)
            return 2
        upgrade(url)
        from service.access_control.bind_policy import bind_decision, tokens_in_force

        in_force = tokens_in_force(url, settings)
        decision = bind_decision(settings.host, in_force, args.insecure or settings.insecure)
        if not decision.start:
            print(f"llmgw-inventory: {decision.message}", file=sys.stderr)
            return 2
        if decision.message:
            log.warning("%s", decision.message)
        app = create_app(settings, database_url=url, on_shutdown=stop_embedded)
        log.info("serving on http://%s:%d/graphql", settings.host, settings.port)
        from service.web.assets import VENDOR_DIR, missing_or_altered, pinned_assets

        assets_missing = bool(missing_or_altered(VENDOR_DIR, pinned_assets()))
        for line in next_steps(
            settings,
            tokens_in_force=in_force,
            assets_missing=assets_missing,
        ):
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
    from service.database.migrations import upgrade

    url, server = _database(settings, args.data_dir)
    try:
        # A one-shot job: waits like a replica, but not forever.
        if server is None and (problem := wait_for_database(url, settings, within=MIGRATE_WAIT)):
            print(f"llmgw-inventory migrate: {problem}", file=sys.stderr)
            return 1
        upgrade(url)
    finally:
        if server is not None:
            server.stop()  # type: ignore[attr-defined]
    print("database is at the latest schema")
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
        "--data-dir", help="embedded PostgreSQL's data directory, when DATABASE_URL is unset"
    )
    serve_cmd.add_argument(
        "--insecure",
        action="store_true",
        help="serve a non-loopback address without tokens (INVENTORY_INSECURE); warns at start",
    )
    serve_cmd.set_defaults(run=serve)

    migrate_cmd = commands.add_parser("migrate", help="apply pending migrations and exit")
    migrate_cmd.add_argument("--data-dir", help="embedded PostgreSQL's data directory")
    migrate_cmd.set_defaults(run=migrate)

    assets_cmd = commands.add_parser(
        "fetch-assets",
        help="fetch GraphiQL's scripts with npm pack, so GraphiQL works without internet access",
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
    except SettingError as error:
        print(f"llmgw-inventory: {error}", file=sys.stderr)
        return 2
    configure_logging(settings)
    code: int = args.run(args, settings)
    return code


if __name__ == "__main__":
    sys.exit(main())
