"""The shards this node's engines run, as the serving stack writes them, and stopping the ones the inventory fences off.

The serving stack (whatever starts the engines) writes what runs, in one of
two places named by the `running_shards` key (docs/operations/fencing.md):

- a file (an absolute path): written whole and renamed into place, so a
  reader never sees half of it;
- a small local HTTP endpoint (an http:// URL on a loopback address),
  answering GET with the same document.

The document, in both cases:

    {"shards": [{"shardId": "llama-70b-r1/0", "fence": 4711}, ...]}

A source that is missing, unreachable or malformed says nothing (None, and a
warning): the agent then sends no runningShards, and the service neither
reconciles nor tells it to stop anything. An empty list says the engines run
nothing, which under the hold policy frees every held shard of the node:
only a source that knows should say it.

Stopping: the inventory answers each heartbeat and report with the shards to
stop. With `stop_command` configured, StopCommands runs it once per shard and
fence ({shard_id} and {fence} in its arguments are replaced), with a
timeout; a failure or timeout is logged and the command runs again when a
later answer still lists the shard. It only ever runs for a shard the latest
answer listed, so never for one the inventory holds for this node.
"""

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

log = logging.getLogger("llmgw.agent")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class RunningShard:
    shard_id: str
    fence: int

    def as_input(self) -> dict[str, Any]:
        return {"shardId": self.shard_id, "fence": self.fence}


@dataclass(frozen=True)
class ShardToStop:
    shard_id: str
    fence: int
    reason: str


class MalformedShards(ValueError):
    """The serving stack's document is not the documented shape."""


def parse_running(text: str) -> tuple[RunningShard, ...]:
    """The document's shards; MalformedShards naming what is wrong."""
    try:
        document = json.loads(text)
    except ValueError as e:
        raise MalformedShards(f"not JSON: {e}") from e
    shards = document.get("shards") if isinstance(document, dict) else None
    if not isinstance(shards, list):
        raise MalformedShards('expected {"shards": [{"shardId": ..., "fence": ...}, ...]}')
    found: list[RunningShard] = []
    for i, entry in enumerate(shards):
        if not isinstance(entry, dict):
            raise MalformedShards(f"shards[{i}] is not an object")
        shard_id, fence = entry.get("shardId"), entry.get("fence")
        if not isinstance(shard_id, str) or not shard_id:
            raise MalformedShards(f"shards[{i}].shardId must be a non-empty string")
        if isinstance(fence, bool) or not isinstance(fence, int):
            raise MalformedShards(f"shards[{i}].fence must be an integer")
        found.append(RunningShard(shard_id, fence))
    return tuple(found)


def is_loopback_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS


class RunningShardsSource:
    """Reads the serving stack's document from a file or a loopback URL."""

    def __init__(
        self, where: str, timeout: float, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.where = where
        self._timeout = timeout
        self._transport = transport
        self._complaint: str | None = None

    async def read(self) -> tuple[RunningShard, ...] | None:
        """What runs now; None (logged once while it lasts) when the source cannot say."""
        try:
            text = await self._fetch()
            shards = parse_running(text)
        except (OSError, httpx.HTTPError, MalformedShards) as e:
            self._complain(f"cannot read running shards from {self.where}: {e}")
            return None
        if self._complaint is not None:
            log.info("running shards readable again from %s", self.where)
            self._complaint = None
        return shards

    async def _fetch(self) -> str:
        if self.where.startswith("/"):
            return await asyncio.to_thread(_read_text, self.where)
        async with httpx.AsyncClient(timeout=self._timeout, transport=self._transport) as http:
            response = await http.get(self.where)
            response.raise_for_status()
            return response.text

    def _complain(self, message: str) -> None:
        if message != self._complaint:
            log.warning("%s; sending no runningShards until it is readable", message)
            self._complaint = message


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


@dataclass
class StopCommands:
    """Runs stop_command once per (shard, fence) the inventory says to stop; failures retried."""

    command: Sequence[str]
    timeout: float
    # (shard id, fence) whose command succeeded: never run again.
    done: set[tuple[str, int]] = field(default_factory=set)
    failures: int = 0

    async def stop(self, stops: Sequence[ShardToStop]) -> None:
        for stop in stops:
            key = (stop.shard_id, stop.fence)
            if key in self.done:
                continue
            argv = [
                arg.replace("{shard_id}", stop.shard_id).replace("{fence}", str(stop.fence))
                for arg in self.command
            ]
            problem = await self._run(argv)
            if problem is None:
                self.done.add(key)
                log.info("stopped shard %s (fence %d): %s", stop.shard_id, stop.fence, argv[0])
            else:
                self.failures += 1
                log.error(
                    "stop_command for shard %s (fence %d) failed: %s; retried while the "
                    "inventory still says to stop it",
                    stop.shard_id,
                    stop.fence,
                    problem,
                )

    async def _run(self, argv: list[str]) -> str | None:
        started = time.monotonic()
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
        except OSError as e:
            return f"cannot start {argv[0]!r}: {e.strerror or e}"
        try:
            _, stderr = await asyncio.wait_for(process.communicate(), self.timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            return f"still running after {self.timeout:g} s: killed"
        if process.returncode != 0:
            tail = stderr.decode(errors="replace").strip().splitlines()[-1:] if stderr else []
            said = f": {tail[0]}" if tail else ""
            return f"exit status {process.returncode}{said}"
        log.debug("stop_command took %.1f s", time.monotonic() - started)
        return None


def log_stops(stops: Sequence[ShardToStop], node_id: str) -> None:
    for stop in stops:
        log.warning(
            "the inventory says node %s must stop shard %s (fence %d): %s",
            node_id,
            stop.shard_id,
            stop.fence,
            stop.reason,
        )
