"""The agent's loop over time: registration, heartbeats, changes, outages, refusals, stopping.

Time is simulated: the agent's sleep advances a fake clock and returns at once,
so an hour-long outage takes milliseconds and nothing depends on the machine's speed.
"""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from fake_inventory_service import FakeService

from agent.backoff import Backoff
from agent.client import InventoryClient
from agent.config import AgentConfig
from agent.loop import Agent, run_until_stopped
from agent.report import Report

SENT_AT = datetime(2026, 12, 5, 8, 30, tzinfo=UTC)

CONFIG = AgentConfig(
    node_id="gpu-07",
    hostname="gpu-07",
    mgmt_addr="10.0.0.7",
    heartbeat_interval=10,
    scan_interval=30,
    full_report_interval=300,
    max_backoff=60,
)


def node_report(healthy: bool = True, free: int = 20 << 40) -> Report:
    return Report(
        {
            "id": "gpu-07",
            "hostname": "gpu-07",
            "mgmtAddr": "10.0.0.7",
            "gpus": [
                {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memoryMb": 81559, "healthy": True},
                {
                    "index": 1,
                    "name": "NVIDIA H100 80GB HBM3",
                    "memoryMb": 81559,
                    "healthy": healthy,
                    "healthReasons": [] if healthy else ["ecc_uncorrected"],
                },
            ],
            "storage": [
                {
                    "id": "dev:9:127",
                    "mountPoint": "/data",
                    "fsType": "xfs",
                    "shared": False,
                    "freeBytes": free,
                    "totalBytes": 28 << 40,
                }
            ],
        }
    )


class ScenarioOver(Exception):
    pass


class FakeTime:
    """A clock and a sleep: sleeping moves the clock, firing the events it passes."""

    def __init__(self, until: float) -> None:
        self.now = 0.0
        self.until = until
        self.sleeps: list[tuple[float, float]] = []  # (when, how long)
        self._events: list[tuple[float, Callable[[], None]]] = []

    def __call__(self) -> float:
        return self.now

    def at(self, when: float, event: Callable[[], None]) -> None:
        self._events.append((when, event))

    async def sleep(self, delay: float) -> None:
        assert delay >= 0
        self.sleeps.append((self.now, delay))
        target = self.now + delay
        for when, event in sorted(self._events, key=lambda e: e[0]):
            if self.now < when <= target:
                self.now = when
                event()
        self.now = target
        if self.now >= self.until:
            raise ScenarioOver
        await asyncio.sleep(0)


class Node:
    """What the survey finds: the test changes it as the scenario goes."""

    def __init__(self) -> None:
        self.report = node_report()

    def survey(self) -> Report:
        return self.report


async def run(
    time: FakeTime,
    service: FakeService | None = None,
    node: Node | None = None,
    config: AgentConfig = CONFIG,
) -> tuple[FakeService, Node]:
    service = service or FakeService(clock=time)
    service.clock = time
    node = node or Node()
    client = InventoryClient(
        "http://inventory.test/graphql", None, 5, transport=service.transport()
    )
    # rand=1.0: the longest delay each time, so the schedule is exact.
    agent = Agent(
        config,
        client,
        node.survey,
        sleep=time.sleep,
        clock=time,
        rand=lambda: 1.0,
        wall_clock=lambda: SENT_AT,
    )
    with pytest.raises(ScenarioOver):
        await agent.run()
    await client.aclose()
    return service, node


def as_sent(report: Report) -> dict[str, object]:
    """The report as it leaves the agent: with its clock's sentAt, which the service
    measures the agent's clock with (service/fleet/observed_at.py)."""
    return {**report.node_input, "sentAt": SENT_AT.isoformat()}


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


async def test_the_node_registers_at_start_then_heartbeats_every_interval() -> None:
    service, _ = await run(FakeTime(until=45))
    assert service.calls == [
        (0, "register"),
        (10, "heartbeat"),
        (20, "heartbeat"),
        (30, "heartbeat"),
        (40, "heartbeat"),
    ]
    # As surveyed, with the agent's clock when it left: the service measures
    # the agent's clock with it (service/fleet/observed_at.py).
    assert service.nodes["gpu-07"] == as_sent(node_report())


async def test_a_changed_report_is_sent_once_after_the_next_scan() -> None:
    time, node = FakeTime(until=125), Node()
    time.at(15, lambda: setattr(node, "report", node_report(healthy=False)))
    service, _ = await run(time, node=node)

    # Scans at 0, 30, 60, 90, 120: the fault found at 30 is sent then, and only then.
    assert [at for at, kind in service.calls if kind == "register"] == [0, 30]
    assert service.nodes["gpu-07"]["gpus"][1]["healthReasons"] == ["ecc_uncorrected"]


async def test_free_space_churn_is_not_sent_but_a_download_is() -> None:
    time, node = FakeTime(until=125), Node()
    time.at(15, lambda: setattr(node, "report", node_report(free=(20 << 40) - 4096)))
    time.at(45, lambda: setattr(node, "report", node_report(free=(20 << 40) - (16 << 30))))
    service, _ = await run(time, node=node)
    assert [at for at, kind in service.calls if kind == "register"] == [0, 60]


async def test_an_unchanged_report_is_sent_again_every_full_report_interval() -> None:
    service, _ = await run(FakeTime(until=650))
    assert [at for at, kind in service.calls if kind == "register"] == [0, 300, 600]


async def test_a_service_that_forgot_the_node_gets_it_back_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    time = FakeTime(until=45)
    service = FakeService(clock=time)
    time.at(25, service.restart_empty)
    await run(time, service)

    assert service.kinds(since=30) == ["heartbeat", "register", "heartbeat"]
    assert service.calls[-3:] == [(30, "heartbeat"), (30, "register"), (40, "heartbeat")]
    assert service.nodes["gpu-07"] == as_sent(node_report())
    assert "the service does not know node gpu-07: registering again" in messages(
        caplog, logging.INFO
    )


async def test_an_outage_is_retried_with_capped_backoff_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="llmgw.agent")
    time = FakeTime(until=1300)
    service = FakeService(clock=time)
    # Down for twenty minutes, then back on an empty database.
    time.at(5, lambda: setattr(service, "down", True))
    time.at(1205, lambda: (setattr(service, "down", False), service.restart_empty()))
    await run(time, service)

    delays = [delay for at, delay in time.sleeps if 10 <= at < 1205]
    assert delays[:7] == [1, 2, 4, 8, 16, 32, 60]
    assert set(delays[6:]) == {60}, "capped at max_backoff"
    assert len(delays) > 20, "it never gave up"

    assert len(messages(caplog, logging.WARNING)) == 1
    (back,) = [m for m in messages(caplog, logging.INFO) if "is back" in m]
    assert f"after {len(delays)} failed attempts" in back
    # Back up with nothing: the full report, overdue by then, goes first.
    assert service.kinds(since=1205)[:2] == ["register", "heartbeat"]
    assert service.nodes["gpu-07"] == as_sent(node_report())


