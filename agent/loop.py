"""The agent's loop: register, heartbeat, re-send the report when it changes.

The agent is the only writer of its node's report, so it must never give up:
a service that is down or failing is retried with capped, jittered backoff
forever, and logged once per outage rather than once per try (an agent that
logs every retry for an hour-long outage fills the journal and buries the one
line that said what went wrong).
"""

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import Any

from agent.backoff import Backoff
from agent.client import (
    Fencing,
    InventoryClient,
    NodeNotFound,
    NodeStatus,
    ReportRejected,
    ServiceError,
    ServiceUnavailable,
)
from agent.config import AgentConfig
from agent.discovery.resets import ResetWatch, with_resets
from agent.discovery.xids import XidInbox, with_xids
from agent.report import Report, utc_now
from agent.running_shards import RunningShard, RunningShardsSource, StopCommands, log_stops
from agent.threads import in_daemon_thread
from agent.validations import ValidationOutcome, Validations

log = logging.getLogger("llmgw.agent")


class Outage:
    """Logs the start and the end of a run of failures, not every failure in it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.failures = 0
        self._since = 0.0
        self._kind: str | None = None

    def failed(self, error: Exception) -> None:
        kind = f"{type(error).__name__}:{getattr(error, 'code', '')}"
        if self.failures == 0:
            self._since = self._clock()
        if kind != self._kind:
            # Once per outage, and again only if the failure changes nature
            # (refused connections turning into a refused token is news).
            log.warning(
                "the inventory service is failing: %s; retrying with backoff "
                "(logged again when it recovers)",
                error,
            )
            self._kind = kind
        else:
            log.debug("still failing (attempt %d): %s", self.failures + 1, error)
        self.failures += 1

    def recovered(self) -> None:
        if self.failures:
            log.info(
                "the inventory service is back after %d failed attempts over %.0f s",
                self.failures,
                self._clock() - self._since,
            )
        self.failures = 0
        self._kind = None


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        client: InventoryClient,
        survey: Callable[[], Report],
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        xids: XidInbox | None = None,
        resets: ResetWatch | None = None,
        running_source: RunningShardsSource | None = None,
        wall_clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.config = config
        # What sentAt reads: the service measures this clock against its own.
        self._wall_clock = wall_clock
        self.client = client
        self._survey_now = survey
        self._sleep = sleep
        self._clock = clock
        self._retry = Backoff(first=1.0, cap=config.max_backoff, rand=rand)
        # A refused report waits longer between tries: the service is up and
        # answering, and only a change on the node will make it accept.
        self._rejections = Backoff(
            first=config.heartbeat_interval, cap=config.full_report_interval, rand=rand
        )
        self.outage = Outage(clock)
        self.registered = False
        self.sent: Report | None = None
        self._sent_at = 0.0
        self._rejected_digest: str | None = None
        self._retry_register_at = 0.0
        self._warned: frozenset[str] = frozenset()
        self._state: tuple[str, str | None] | None = None
        # XIDs heard from the driver (agent/discovery/xids.py): each wakes the loop for
        # a full report at once.
        self._xids = xids
        self._xid_arrived: asyncio.Event | None = None
        # GPU resets seen between scans (agent/discovery/resets.py): sent with
        # the next report, as XIDs are.
        self._resets = resets
        # Fencing (agent/running_shards.py): the incarnation last seen, what
        # the engines run, and the command that stops what must stop.
        if running_source is None and config.running_shards is not None:
            running_source = RunningShardsSource(config.running_shards, config.request_timeout)
        self._running_source = running_source
        self.incarnation: int | None = None
        self.stop_commands = (
            StopCommands(config.stop_command, config.stop_timeout)
            if config.stop_command is not None
            else None
        )
        # Running shards the service refused (BAD_INPUT naming runningShards):
        # not sent again while the source says exactly the same, so a broken
        # serving stack cannot stop the node's heartbeats.
        self._refused_running: tuple[RunningShard, ...] | None = None
        # Weights path -> replica ids pinning it, as the service's last answer
        # said (each heartbeat's and report's, when model_dirs is configured):
        # whatever deletes weights on this node must keep these.
        self._watches_weights = bool(config.model_dirs)
        self.pinned: dict[str, tuple[str, ...]] = {}
        # Validation before re-admission (agent/validations.py): asked after
        # each full report when the node has commands for tests.
        self.validations = Validations(config.validations) if config.validations else None

    async def survey(self) -> Report | None:
        """The node as it is now; None if discovery itself broke (a bug, logged)."""
        try:
            report = await in_daemon_thread(self._survey_now)
        except Exception:
            log.exception("discovering the node failed; keeping the last report")
            return None
        # Each warning once while it lasts: the same missing filer every
        # minute is one fact, not sixty.
        for warning in report.warnings:
            if warning not in self._warned:
                log.warning("%s", warning)
        self._warned = frozenset(report.warnings)
        return report

    async def register_once(self) -> NodeStatus:
        """Register the node now; errors are the caller's (`--once`)."""
        report = await self.survey()
        if report is None:
            raise RuntimeError("discovery failed; see the log")
        xids, resets = self._take_owed()
        try:
            status = await self.client.register_node(
                self._sent(_with_owed(report.node_input, xids, resets))
            )
        except BaseException:
            self._give_back_owed(xids, resets)
            raise
        self._note(status)
        return status

    async def run(self) -> None:
        """Forever: cancel the task to stop it."""
        report: Report | None = None
        next_survey = self._clock()
        if self._xids is not None:
            self._xid_arrived = self._xids.bind()
        while True:
            now = self._clock()
            if now >= next_survey or self._xids_waiting():
                # An XID goes out with the node as it is now: its health may
                # have changed with it.
                report = await self.survey() or report
                next_survey = now + self.config.scan_interval
            if report is None:
                await self._pause(self._retry.next())
                continue
            await self._pause(await self.step(report, now))

    def _xids_waiting(self) -> bool:
        return self._xids is not None and self._xids.waiting()

    def _owed(self) -> bool:
        """XIDs or resets heard that the service does not have yet: a report is due."""
        return self._xids_waiting() or (self._resets is not None and self._resets.waiting())

    def _take_owed(self) -> tuple[dict[int, list[int]], dict[str, str]]:
        xids = self._xids.take() if self._xids is not None else {}
        resets = self._resets.take() if self._resets is not None else {}
        return xids, resets

    def _give_back_owed(self, xids: dict[int, list[int]], resets: dict[str, str]) -> None:
        """Not stored: they go with the next report that is."""
        if self._xids is not None:
            self._xids.give_back(xids)
        if self._resets is not None:
            self._resets.give_back(resets)

    async def _pause(self, seconds: float) -> None:
        """Sleep, or less when an XID arrives.

        Not while the service is failing or refused the report: the backoff
        paces the next try then, XIDs or not (they wait in the inbox), and
        waking for them would spin.
        """
        arrived = self._xid_arrived
        if arrived is None or self.outage.failures or self._rejected_digest is not None:
            await self._sleep(seconds)
            return
        sleeping = asyncio.ensure_future(self._sleep(seconds))
        woken = asyncio.ensure_future(arrived.wait())
        try:
            await asyncio.wait({sleeping, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeping, woken):
                task.cancel()
            await asyncio.gather(sleeping, woken, return_exceptions=True)
        if sleeping.done() and not sleeping.cancelled():
            sleeping.result()  # what the sleep raised is the loop's to see

    def _action(self, report: Report, now: float) -> str:
        # A report the service refused is not sent again unchanged until its
        # backoff passes; heartbeats keep the node alive on its last good report.
        held_back = report.digest == self._rejected_digest and now < self._retry_register_at
        if not self.registered:
            return "wait" if held_back else "register"
        due = (
            report.changed_since(self.sent)
            or now - self._sent_at >= self.config.full_report_interval
            or self._owed()
        )
        return "register" if due and not held_back else "heartbeat"

    async def step(self, report: Report, now: float) -> float:
        """One exchange with the service; returns how long to wait before the next."""
        action = self._action(report, now)
        if action == "wait":
            return min(self.config.heartbeat_interval, self._retry_register_at - now)
        xids, resets = self._take_owed() if action == "register" else ({}, {})
        fencing = await self._fencing()
        try:
            if action == "register":
                node_input = _with_owed(report.node_input, xids, resets)
                try:
                    status = await self.client.register_node(
                        self._sent(node_input), fencing, self._watches_weights
                    )
                except BaseException:
                    # Not stored: the XIDs and resets go with the next report that is.
                    self._give_back_owed(xids, resets)
                    raise
                self.registered = True
                self.sent = report
                self._sent_at = now
                self._rejected_digest = None
                self._rejections.reset()
                log.debug("report sent for node %s", status.id)
                await self._validate()
            else:
                status = await self.client.heartbeat(
                    self.config.node_id, fencing, self._watches_weights
                )
        except NodeNotFound:
            # The service lost the node (a fresh database) or an operator removed
            # it: the agent is the only one who can put it back.
            self.outage.recovered()
            log.info("the service does not know node %s: registering again", self.config.node_id)
            self.registered = False
            # A new node to the service: no earlier life to compare with.
            self.incarnation = None
            return 0.0
        except ReportRejected as e:
            self.outage.recovered()
            if fencing is not None and self._fencing_refused(e, fencing):
                return 0.0
            if report.digest != self._rejected_digest:
                log.error(
                    "the service rejected this node's report: %s (field %s, value %r); "
                    "it is sent again when it changes, or after a backoff",
                    e,
                    e.field,
                    e.value,
                )
            self._rejected_digest = report.digest
            self._retry_register_at = now + self._rejections.next()
            return min(self.config.heartbeat_interval, self._retry_register_at - now)
        except (ServiceUnavailable, ServiceError) as e:
            self.outage.failed(e)
            return self._retry.next()
        self.outage.recovered()
        self._retry.reset()
        self._note(status)
        if status.pins is not None:
            self._note_pins(status.pins)
        if fencing is not None:
            await self._after_fenced(status)
        return self.config.heartbeat_interval

    async def _validate(self) -> None:
        """Start the tests the inventory asks for now; they report by themselves when done."""
        if self.validations is None:
            return
        node_id = self.config.node_id

        async def report(outcome: ValidationOutcome) -> None:
            await self.client.record_validation(node_id, outcome)

        try:
            await self.validations.check(lambda: self.client.validations_to_run(node_id), report)
        except (ServiceUnavailable, ServiceError, ReportRejected) as e:
            # Asked again after the next report.
            log.warning("could not ask which validations to run: %s", e)

    async def _fencing(self) -> Fencing | None:
        """The fenced operation's variables, or None when running_shards is not configured."""
        if self._running_source is None:
            return None
        running = await self._running_source.read()
        if running is not None and running == self._refused_running:
            running = None
        return Fencing(self.incarnation, running)

    def _fencing_refused(self, error: ReportRejected, fencing: Fencing) -> bool:
        """A refusal of what fencing added (not of the report): drop it and go on at once."""
        field = error.field or ""
        if field == "incarnation":
            # The service's record is the truth (restored from a backup, or
            # this agent is the impostor the service just logged).
            log.error(
                "the service refused incarnation %s for node %s: %s; forgetting it",
                fencing.incarnation,
                self.config.node_id,
                error,
            )
            self.incarnation = None
            return True
        if field.startswith("runningShards"):
            log.error(
                "the service refused the running shards the serving stack reports: %s "
                "(field %s); not sent again until they change",
                error,
                field,
            )
            self._refused_running = fencing.running
            return True
        return False

    async def _after_fenced(self, status: NodeStatus) -> None:
        if status.incarnation is not None:
            if self.incarnation is not None and status.incarnation != self.incarnation:
                log.warning(
                    "node %s is at incarnation %d (was %d): it came back from LOST or rebooted",
                    status.id,
                    status.incarnation,
                    self.incarnation,
                )
            self.incarnation = status.incarnation
        if not status.shards_to_stop:
            return
        log_stops(status.shards_to_stop, status.id)
        if self.stop_commands is not None:
            await self.stop_commands.stop(status.shards_to_stop)

    def _sent(self, node_input: dict[str, Any]) -> dict[str, Any]:
        """The report as it leaves: with sentAt, so the service can tell a wrong clock."""
        return {**node_input, "sentAt": self._wall_clock().isoformat()}

    def _note_pins(self, pinned: dict[str, tuple[str, ...]]) -> None:
        """Keep the pins the service's answer named, and log what changed."""
        for path in sorted(pinned.keys() - self.pinned.keys()):
            log.info("weights %s are pinned by %s: keep them", path, ", ".join(pinned[path]))
        for path in sorted(self.pinned.keys() - pinned.keys()):
            log.info("weights %s are no longer pinned", path)
        self.pinned = pinned

    def _note(self, status: NodeStatus) -> None:
        state = (status.state, status.state_reason)
        if state != self._state:
            reason = f" ({status.state_reason})" if status.state_reason else ""
            log.info("node %s is %s%s", status.id, status.state, reason)
            self._state = state


def _with_owed(
    node_input: dict[str, Any], xids: dict[int, list[int]], resets: dict[str, str]
) -> dict[str, Any]:
    """The report as sent: its GPUs carrying the XIDs and resets heard for them."""
    with_both = with_xids(node_input, xids) if xids else node_input
    return with_resets(with_both, resets)


async def run_until_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> None:
    """Run `work` until it ends or `stop` is set, then cancel it at once.

    Cancelling rather than asking the loop to notice stops it mid-request too:
    SIGTERM must take effect within a second even while a request hangs.
    """
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    for pending in (task, stopper):
        pending.cancel()
    await asyncio.gather(task, stopper, return_exceptions=True)
    if task in done and not task.cancelled():
        task.result()
