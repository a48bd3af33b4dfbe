"""The agent reports what its engines run and stops what the inventory fences off.

The serving stack is faked by what it writes (a JSON file, or a local HTTP
endpoint through httpx.MockTransport); the stop command is a real process
(this Python) that appends the shard it was asked to stop to a log, and
fails or hangs when the test says so.
"""

import json
import logging
import sys
from pathlib import Path

import httpx
import pytest
from fake_inventory_service import FakeService
from test_agent_loop import CONFIG, node_report

from agent.client import InventoryClient
from agent.config import AgentConfig, ConfigError, load_config
from agent.loop import Agent
from agent.running_shards import RunningShard, RunningShardsSource, parse_running

# Appends "<shard> <fence>" to the log; exits 1 while the fail file exists,
# sleeps while the hang file exists.
STOPPER = """
import os, sys, time
log, shard, fence = sys.argv[1], sys.argv[2], sys.argv[3]
if os.path.exists(log + ".hang"):
    time.sleep(30)
with open(log, "a") as f:
    f.write(f"{shard} {fence}\\n")
if os.path.exists(log + ".fail"):
    print("engine did not answer", file=sys.stderr)
    sys.exit(1)
"""


class ServingStack:
    """What the engines run, as the serving stack writes it, and what was stopped."""

    def __init__(self, root: Path) -> None:
        self.file = root / "running.json"
        self.stop_log = root / "stopped.log"
        self.script = root / "stop_shard.py"
        self.script.write_text(STOPPER)

    def runs(self, *shards: tuple[str, int]) -> None:
        document = {"shards": [{"shardId": s, "fence": f} for s, f in shards]}
        self.file.write_text(json.dumps(document))

    def failing(self, fail: bool) -> None:
        flag = Path(str(self.stop_log) + ".fail")
        if fail:
            flag.touch()
        else:
            flag.unlink()

    def hanging(self) -> None:
        Path(str(self.stop_log) + ".hang").touch()

    def stopped(self) -> list[str]:
        return self.stop_log.read_text().splitlines() if self.stop_log.exists() else []

    def command(self) -> tuple[str, ...]:
        return (sys.executable, str(self.script), str(self.stop_log), "{shard_id}", "{fence}")


def fenced_config(stack: ServingStack, **changes: object) -> AgentConfig:
    values: dict[str, object] = {
        **{f: getattr(CONFIG, f) for f in ("node_id", "hostname", "mgmt_addr")},
        "running_shards": str(stack.file),
        "stop_command": stack.command(),
        "stop_timeout": 5.0,
        **changes,
    }
    return AgentConfig(**values)  # type: ignore[arg-type]


