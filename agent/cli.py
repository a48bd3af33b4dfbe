"""`llmgw-agent`: run the node agent, register once, or show the report it would send."""

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

import httpx

from agent import __version__
from agent.client import InventoryClient, ServiceError, ServiceUnavailable
from agent.config import AgentConfig, ConfigError, config_path, load_config
from agent.discovery.gpu_file import GpuFile
from agent.discovery.resets import ResetWatch
from agent.discovery.weights import WeightsScanner
from agent.discovery.xids import XidInbox, XidListener
from agent.loop import Agent, run_until_stopped
from agent.report import Host, Report, build_report

log = logging.getLogger("llmgw.agent")

Survey = Callable[[], Report]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw-agent",
        description="Discover this GPU node and keep the inventory service's view of it true.",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML configuration (default: $LLMGW_AGENT_CONFIG, else /etc/llmgw/agent.toml)",
    )
    parser.add_argument(
        "--once", action="store_true", help="register once and exit (non-zero if it failed)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the registerNode input as JSON and exit, sending nothing (implies --once)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument("--version", action="version", version=f"llmgw-agent {__version__}")
    return parser


def quiet_http_lines(level: str) -> None:
    """httpx logs every request at INFO: one line per heartbeat, every few seconds, forever.

    Those lines belong at DEBUG: shown with --log-level debug, hidden otherwise.
    The agent's own lines already say when the service cannot be reached.
    """
    debug = level.upper() == "DEBUG"
    logging.getLogger("httpx").setLevel(logging.DEBUG if debug else logging.WARNING)


def main(
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    host: Host | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> int:
    """The console script. The keyword arguments are the process edges, for tests."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        # journald stamps the time; a container runtime does too.
        format="%(levelname)s %(message)s",
    )
    quiet_http_lines(args.log_level)
    env = os.environ if env is None else env
    try:
        config = load_config(config_path(args.config, env), env, read_token=not args.dry_run)
    except ConfigError as e:
        print(f"llmgw-agent: configuration error: {e}", file=sys.stderr)
        return 2
    host = host or Host.this_machine()
    weights = WeightsScanner(config.root)

    def survey() -> Report:
        return build_report(config, host, weights)

    if args.dry_run:
        report = survey()
        for warning in report.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(json.dumps(report.node_input, indent=2))
        return 0
    xids = XidInbox()
    if isinstance(config.gpu_source, GpuFile):
        for index, heard in sorted(config.gpu_source.xids.items()):
            for xid in heard:
                xids.put(index, xid)
    if args.once:
        return asyncio.run(_register_once(config, survey, transport, xids))
    listener = None
    if config.gpu_source == "nvml" and host.nvml is not None:
        listener = XidListener(host.nvml, xids, warn=log.warning)
        listener.start()
    try:
        asyncio.run(_serve(config, survey, xids, host.resets))
    finally:
        if listener is not None:
            listener.stop(timeout=1.0)
    return 0


async def _register_once(
    config: AgentConfig,
    survey: Survey,
    transport: httpx.AsyncBaseTransport | None,
    xids: XidInbox,
) -> int:
    client = InventoryClient(
        config.service_url, config.token, config.request_timeout, transport=transport
    )
    try:
        status = await Agent(config, client, survey, xids=xids).register_once()
    except (ServiceUnavailable, ServiceError, RuntimeError) as e:
        print(f"llmgw-agent: registration failed: {e}", file=sys.stderr)
        return 1
    finally:
        await client.aclose()
    print(f"registered node {status.id}: {status.state}")
    return 0


async def _serve(config: AgentConfig, survey: Survey, xids: XidInbox, resets: ResetWatch) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    client = InventoryClient(config.service_url, config.token, config.request_timeout)
    log.info(
        "llmgw-agent %s starting: node %s, service %s",
        __version__,
        config.node_id,
        config.service_url,
    )
    agent = Agent(config, client, survey, xids=xids, resets=resets)
    try:
        await run_until_stopped(agent.run(), stop)
    finally:
        # A validation still running is stopped with the agent (its test killed).
        if agent.validations is not None:
            await agent.validations.stop()
        await client.aclose()
    log.info("llmgw-agent stopped")


if __name__ == "__main__":
    sys.exit(main())
