"""NO_EXECUTE: the shards on a tainted GPU are told to stop once their toleration runs out.

Through a live service process and a subscriber, as a scheduler runs one: a
replica placed tolerating the taint for 2 s, another not tolerating it at all;
the taint is set; the untolerating one is told TAINTED at once, the other
after 2 s, each holder hears replica_must_move, the stale list shows both, and
nothing is freed until the scheduler releases.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.ctl import ctl
from tests.support.fencing import BEAT
from tests.support.live_service import LiveService
from tests.support.reports import REGISTER, node_input
from tests.support.subscriptions import subscribe

TAINT = """
mutation T($node: ID!, $indices: [Int!]!, $taint: TaintInput!) {
  taintGpus(nodeId: $node, indices: $indices, taint: $taint) { index }
}
"""
MOVES = """
query { shardsToMove { shardId stopBy overdue taint { key effect } allocation { replicaId } } }
"""
PLACE = """
mutation Place($input: PlaceInput!) {
  place(input: $input) { __typename ... on Allocated { allocations { shardId fence } } }
}
"""
SUBSCRIPTION = (
    'subscription { events(after: "0", kinds: ["replica_must_move"])'
    " { kind replicaId shardId reason detail } }"
)
DEDICATED = {"key": "dedicated", "value": "inference", "effect": "NO_EXECUTE"}


def shape(replica: str, **more: Any) -> dict[str, Any]:
    return {"input": {"replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": 4, **more}}


async def test_a_no_execute_taint_stops_shards_after_their_toleration_and_frees_nothing(
    live_service: LiveService, engine: AsyncEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    async with (
        httpx.AsyncClient(base_url=live_service.url.removesuffix("/graphql"), timeout=10) as http,
        subscribe(live_service.url, SUBSCRIPTION) as subscriber,
    ):
        api = Api(http)
        await api(REGISTER, {"input": node_input("gpu-01")})
        patient = await api(
            PLACE, shape("patient", tolerations=[{**DEDICATED, "tolerationSeconds": 2}])
        )
        blunt = await api(PLACE, shape("blunt"))
        running = [
            {"shardId": a["shardId"], "fence": a["fence"]}
            for placed in (patient, blunt)
            for a in placed["place"]["allocations"]
        ]
        assert [r["shardId"] for r in running] == ["patient-s0", "blunt-s0"]

        async def told() -> dict[str, str]:
            beat = await api(BEAT, {"id": "gpu-01", "incarnation": 1, "running": running})
            return {s["shardId"]: s["reason"] for s in beat["heartbeat"]["shardsToStop"]}

        assert await told() == {}
        tainted_at = time.monotonic()
        await api(
            TAINT,
            {
                "node": "gpu-01",
                "indices": list(range(8)),
                "taint": {**DEDICATED, "reason": "inference only"},
            },
        )
        # The untolerating one at once; the one tolerating 2 s not yet.
        assert await told() == {"blunt-s0": "TAINTED"}
        moving = {}
        for _ in range(2):
            event = await subscriber.next_event(within=10)
            assert event is not None
            moving[event["replicaId"]] = event
        assert set(moving) == {"patient", "blunt"}
        assert moving["patient"]["detail"]["key"] == "dedicated"
        assert moving["patient"]["detail"]["effect"] == "NO_EXECUTE"
        assert moving["patient"]["detail"]["gpuIndices"] == [0, 1, 2, 3]
        assert moving["patient"]["reason"].startswith("dedicated=inference:NO_EXECUTE on GPU 0-7")
        moves = (await api(MOVES))["shardsToMove"]
        assert [(m["shardId"], m["overdue"]) for m in moves] == [
            ("blunt-s0", True),
            ("patient-s0", False),
        ]

        await asyncio.sleep(max(0.0, 2.2 - (time.monotonic() - tainted_at)))
        assert await told() == {"blunt-s0": "TAINTED", "patient-s0": "TAINTED"}
        # Nothing freed: both still hold their GPUs until released.
        held = (await api("{ allocations { shardId gpuIndices } }"))["allocations"]
        assert held == [
            {"shardId": "blunt-s0", "gpuIndices": [4, 5, 6, 7]},
            {"shardId": "patient-s0", "gpuIndices": [0, 1, 2, 3]},
        ]
        code, out, _ = ctl(capsys, "--url", live_service.url, "allocations", "--stale")
        assert code == 0
        lines = out.splitlines()
        assert lines[0].split()[-1] == "STALE"
        assert all(
            "taint dedicated=inference:NO_EXECUTE: stop overdue" in line for line in lines[1:]
        )

        # The scheduler replaces and releases: then it is simply released.
        await api('mutation { releaseReplica(replicaId: "blunt") }')
        assert await told() == {"blunt-s0": "RELEASED", "patient-s0": "TAINTED"}
        assert [m["shardId"] for m in (await api(MOVES))["shardsToMove"]] == ["patient-s0"]
    assert await inconsistencies(engine) == []


async def test_a_shard_tolerating_for_ever_is_not_moved(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    await api(PLACE, shape("forever", tolerations=[{"key": "dedicated", "operator": "EXISTS"}]))
    await api(TAINT, {"node": "gpu-01", "indices": [0], "taint": {**DEDICATED, "reason": "x"}})
    assert (await api(MOVES))["shardsToMove"] == []
    events = await api('{ events(kinds: ["replica_must_move"]) { replicaId } }')
    assert events["events"] == []
    # Setting the same taint again moves nothing again.
    await api(REGISTER, {"input": node_input("gpu-02")})
    await api(PLACE, {"input": {"replicaId": "other", "gpuClass": "H100-80GB", "gpusPerShard": 8}})
    for _ in range(2):
        await api(TAINT, {"node": "gpu-02", "indices": [0], "taint": {**DEDICATED, "reason": "x"}})
    events = await api('{ events(kinds: ["replica_must_move"]) { replicaId } }')
    assert events["events"] == [{"replicaId": "other"}]