def agent_for(service: FakeService, config: AgentConfig, **kwargs: object) -> Agent:
    client = InventoryClient(
        "http://inventory.test/graphql", None, 5, transport=service.transport()
    )
    return Agent(config, client, node_report, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def stack(tmp_path: Path) -> ServingStack:
    return ServingStack(tmp_path)


@pytest.mark.process
async def test_stop_command_runs_once_per_shard_and_never_for_a_held_one(
    stack: ServingStack,
) -> None:
    service = FakeService()
    service.held["gpu-07"] = {("kept", 7)}
    stack.runs(("kept", 7), ("stale", 3))
    agent = agent_for(service, fenced_config(stack))
    for now in (0.0, 10.0, 20.0):
        await agent.step(node_report(), now)
    # Sent with every exchange (the report, then the beats).
    assert [v["runningShards"] for v in service.fenced] == [
        [{"shardId": "kept", "fence": 7}, {"shardId": "stale", "fence": 3}]
    ] * 3
    assert stack.stopped() == ["stale 3"]


@pytest.mark.process
async def test_a_failed_stop_is_reported_and_retried_until_it_succeeds(
    stack: ServingStack, caplog: pytest.LogCaptureFixture
) -> None:
    service = FakeService()
    stack.runs(("stale", 3))
    stack.failing(True)
    agent = agent_for(service, fenced_config(stack))
    await agent.step(node_report(), 0.0)
    await agent.step(node_report(), 10.0)
    assert stack.stopped() == ["stale 3", "stale 3"]
    assert agent.stop_commands is not None and agent.stop_commands.failures == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("exit status 1: engine did not answer" in m for m in errors)

    stack.failing(False)
    await agent.step(node_report(), 20.0)
    await agent.step(node_report(), 30.0)
    # Succeeded on the third run; not run again though still listed.
    assert stack.stopped() == ["stale 3"] * 3


@pytest.mark.process
async def test_a_stop_command_that_hangs_is_killed_and_reported(
    stack: ServingStack, caplog: pytest.LogCaptureFixture
) -> None:
    service = FakeService()
    stack.runs(("stale", 3))
    stack.hanging()
    agent = agent_for(service, fenced_config(stack, stop_timeout=0.5))
    await agent.step(node_report(), 0.0)
    assert agent.stop_commands is not None and agent.stop_commands.failures == 1
    assert any("killed" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


async def test_without_stop_command_the_stops_are_logged_only(
    stack: ServingStack, caplog: pytest.LogCaptureFixture
) -> None:
    service = FakeService()
    stack.runs(("stale", 3))
    agent = agent_for(service, fenced_config(stack, stop_command=None))
    await agent.step(node_report(), 0.0)
    assert stack.stopped() == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("must stop shard stale (fence 3): RELEASED" in m for m in warnings)


async def test_the_incarnation_seen_is_sent_back_and_a_refused_one_forgotten(
    stack: ServingStack,
) -> None:
    service = FakeService()
    stack.runs()
    agent = agent_for(service, fenced_config(stack))
    await agent.step(node_report(), 0.0)
    await agent.step(node_report(), 10.0)
    assert [v["incarnation"] for v in service.fenced] == [None, 1]

    # The service's record moved back (restored from a backup): the agent's
    # claim is refused, it forgets it and goes on.
    agent.incarnation = 5
    await agent.step(node_report(), 20.0)
    assert agent.incarnation is None
    await agent.step(node_report(), 20.0)
    assert service.fenced[-1]["incarnation"] is None and agent.incarnation == 1


async def test_an_unreadable_source_sends_no_running_shards(
    stack: ServingStack, caplog: pytest.LogCaptureFixture
) -> None:
    service = FakeService()
    agent = agent_for(service, fenced_config(stack))
    await agent.step(node_report(), 0.0)  # no file yet
    stack.file.write_text('{"shards": [{"shardId": "x"}]}')
    await agent.step(node_report(), 10.0)
    assert [v["runningShards"] for v in service.fenced] == [None, None]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("shards[0].fence must be an integer" in m for m in warnings)
    assert stack.stopped() == []


async def test_the_running_shards_can_come_from_a_local_http_endpoint() -> None:
    document = {"shards": [{"shardId": "a", "fence": 1}]}

    def serve(request: httpx.Request) -> httpx.Response:
        assert request.method == "GET"
        return httpx.Response(200, json=document)

    source = RunningShardsSource(
        "http://127.0.0.1:9101/running-shards", 1.0, transport=httpx.MockTransport(serve)
    )
    assert await source.read() == (RunningShard("a", 1),)
    down = RunningShardsSource(
        "http://127.0.0.1:9101/running-shards",
        1.0,
        transport=httpx.MockTransport(lambda r: httpx.Response(503)),
    )
    assert await down.read() is None


def test_the_document_format_is_checked() -> None:
    assert parse_running('{"shards": []}') == ()
    for bad in (
        "[]",
        '{"shards": [{"shardId": "", "fence": 1}]}',
        '{"shards": [{"shardId": "a", "fence": true}]}',
    ):
        with pytest.raises(ValueError):
            parse_running(bad)


def test_config_names_what_is_wrong(tmp_path: Path) -> None:
    env = {"LLMGW_AGENT_NODE_ID": "gpu-07", "LLMGW_AGENT_STOP_COMMAND": "/bin/stop {shard_id}"}
    with pytest.raises(ConfigError, match="needs running_shards"):
        load_config(None, env)
    env["LLMGW_AGENT_RUNNING_SHARDS"] = "http://10.1.2.3:9101/shards"
    with pytest.raises(ConfigError, match="loopback"):
        load_config(None, env)
    env["LLMGW_AGENT_RUNNING_SHARDS"] = "http://127.0.0.1:9101/shards"
    env["LLMGW_AGENT_STOP_COMMAND"] = "/bin/stop"
    with pytest.raises(ConfigError, match="shard_id"):
        load_config(None, env)
    env["LLMGW_AGENT_STOP_COMMAND"] = "/bin/stop --fence {fence} {shard_id}"
    config = load_config(None, env)
    assert config.stop_command == ("/bin/stop", "--fence", "{fence}", "{shard_id}")
    assert config.running_shards == "http://127.0.0.1:9101/shards"
