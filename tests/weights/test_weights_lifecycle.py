"""Weights as a lifecycle: what an agent reports, what a scheduler sees, pins, and placement on READY copies.

Story tests against PostgreSQL through the API, as an agent, a scheduler and an
eviction tool use it.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.scheduling import place_batches
from tests.support.api import Api
from tests.support.placing import place
from tests.support.reports import (
    ALLOCATE,
    EXPLAIN,
    GB,
    REGISTER,
    allocation,
    node_input,
    placement,
)

LLAMA = "/models/llama-70b"
DIGEST = "sha256:" + "ab" * 32
RELEASE_REPLICA = "mutation($id: ID!) { releaseReplica(replicaId: $id) }"
WEIGHTS = """
query($id: ID!) {
  node(id: $id) {
    weights { path revision state sizeBytes totalBytes digest observedAt pinnedBy }
  }
}
"""
EVICTABLE = "query($id: ID!) { weightsEvictable(nodeId: $id) { path state pinnedBy } }"
EVENTS = """
query($kinds: [String!]) {
  events(kinds: $kinds) { kind nodeId replicaId reason }
}
"""


def weights(state: str | None = "READY", path: str = LLAMA, **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": path, "sizeBytes": 140 * GB, "totalBytes": 140 * GB}
    if state is not None:
        entry["state"] = state
    entry.update(fields)
    return entry


async def report(api: Api, node_id: str, *entries: dict[str, Any], **fields: Any) -> None:
    await api(REGISTER, {"input": node_input(node_id, weights=list(entries), **fields)})


async def shown(api: Api, node_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await api(WEIGHTS, {"id": node_id}))["node"]["weights"]
    return found


def nodes_of(result: dict[str, Any]) -> list[str]:
    assert result["__typename"] == "Allocated", result
    return sorted({a["nodeId"] for a in result["allocations"]})


async def events(api: Api, kind: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await api(EVENTS, {"kinds": [kind]}))["events"]
    return found


# --- what an agent reports ------------------------------------------------------------


async def test_each_state_transition_is_stored_and_shown(api: Api) -> None:
    seen = datetime.now(UTC).replace(microsecond=0)
    await report(
        api,
        "gpu-01",
        weights(
            "DOWNLOADING",
            sizeBytes=57 * GB,
            revision="main",
            observedAt=seen.isoformat(),
        ),
    )
    [first] = await shown(api, "gpu-01")
    assert first == {
        "path": LLAMA,
        "revision": "main",
        "state": "DOWNLOADING",
        "sizeBytes": 57 * GB,
        "totalBytes": 140 * GB,
        "digest": None,
        "observedAt": seen.isoformat(),
        "pinnedBy": [],
    }
    for state, digest in (("READY", DIGEST), ("FAILED", DIGEST), ("READY", DIGEST)):
        await report(api, "gpu-01", weights(state, digest=digest, revision="main"))
        [now] = await shown(api, "gpu-01")
        assert (now["state"], now["sizeBytes"], now["digest"]) == (state, 140 * GB, digest)
    await report(api, "gpu-01", weights("EVICTING", sizeBytes=3 * GB))
    assert [w["state"] for w in await shown(api, "gpu-01")] == ["EVICTING"]
    # Gone from the next report: gone from the node.
    await report(api, "gpu-01", weights(path="/models/other"))
    assert [w["path"] for w in await shown(api, "gpu-01")] == ["/models/other"]


async def test_a_report_without_a_state_keeps_todays_meaning(api: Api) -> None:
    await report(api, "old-agent", {"path": LLAMA, "sizeBytes": 140 * GB})
    [entry] = await shown(api, "old-agent")
    assert (entry["state"], entry["totalBytes"], entry["pinnedBy"]) == (None, None, [])
    # Present, state unknown: still a holder for a plain weights request.
    assert nodes_of(await place(api, "r1", gpusPerShard=2, weights=LLAMA)) == ["old-agent"]


@pytest.mark.parametrize(
    ("entry", "field", "value"),
    [
        ({"path": "models/llama"}, "input.weights[1].path", "models/llama"),
        (weights(sizeBytes=141 * GB), "input.weights[1].sizeBytes", 141 * GB),
        (weights(digest="sha256:xyz"), "input.weights[1].digest", "sha256:xyz"),
        (weights(digest="md5:" + "a" * 32), "input.weights[1].digest", "md5:" + "a" * 32),
    ],
)
async def test_bad_weights_are_refused_by_field_and_nothing_changes(
    api: Api, entry: dict[str, Any], field: str, value: Any
) -> None:
    await report(api, "gpu-01", weights("DOWNLOADING", sizeBytes=1 * GB))
    before = await shown(api, "gpu-01")
    bad = node_input("gpu-01", weights=[weights(path="/models/fine"), entry])
    error = await api.fails(REGISTER, {"input": bad})
    assert error["extensions"] == {"code": "BAD_INPUT", "field": field, "value": value}
    assert await shown(api, "gpu-01") == before


async def test_a_state_outside_the_set_and_a_negative_size_are_bad_input(api: Api) -> None:
    for entry, where in (
        (weights("HALF_DONE"), "state"),
        (weights(sizeBytes=-1), "sizeBytes"),
        (weights(totalBytes=-5), "totalBytes"),
    ):
        error = await api.fails(REGISTER, {"input": node_input("gpu-01", weights=[entry])})
        assert error["extensions"]["code"] == "BAD_INPUT", error
        assert f"weights[0].{where}" in error["extensions"]["field"], error
    assert (await api('{ node(id: "gpu-01") { id } }'))["node"] is None


async def test_observed_at_in_the_future_beyond_the_skew_is_refused(api: Api) -> None:
    ahead = (datetime.now(UTC) + timedelta(minutes=10)).isoformat()
    error = await api.fails(
        REGISTER, {"input": node_input("gpu-01", weights=[weights(observedAt=ahead)])}
    )
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == "input.weights[0].observedAt"
    assert error["extensions"]["value"] == ahead
    # A time without an offset names no instant.
    error = await api.fails(
        REGISTER,
        {"input": node_input("gpu-01", weights=[weights(observedAt="2026-12-05T08:00:00")])},
    )
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == "input.weights[0].observedAt"
    assert (await api('{ node(id: "gpu-01") { id } }'))["node"] is None


async def test_unchanged_weights_seen_again_add_nothing(api: Api, engine: AsyncEngine) -> None:
    first = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=3)
    await report(api, "gpu-01", weights(observedAt=first.isoformat()))
    async with engine.connect() as conn:
        before = (await conn.execute(text("SELECT xmin::text FROM weights"))).scalar_one()
    # The agent saw them again, unchanged, a moment later.
    await report(api, "gpu-01", weights(observedAt=datetime.now(UTC).isoformat()))
    async with engine.connect() as conn:
        after = (await conn.execute(text("SELECT xmin::text FROM weights"))).scalar_one()
    assert after == before  # the row was not rewritten
    [entry] = await shown(api, "gpu-01")
    assert entry["observedAt"] == first.isoformat()
    assert await events(api, "report_changed") == []


# --- pins -----------------------------------------------------------------------------


async def test_a_placed_replica_pins_its_weights_until_released(api: Api) -> None:
    await report(api, "gpu-01", weights(), weights(path="/models/small"))
    placed = await place(api, "chat", shards=2, gpusPerShard=2, weights=LLAMA)
    assert nodes_of(placed) == ["gpu-01"]
    pins = {w["path"]: w["pinnedBy"] for w in await shown(api, "gpu-01")}
    assert pins == {LLAMA: ["chat"], "/models/small": []}
    evictable = (await api(EVICTABLE, {"id": "gpu-01"}))["weightsEvictable"]
    assert evictable == [{"path": "/models/small", "state": "READY", "pinnedBy": []}]

    assert await api(RELEASE_REPLICA, {"id": "chat"}) == {"releaseReplica": 4}
    assert {w["path"]: w["pinnedBy"] for w in await shown(api, "gpu-01")} == {
        LLAMA: [],
        "/models/small": [],
    }
    evictable = (await api(EVICTABLE, {"id": "gpu-01"}))["weightsEvictable"]
    assert [w["path"] for w in evictable] == [LLAMA, "/models/small"]


async def test_an_allocation_without_weights_pins_nothing(api: Api) -> None:
    await report(api, "gpu-01", weights())
    request = allocation("raw", {"shardId": "raw-s0", "nodeId": "gpu-01", "gpuIndices": [0]})
    assert (await api(ALLOCATE, request))["allocate"]["__typename"] == "Allocated"
    [entry] = await shown(api, "gpu-01")
    assert entry["pinnedBy"] == []


async def test_pinned_weights_evicted_or_gone_tell_the_replica_and_keep_it(api: Api) -> None:
    await report(api, "gpu-01", weights())
    await report(api, "gpu-02", weights())
    [on_a] = nodes_of(await place(api, "a", gpusPerShard=8, weights=LLAMA))
    [on_b] = nodes_of(await place(api, "b", gpusPerShard=8, weights=LLAMA))
    assert {on_a, on_b} == {"gpu-01", "gpu-02"}

    await report(api, on_a, weights("EVICTING"))
    await report(api, on_b, weights(path="/models/other"))
    # Saying EVICTING again is no new loss.
    await report(api, on_a, weights("EVICTING", sizeBytes=1 * GB))
    lost = await events(api, "weights_lost_under_replica")
    assert sorted((e["replicaId"], e["nodeId"], e["reason"]) for e in lost) == [
        ("a", on_a, f"{LLAMA} is EVICTING"),
        ("b", on_b, f"{LLAMA} is gone"),
    ]
    # The allocations stay: what to do about them is the scheduler's call.
    left = await api("{ allocations { replicaId } }")
    assert sorted(a["replicaId"] for a in left["allocations"]) == ["a", "b"]


# --- placement ------------------------------------------------------------------------


async def test_weights_ready_places_only_on_ready_copies(api: Api) -> None:
    await report(api, "downloading", weights("DOWNLOADING", sizeBytes=57 * GB))
    await report(api, "unknown", {"path": LLAMA})
    await api(REGISTER, {"input": node_input("never-looked")})
    await report(api, "ready", weights("READY"))

    placed = await place(api, "r1", gpusPerShard=8, weightsReady=True, weights=LLAMA)
    assert nodes_of(placed) == ["ready"]
    refused = await place(api, "r2", gpusPerShard=8, weightsReady=True, weights=LLAMA)
    assert refused["__typename"] == "Unplaceable"
    verdicts = {v["nodeId"]: (v["code"], v["detail"]) for v in refused["verdicts"]}
    assert verdicts["downloading"] == (
        "WEIGHTS_NOT_READY",
        f"{LLAMA} is DOWNLOADING, 40% of 140 GB",
    )
    assert verdicts["unknown"] == (
        "WEIGHTS_NOT_READY",
        f"{LLAMA} is present, state not reported",
    )
    assert verdicts["never-looked"] == (
        "WEIGHTS_NOT_READY",
        f"{LLAMA} is not reported on this node",
    )
    assert verdicts["ready"][0] == "NOT_ENOUGH_GPUS"


async def test_explain_says_weights_not_ready_in_the_issues_words(api: Api) -> None:
    await report(api, "gpu-01", weights("DOWNLOADING", sizeBytes=574 * GB // 10))
    found = (await api(EXPLAIN, placement("r", gpusPerShard=2, weights=LLAMA, weightsReady=True)))[
        "explainPlacement"
    ]
    assert found["placeable"] is False
    assert found["verdicts"] == [
        {
            "nodeId": "gpu-01",
            "code": "WEIGHTS_NOT_READY",
            "detail": f"{LLAMA} is DOWNLOADING, 41% of 140 GB",
        }
    ]


async def test_without_weights_ready_ready_comes_before_downloading_before_absent(
    api: Api,
) -> None:
    await api(REGISTER, {"input": node_input("n1-never-looked")})
    await report(api, "n2-downloading", weights("DOWNLOADING", sizeBytes=1 * GB))
    await report(api, "n3-ready", weights("READY"))
    order = [
        nodes_of(await place(api, f"r{i}", gpusPerShard=8, weights=LLAMA))[0] for i in range(3)
    ]
    assert order == ["n3-ready", "n2-downloading", "n1-never-looked"]


async def test_spread_replicas_pin_on_every_node_and_prefer_ready(api: Api) -> None:
    ib = [{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}]
    await report(api, "a-downloading", weights("DOWNLOADING", sizeBytes=1 * GB), fabrics=ib)
    await report(api, "b-ready", weights("READY"), fabrics=ib)
    await report(api, "c-ready", weights("READY"), fabrics=ib)
    placed = await place(api, "big", shards=2, gpusPerShard=8, weights=LLAMA, fabric="ib-a")
    assert nodes_of(placed) == ["b-ready", "c-ready"]
    for node_id in ("b-ready", "c-ready"):
        [entry] = await shown(api, node_id)
        assert entry["pinnedBy"] == ["big"]


async def test_weights_ready_without_weights_is_refused(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    refused = await place(api, "r", gpusPerShard=1, weightsReady=True)
    assert refused["__typename"] == "AllocationRejected"
    assert "weightsReady needs weights" in refused["message"]


async def test_concurrent_places_sharing_a_transaction_pin_each_replica(api: Api) -> None:
    # Calls of one shape are claimed together (service/scheduling/place_batches.py):
    # each replica's shards still name the weights they pin.
    for i in range(4):
        await report(api, f"gpu-0{i}", weights())
    together = place_batches.COUNTS.together
    placed = await asyncio.gather(
        *(place(api, f"r{i}", gpusPerShard=2, weights=LLAMA) for i in range(16))
    )
    assert all(p["__typename"] == "Allocated" for p in placed)
    assert place_batches.COUNTS.together > together  # the group claim was exercised
    pinned = []
    for i in range(4):
        [entry] = await shown(api, f"gpu-0{i}")
        pinned += entry["pinnedBy"]
    assert sorted(pinned) == sorted(f"r{i}" for i in range(16))
