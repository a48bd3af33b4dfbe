"""Nodes that stop heartbeating become unreachable, then lost; a lost node's replicas are released whole.

The sweep is driven directly here (service.fleet.liveness.sweep in a transaction);
a node's silence is made by moving its last heartbeat into the past on the
database's clock, which is the clock the sweep reads. The live-process proof
(short real timeouts, two processes sweeping at once) is in test_subscription.py.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.connections import Connection
from service.database.transactions import in_transaction
from service.fleet.liveness import SweepResult, Watch, sweep
from tests.support.api import Api
from tests.support.liveness import IB_A, LOST_AFTER, UNREACHABLE_AFTER, place, run_sweep, silence
from tests.support.reports import REGISTER, node_input

NODE = """
query Node($id: ID!) {
  node(id: $id) { id state stateReason schedulable freeGpus { index } allocations { shardId } }
}
"""

HEARTBEAT = "mutation Beat($id: ID!) { heartbeat(nodeId: $id) { id state stateReason } }"

EVENTS = """
query Events($nodeId: ID, $replicaId: ID, $kinds: [String!]) {
  events(nodeId: $nodeId, replicaId: $replicaId, kinds: $kinds) {
    id kind nodeId replicaId shardId actor reason detail
  }
}
"""


async def node(api: Api, node_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await api(NODE, {"id": node_id}))["node"]
    return found


async def events(api: Api, **filters: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await api(EVENTS, filters))["events"]
    return found


async def two_nodes_sharing_a_replica(api: Api, engine: AsyncEngine) -> None:
    for node_id in ("gpu-01", "gpu-02"):
        await api(REGISTER, {"input": node_input(node_id, fabrics=IB_A)})
    await place(engine, "llama-70b-r1", {"gpu-01": [0, 1, 2, 3], "gpu-02": [0, 1, 2, 3]})
    await place(engine, "small-r1", {"gpu-02": [4, 5]})


async def test_a_silent_node_goes_unreachable_then_lost_and_comes_back_empty(
    api: Api, engine: AsyncEngine
) -> None:
    await two_nodes_sharing_a_replica(api, engine)

    await silence(engine, "gpu-01", UNREACHABLE_AFTER + 5)
    result = await run_sweep(engine)
    assert result.unreachable == ("gpu-01",) and result.lost == ()
    got = await node(api, "gpu-01")
    assert got["state"] == "UNREACHABLE" and got["schedulable"] is False
    assert "no heartbeat" in got["stateReason"]
    # Unreachable may come back: its replica is left in place.
    assert len(got["allocations"]) == 1

    await silence(engine, "gpu-01", LOST_AFTER + 5)
    result = await run_sweep(engine)
    assert result.lost == ("gpu-01",)
    assert [r.replica_id for r in result.released] == ["llama-70b-r1"]
    assert (await node(api, "gpu-01"))["state"] == "LOST"
    # Released whole: its shard on the healthy node went too; the other replica stayed.
    healthy = await node(api, "gpu-02")
    assert healthy["state"] == "READY"
    assert [a["shardId"] for a in healthy["allocations"]] == ["small-r1/gpu-02"]
    assert [g["index"] for g in healthy["freeGpus"]] == [0, 1, 2, 3, 6, 7]

    # One release event per shard, each in its own node's history.
    released = await events(api, replicaId="llama-70b-r1", kinds=["released"])
    assert sorted((e["nodeId"], e["shardId"]) for e in released) == [
        ("gpu-01", "llama-70b-r1/gpu-01"),
        ("gpu-02", "llama-70b-r1/gpu-02"),
    ]
    assert {e["actor"] for e in released} == {"liveness-sweep"}
    assert all("gpu-01 lost" in e["reason"] for e in released)
    assert [e["kind"] for e in await events(api, nodeId="gpu-01")] == [
        "registered",
        "unreachable",
        "lost",
        "released",
    ]

    back = (await api(HEARTBEAT, {"id": "gpu-01"}))["heartbeat"]
    assert (back["state"], back["stateReason"]) == ("READY", None)
    got = await node(api, "gpu-01")
    assert got["allocations"] == []
    assert [g["index"] for g in got["freeGpus"]] == list(range(8))
    assert (await events(api, nodeId="gpu-01"))[-1]["kind"] == "back"


async def test_a_cordoned_node_that_goes_unreachable_comes_back_cordoned(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    await api('mutation { cordonNode(id: "gpu-01", reason: "DIMM errors, ticket 4411") { id } }')

    await silence(engine, "gpu-01", UNREACHABLE_AFTER + 5)
    await run_sweep(engine)
    got = await node(api, "gpu-01")
    assert got["state"] == "UNREACHABLE"

    back = (await api(HEARTBEAT, {"id": "gpu-01"}))["heartbeat"]
    assert (back["state"], back["stateReason"]) == ("CORDONED", "DIMM errors, ticket 4411")


async def test_a_draining_node_that_was_lost_comes_back_draining(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    await api('mutation { drainNode(id: "gpu-01", reason: "moving racks") { id } }')
    await silence(engine, "gpu-01", LOST_AFTER + 5)
    await run_sweep(engine)
    assert (await node(api, "gpu-01"))["state"] == "LOST"

    # Re-registering (an agent restarting) brings it back too, its drain intact.
    back = (await api(REGISTER, {"input": node_input("gpu-01")}))["registerNode"]
    assert (back["state"], back["stateReason"]) == ("DRAINING", "moving racks")


async def test_a_node_silent_past_lost_after_goes_straight_to_lost(
    api: Api, engine: AsyncEngine
) -> None:
    await two_nodes_sharing_a_replica(api, engine)
    await silence(engine, "gpu-01", LOST_AFTER + 60)
    result = await run_sweep(engine)
    assert (result.unreachable, result.lost) == ((), ("gpu-01",))
    assert [r.replica_id for r in result.released] == ["llama-70b-r1"]


async def test_nodes_that_heartbeat_are_left_alone(api: Api, engine: AsyncEngine) -> None:
    await two_nodes_sharing_a_replica(api, engine)
    await silence(engine, "gpu-01", UNREACHABLE_AFTER - 5)
    result = await run_sweep(engine)
    assert (result.unreachable, result.lost, result.released) == ((), (), ())
    assert (await node(api, "gpu-01"))["state"] == "READY"


async def test_sweeps_running_at_once_release_each_replica_once(
    api: Api, engine: AsyncEngine
) -> None:
    await two_nodes_sharing_a_replica(api, engine)
    await api(REGISTER, {"input": node_input("gpu-03", fabrics=IB_A)})
    # A replica on two nodes that are lost together is still released once.
    await place(engine, "both-lost-r1", {"gpu-01": [6, 7], "gpu-03": [0, 1]})
    await silence(engine, "gpu-01", LOST_AFTER + 5)
    await silence(engine, "gpu-03", LOST_AFTER + 5)

    results = await asyncio.gather(*(run_sweep(engine) for _ in range(4)))

    released = sorted(r.replica_id for result in results for r in result.released)
    assert released == ["both-lost-r1", "llama-70b-r1"]
    assert sorted(n for result in results for n in result.lost) == ["gpu-01", "gpu-03"]
    # Each shard released once: one event each, none twice.
    release_events = await events(api, kinds=["released"])
    assert sorted(e["shardId"] for e in release_events) == [
        "both-lost-r1/gpu-01",
        "both-lost-r1/gpu-03",
        "llama-70b-r1/gpu-01",
        "llama-70b-r1/gpu-02",
    ]
    assert len(await events(api, kinds=["lost"])) == 2


async def test_the_sweep_forgets_events_older_than_the_retention(
    api: Api, engine: AsyncEngine
) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    await api('mutation { cordonNode(id: "gpu-01", reason: "old news") { id } }')
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE events SET at = now() - interval '2 hours' WHERE kind = 'registered'")
        )

    async def work(conn: Connection) -> SweepResult:
        return await sweep(conn, UNREACHABLE_AFTER, LOST_AFTER, event_retention=3600)

    result = await in_transaction(engine, work)
    assert result.events_pruned == 1
    assert [e["kind"] for e in await events(api, nodeId="gpu-01")] == ["cordoned"]


async def test_silence_counts_only_from_when_the_service_was_watching(
    api: Api, engine: AsyncEngine
) -> None:
    await two_nodes_sharing_a_replica(api, engine)
    await silence(engine, "gpu-01", LOST_AFTER + 60)
    await silence(engine, "gpu-02", LOST_AFTER + 60)

    # The service (or its database) was down until a minute ago: no agent
    # could heartbeat, so ten minutes of "silence" prove one minute of it.
    async def work(conn: Connection) -> SweepResult:
        watching_since = (
            await conn.execute(text("SELECT now() - interval '60 seconds'"))
        ).scalar_one()
        return await sweep(conn, UNREACHABLE_AFTER, LOST_AFTER, observing_since=watching_since)

    result = await in_transaction(engine, work)
    assert result.unreachable == ("gpu-01", "gpu-02")
    assert (result.lost, result.released) == ((), ())
    assert len((await node(api, "gpu-02"))["allocations"]) == 2


def test_the_watch_restarts_after_a_failed_round_or_a_stall() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    watch = Watch(stall=30)
    watch.succeeded(start)
    watch.succeeded(start + timedelta(seconds=5))
    assert watch.since(start + timedelta(seconds=10)) == start

    watch.failed()
    assert watch.since(start + timedelta(seconds=15)) == start + timedelta(seconds=15)
    watch.succeeded(start + timedelta(seconds=15))
    # A round that comes 60 s after the last (the process was frozen): start over.
    late = start + timedelta(seconds=75)
    assert watch.since(late) == late
