"""Soak: two service processes, 32 schedulers placing and releasing, nodes partitioned and returning at random.

Each simulated node keeps the engines it runs (shard, fence, GPUs) and
beats with them as a fenced agent does; an engine starts when its scheduler
reaches the node after a placement and stops when the scheduler (after a
release) or the inventory (shardsToStop) says so. A partitioned node neither
beats nor hears its schedulers, so its engines outlive their shards: the
liveness sweepers (both processes, short real timeouts) mark it lost and
free or hold its replicas, and the schedulers place new replicas on what was
freed.

Afterwards, once every node has beaten with its engines again: every GPU an
engine runs is held in the database by exactly that engine's shard and fence,
or the engine was told to stop (and so no longer runs). The counts are
printed. The run lasts SOAK_SECONDS per policy (default 12: the default
suite stays fast; set it higher for a longer soak).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.reports import REGISTER, node_input

pytestmark = pytest.mark.serial

SECONDS = float(os.environ.get("SOAK_SECONDS", "12"))
NODES = [f"soak-{i:02d}" for i in range(8)]
SCHEDULERS = 32
BEAT_EVERY = 0.25

ENV = {
    "INVENTORY_UNREACHABLE_AFTER": "1",
    "INVENTORY_LOST_AFTER": "3",
    "INVENTORY_SWEEP_INTERVAL": "0.25",
}

PLACE = """
mutation Place($input: PlaceInput!) {
  place(input: $input) {
    __typename
    ... on Allocated { allocations { shardId nodeId gpuIndices fence generation } }
  }
}
"""
RELEASE = "mutation R($id: ID!, $g: Int) { releaseReplica(replicaId: $id, generation: $g) }"
BEAT = """
mutation Beat($id: ID!, $incarnation: Int, $running: [RunningShardInput!]) {
  heartbeat(nodeId: $id, incarnation: $incarnation, runningShards: $running) {
    incarnation shardsToStop { shardId fence reason }
  }
}
"""


@dataclass(frozen=True)
class Engine:
    shard_id: str
    fence: int
    gpus: tuple[int, ...]


@dataclass
class SimulatedNode:
    node_id: str
    engines: dict[str, Engine] = field(default_factory=dict)
    partitioned_until: float = 0.0
    incarnation: int | None = None
    beats: int = 0
    # When this node is partitioned past LOST_AFTER whatever the dice say,
    # so every run has at least one loss with engines running.
    forced_partition_at: float | None = None

    def reachable(self) -> bool:
        return time.monotonic() >= self.partitioned_until


@dataclass
class Counts:
    c: Counter[str] = field(default_factory=Counter)

    def __call__(self, name: str, n: int = 1) -> None:
        self.c[name] += n


class Cluster:
    def __init__(self, client: httpx.AsyncClient, urls: list[str], rng: random.Random) -> None:
        self.client = client
        self.urls = urls
        self.rng = rng
        self.nodes = {n: SimulatedNode(n) for n in NODES}
        self.counts = Counts()
        self.beaten = asyncio.Event()  # set at each beat answered

    async def call(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        url = self.rng.choice(self.urls)
        body: dict[str, Any] = (
            await self.client.post(url, json={"query": query, "variables": variables})
        ).json()
        return body

    async def beat(self, node: SimulatedNode) -> None:
        running = [{"shardId": e.shard_id, "fence": e.fence} for e in node.engines.values()]
        body = await self.call(
            BEAT, {"id": node.node_id, "incarnation": node.incarnation, "running": running}
        )
        assert not body.get("errors"), body
        answer = body["data"]["heartbeat"]
        if node.incarnation is not None and answer["incarnation"] > node.incarnation:
            self.counts("came back in a new incarnation")
        node.incarnation = answer["incarnation"]
        node.beats += 1
        self.beaten.set()
        for stop in answer["shardsToStop"]:
            engine = node.engines.get(stop["shardId"])
            if engine is not None and engine.fence == stop["fence"]:
                del node.engines[stop["shardId"]]
                self.counts(f"engines told to stop: {stop['reason']}")

    async def agent(self, node: SimulatedNode, until: float, done: asyncio.Event) -> None:
        """Beats until `done`; partitioned at random before `until` only."""
        while not done.is_set():
            forced = node.forced_partition_at
            if forced is not None and time.monotonic() >= forced:
                node.forced_partition_at = None
                node.partitioned_until = time.monotonic() + float(ENV["INVENTORY_LOST_AFTER"]) + 2
                self.counts("partitions")
            if node.reachable():
                if time.monotonic() < until and self.rng.random() < 0.06:
                    # Partitioned: sometimes past LOST_AFTER, sometimes not.
                    node.partitioned_until = time.monotonic() + self.rng.uniform(1.0, 7.0)
                    self.counts("partitions")
                else:
                    await self.beat(node)
            await asyncio.sleep(BEAT_EVERY)

    async def scheduler(self, number: int, until: float) -> None:
        serial = 0
        while time.monotonic() < until:
            serial += 1
            replica = f"s{number}-r{serial}"
            body = await self.call(
                PLACE,
                {
                    "input": {
                        "replicaId": replica,
                        "gpuClass": "H100-80GB",
                        "gpusPerShard": self.rng.choice((1, 2, 4)),
                    }
                },
            )
            answer = body["data"]["place"]
            if answer["__typename"] != "Allocated":
                self.counts(f"place answered {answer['__typename']}")
                await asyncio.sleep(self.rng.uniform(0.05, 0.2))
                continue
            self.counts("placed")
            (shard,) = answer["allocations"]
            node = self.nodes[shard["nodeId"]]
            generation = shard["generation"]
            if not node.reachable():
                # The engine cannot be started: give the GPUs back.
                self.counts("engine start failed (node unreachable)")
                await self.release(replica, generation)
                continue
            node.engines[shard["shardId"]] = Engine(
                shard["shardId"], shard["fence"], tuple(shard["gpuIndices"])
            )
            # Most replicas serve briefly, some past LOST_AFTER: those are
            # the ones a partition catches running.
            short = self.rng.random() < 0.7
            serve_for = self.rng.uniform(0.1, 3.0) if short else self.rng.uniform(3.0, 8.0)
            if time.monotonic() + serve_for > until:
                # A long-lived replica: still serving when the run ends.
                self.counts("replicas left serving at the end")
                return
            await asyncio.sleep(serve_for)
            await self.release(replica, generation)
            if node.reachable():
                node.engines.pop(shard["shardId"], None)
            else:
                # The stop cannot reach it: the engine runs on until the
                # inventory tells the node.
                self.counts("engine left running (node unreachable at release)")

    async def release(self, replica: str, generation: int) -> None:
        body = await self.call(RELEASE, {"id": replica, "g": generation})
        if body.get("errors"):
            assert body["errors"][0]["extensions"]["code"] == "CONFLICT", body
            self.counts("release answered CONFLICT")
        elif body["data"]["releaseReplica"] == 0:
            self.counts("release found the replica already freed")
        else:
            self.counts("released")


@pytest.mark.parametrize("policy", ["free", "hold"])
async def test_every_running_engine_is_held_or_told_to_stop(
    policy: str, live_service_factory: Any, engine: AsyncEngine
) -> None:
    env = {**ENV, "INVENTORY_LOST_POLICY": policy}
    first, second = await asyncio.gather(
        asyncio.to_thread(live_service_factory, env), asyncio.to_thread(live_service_factory, env)
    )
    rng = random.Random(32)
    async with httpx.AsyncClient(timeout=60) as client:
        cluster = Cluster(client, [first.url, second.url], rng)
        for node_id in NODES:
            body = await cluster.call(REGISTER, {"input": node_input(node_id)})
            assert not body.get("errors"), body
        until = time.monotonic() + SECONDS
        cluster.nodes[NODES[0]].forced_partition_at = time.monotonic() + SECONDS / 3
        done = asyncio.Event()
        agents = [
            asyncio.create_task(cluster.agent(n, until, done)) for n in cluster.nodes.values()
        ]
        await asyncio.gather(*(cluster.scheduler(i, until) for i in range(SCHEDULERS)))
        # Every partition heals; the agents go on beating with what they run
        # until each has beaten twice more (the first may bring it back from
        # LOST and reconcile), then stop, so nothing changes while the
        # database is read below (each beat well within LOST_AFTER of it).
        for node in cluster.nodes.values():
            node.partitioned_until = 0.0
        settled = {n.node_id: n.beats + 2 for n in cluster.nodes.values()}
        while any(n.beats < settled[n.node_id] for n in cluster.nodes.values()):
            cluster.beaten.clear()
            await cluster.beaten.wait()
        done.set()
        await asyncio.gather(*agents)

    async with engine.connect() as conn:
        held = {
            (r.node_id, r.gpu_index): (r.shard_id, r.fence)
            for r in await conn.execute(
                text(
                    "SELECT a.node_id, a.gpu_index, s.shard_id, s.fence FROM allocated_gpus a"
                    " JOIN shards s ON s.shard_id = a.shard_id"
                )
            )
        }
        kinds: dict[str, int] = {
            r.kind: r.n
            for r in await conn.execute(
                text("SELECT kind, count(*) AS n FROM events GROUP BY kind")
            )
        }
    lost = kinds.get("lost", 0)

    engines = 0
    run: set[tuple[str, int]] = set()
    for node in cluster.nodes.values():
        for running in node.engines.values():
            engines += 1
            for gpu in running.gpus:
                assert (node.node_id, gpu) not in run, f"two engines on {node.node_id} GPU {gpu}"
                run.add((node.node_id, gpu))
                assert held.get((node.node_id, gpu)) == (running.shard_id, running.fence), (
                    f"{node.node_id} GPU {gpu} runs {running} but the inventory holds "
                    f"{held.get((node.node_id, gpu))}"
                )
    counts = cluster.counts.c
    print(
        f"\nsoak ({policy}, {SECONDS:g} s, {SCHEDULERS} schedulers, {len(NODES)} nodes, 2 "
        f"processes): engines still running {engines}, GPUs held {len(held)}; events: "
        + ", ".join(
            f"{kind} {kinds.get(kind, 0)}"
            for kind in (
                "lost",
                "back",
                "replica_held_while_lost",
                "replica_reconciled",
                "replica_freed_after_loss",
            )
        )
    )
    for name, n in sorted(counts.items()):
        print(f"  {name}: {n}")
    assert counts["placed"] > 0 and counts["partitions"] > 0 and lost > 0
    # And the other way: no GPU stays held for a shard that no engine runs
    # (each was released, freed after a loss, or reconciled away).
    assert set(held) == run
