"""Two service processes, short timeouts: a node goes silent, both sweep, a subscriber on one sees it all.

This is the whole story with real processes: changes made through process A
reach a subscriber connected to process B (LISTEN/NOTIFY); both processes run
the liveness sweep at once and the lost node's replica is still released
exactly once, on every node it had a shard on; the node heartbeats back to
READY with nothing allocated; and a cordoned node that went unreachable comes
back cordoned, with its reason.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.connections import Connection
from service.database.transactions import in_transaction
from service.event_log.event_stream import LISTENER_NAME, EventStream
from service.event_log.events import EventFilter, record_event
from tests.support.api import Api
from tests.support.liveness import IB_A, place
from tests.support.reports import REGISTER, node_input
from tests.support.subscriptions import subscribe

# Short, but with room for a loaded CI machine: heartbeats the test sends
# every ~0.1 s must never look like a second of silence.
SHORT = {
    "INVENTORY_UNREACHABLE_AFTER": "1",
    "INVENTORY_LOST_AFTER": "2.5",
    "INVENTORY_SWEEP_INTERVAL": "0.1",
}

# From the first stored event (`after`): none is missed however long the
# subscription takes to be registered, then live ones.
EVENTS_SUBSCRIPTION = (
    'subscription { events(after: "0") { id kind nodeId replicaId shardId actor reason } }'
)
HEARTBEAT = "mutation Beat($id: ID!) { heartbeat(nodeId: $id) { id } }"
CORDONED_BEAT = "mutation Beat($id: ID!) { heartbeat(nodeId: $id) { state stateReason } }"


async def test_a_lost_node_seen_live_from_another_process_and_released_once(
    live_service_factory: Any, engine: AsyncEngine
) -> None:
    # Started side by side: each takes a couple of seconds to come up.
    a, b = await asyncio.gather(
        asyncio.to_thread(live_service_factory, SHORT),
        asyncio.to_thread(live_service_factory, SHORT),
    )
    async with (
        httpx.AsyncClient(base_url=a.url.removesuffix("/graphql"), timeout=10) as http_a,
        httpx.AsyncClient(base_url=b.url.removesuffix("/graphql"), timeout=10) as http_b,
        subscribe(b.url, EVENTS_SUBSCRIPTION) as subscriber,
    ):
        api_a, api_b = Api(http_a), Api(http_b)
        for node_id in ("gpu-01", "gpu-02", "gpu-03"):
            await api_a(REGISTER, {"input": node_input(node_id, fabrics=IB_A)})
        await api_b('mutation { cordonNode(id: "gpu-03", reason: "bad DIMM") { id } }')
        await place(engine, "llama-70b-r1", {"gpu-01": [0, 1, 2, 3], "gpu-02": [0, 1, 2, 3]})

        # gpu-02 keeps heartbeating (through A); gpu-01 has gone silent; the
        # cordoned gpu-03 drops off the network and comes back as soon as it
        # is seen unreachable.
        beating = ["gpu-02"]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for node_id in beating:
                await api_a(HEARTBEAT, {"id": node_id})
            event = await subscriber.next_event(within=0.1)
            if event is not None and (event["kind"], event["nodeId"]) == ("unreachable", "gpu-03"):
                returned = (await api_b(CORDONED_BEAT, {"id": "gpu-03"}))["heartbeat"]
                # Back, and still cordoned with the operator's reason.
                assert returned == {"state": "CORDONED", "stateReason": "bad DIMM"}
                beating.append("gpu-03")
            if sum(e["kind"] == "released" for e in subscriber.received) == 2:
                break
        assert beating == ["gpu-02", "gpu-03"], "gpu-03 was never seen unreachable"
        seen = [(e["kind"], e["nodeId"]) for e in subscriber.received]
        # Made through A, seen on B.
        assert ("registered", "gpu-01") in seen and ("registered", "gpu-02") in seen
        assert ("unreachable", "gpu-01") in seen
        assert ("lost", "gpu-01") in seen
        # Released whole: the shard on the healthy node too.
        released = [e for e in subscriber.received if e["kind"] == "released"]
        assert sorted((e["replicaId"], e["nodeId"]) for e in released) == [
            ("llama-70b-r1", "gpu-01"),
            ("llama-70b-r1", "gpu-02"),
        ]
        assert ("lost", "gpu-02") not in seen

        # Both processes swept all along; the log holds each transition once.
        for _ in range(5):  # a few more rounds of both sweepers, the others still beating
            for node_id in beating:
                await api_a(HEARTBEAT, {"id": node_id})
            await asyncio.sleep(0.1)
        log = (await api_b("{ events { kind nodeId replicaId shardId } }"))["events"]
        released_shards = [e["shardId"] for e in log if e["kind"] == "released"]
        assert sorted(released_shards) == ["llama-70b-r1/gpu-01", "llama-70b-r1/gpu-02"]
        assert [e["nodeId"] for e in log if e["kind"] == "lost"] == ["gpu-01"]
        assert sorted(e["nodeId"] for e in log if e["kind"] == "unreachable") == [
            "gpu-01",
            "gpu-03",
        ]

        # The healthy node's shard went with the replica.
        healthy = await api_b('{ node(id: "gpu-02") { state allocations { shardId } } }')
        assert healthy["node"] == {"state": "READY", "allocations": []}

        # The lost node comes back empty.
        await api_b(HEARTBEAT, {"id": "gpu-01"})
        back = await api_a(
            '{ node(id: "gpu-01") { state allocations { shardId } freeGpus { index } } }'
        )
        assert back["node"]["state"] == "READY"
        assert back["node"]["allocations"] == []
        assert len(back["node"]["freeGpus"]) == 8

        # A scheduler that was away resumes from the last id it saw: the
        # stored events come first, in order, filtered to what it asked for.
        resume = 'subscription { events(nodeId: "gpu-01", after: "0") { kind nodeId } }'
        async with subscribe(a.url, resume) as resumed:
            kinds = []
            while (event := await resumed.next_event(within=30)) is not None:
                kinds.append(event["kind"])
                if event["kind"] == "back":
                    break
        assert kinds == ["registered", "unreachable", "lost", "released", "back"]


async def test_the_event_stream_reconnects_and_catches_up_on_what_it_missed(
    engine: AsyncEngine, database_url: str
) -> None:
    stream = EventStream(database_url, engine, reconnect_delay=0.05)
    stream.start()
    try:
        assert await stream.wait_listening(within=30)
        subscription = stream.subscribe(EventFilter(node_id="gpu-01"))
        events = aiter(subscription)

        async def write(kind: str) -> None:
            # Through in_transaction, as every mutation writes: it announces
            # the events once they commit.
            async def work(conn: Connection) -> None:
                await record_event(conn, kind, node_id="gpu-01")
                await record_event(conn, kind, node_id="gpu-99")  # filtered out

            await in_transaction(engine, work)

        await write("cordoned")
        assert (await asyncio.wait_for(anext(events), 5)).kind == "cordoned"

        # The listener's connection dies (a failover, an idle-killer); an
        # event is committed while nobody is listening.
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = :name"
                ),
                {"name": LISTENER_NAME},
            )
        await write("uncordoned")
        await write("drained")

        got = [(await asyncio.wait_for(anext(events), 5)).kind for _ in range(2)]
        assert got == ["uncordoned", "drained"]
        assert subscription.queue.empty()
        await events.aclose()
        assert stream.subscriber_count == 0
    finally:
        await stream.stop()