async def test_an_outage_that_changes_nature_is_logged_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    time = FakeTime(until=400)
    service = FakeService(clock=time)
    time.at(5, lambda: setattr(service, "down", True))
    time.at(200, lambda: (setattr(service, "down", False), setattr(service, "status", 401)))
    await run(time, service)
    warnings = messages(caplog, logging.WARNING)
    assert len(warnings) == 2
    assert "Connection refused" in warnings[0] and "token" in warnings[1]


async def test_a_refused_report_is_logged_once_and_the_node_keeps_heartbeating(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    time, node = FakeTime(until=700), Node()
    service = FakeService(clock=time)

    def break_the_report() -> None:
        node.report = node_report(healthy=False)
        service.rejecting = ("input.gpus[1].healthReasons[0]", "ecc_uncorrected")

    time.at(15, break_the_report)
    time.at(500, lambda: setattr(service, "rejecting", None))
    await run(time, service, node)

    registers = [at for at, kind in service.calls if kind == "register"]
    # Sent at 30 and refused, retried after 10, 20, 40, 80, 160 s: not every heartbeat.
    assert registers[:7] == [0, 30, 40, 60, 100, 180, 340]
    heartbeats = [at for at, kind in service.calls if kind == "heartbeat" and 30 < at < 500]
    assert len(heartbeats) >= 40, "the node stayed alive on its last good report"
    (error,) = messages(caplog, logging.ERROR)
    assert "input.gpus[1].healthReasons[0]" in error and "ecc_uncorrected" in error
    # Accepted at the first retry after the service changed its mind.
    assert service.nodes["gpu-07"]["gpus"][1]["healthy"] is False


async def test_a_node_whose_first_report_is_refused_waits_instead_of_spinning() -> None:
    time = FakeTime(until=200)
    service = FakeService(clock=time)
    service.rejecting = ("input.mgmtAddr", "")
    await run(time, service)
    assert service.kinds() == ["register"] * 5  # at 0, 10, 30, 70, 150
    assert all(delay > 0 for _, delay in time.sleeps)


async def test_a_discovery_warning_is_logged_once_while_it_lasts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.agent")
    time, node = FakeTime(until=200), Node()
    missing = "model directory /mnt/filer/models does not exist (an unmounted filer?): skipped"
    node.report = Report(node_report().node_input, (missing,))
    time.at(70, lambda: setattr(node, "report", node_report()))
    time.at(130, lambda: setattr(node, "report", Report(node_report().node_input, (missing,))))
    await run(time, node=node)
    assert messages(caplog, logging.WARNING) == [missing, missing]


async def test_the_agent_stops_at_once_even_with_a_request_hanging() -> None:
    service = FakeService()
    service.hang = True
    client = InventoryClient(
        "http://inventory.test/graphql", None, 600, transport=service.transport()
    )
    stop = asyncio.Event()
    running = asyncio.ensure_future(
        run_until_stopped(Agent(CONFIG, client, Node().survey).run(), stop)
    )

    await asyncio.wait_for(service.hanging.wait(), timeout=10)
    stop.set()
    # Generous: the requirement is a second; anything but a hang passes.
    await asyncio.wait_for(running, timeout=5)
    await client.aclose()


def test_backoff_doubles_with_jitter_up_to_its_cap_and_starts_over_after_success() -> None:
    draws = iter([0.0, 1.0] * 10)
    backoff = Backoff(first=1, cap=60, rand=lambda: next(draws))
    delays = [backoff.next() for _ in range(10)]
    # Each delay is 50-100% of 1, 2, 4, ... capped at 60.
    assert delays == [0.5, 2, 2, 8, 8, 32, 30, 60, 30, 60]
    backoff.reset()
    assert backoff.next() == 0.5


def test_a_week_long_outage_does_not_overflow_the_backoff() -> None:
    backoff = Backoff(first=1, cap=60, rand=lambda: 1.0)
    assert [backoff.next() for _ in range(10_000)][-1] == 60


async def test_the_agent_learns_which_weights_are_pinned_from_every_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    time, node = FakeTime(until=100), Node()
    with_weights = dict(node.report.node_input)
    with_weights["weights"] = [{"path": "/data/models/llama", "sizeBytes": 1, "state": "READY"}]
    node.report = Report(with_weights)
    service = FakeService(clock=time)
    # Placed at 25 and released at 55, both between reports (at 0 and 300):
    # only the heartbeats' answers can tell the node.
    time.at(25, lambda: setattr(service, "pins", {"/data/models/llama": ["chat"]}))
    time.at(55, lambda: setattr(service, "pins", {}))
    watching = replace(CONFIG, model_dirs=("/data/models",))
    await run(time, service, node, watching)
    assert service.kinds() == ["register"] + ["heartbeat"] * 9
    assert [m for m in messages(caplog, logging.INFO) if m.startswith("weights ")] == [
        "weights /data/models/llama are pinned by chat: keep them",
        "weights /data/models/llama are no longer pinned",
    ]
    # Every exchange asked for the pins, and nothing else did.
    assert all(b"pinnedBy" in r.content for r in service.requests)


async def test_an_agent_without_model_dirs_does_not_ask_for_pins() -> None:
    # Its heartbeats stay leaf-only: the service's compiled route answers them.
    service, _ = await run(FakeTime(until=35))
    assert service.kinds() == ["register", "heartbeat", "heartbeat", "heartbeat"]
    assert not any(b"pinnedBy" in r.content for r in service.requests)
