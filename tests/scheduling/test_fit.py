"""fit: how many more replicas of a shape fit, exact against place, on a cluster of mixed shapes.

Exact means: placing `replicas` of the shape one by one right after
succeeds, and one more is Unplaceable; and 32 schedulers placing at once
after a fit of N place exactly N. Each shape below is tried on the same
cluster: NVSwitch boards, bridged pairs, PCIe-only, a 4-GPU node, one whose
topology is unknown, two in one NVLink domain, one on two fabrics, one
cordoned, one with a sick GPU, one partly held.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import fit as fits
from service.scheduling.placement.statements import (
    NO_LIMIT,
    facts_of,
    request_params,
    survey_sql,
)
from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.maintenance import SCHEDULE, at, window_input
from tests.support.reports import (
    ALLOCATE,
    H100,
    PLACE,
    REGISTER,
    allocation,
    gpus,
    node_input,
    shard,
)
from tests.support.snapshots import Snapshots
from tests.support.topology import IB_A, IB_B, bridged_pairs, hgx_h100, no_nvlink, with_peers

FIT = """
query Fit($shape: PlaceInput!, $exclude: [ID!], $first: Int) {
  fit(shape: $shape, excludeNodes: $exclude, first: $first) {
    replicas nodes { nodeId shards gpus } nodesOmitted limitedBy { code nodes }
  }
}
"""

CORDON = 'mutation C($id: ID!) { cordonNode(id: $id, reason: "maintenance") { id } }'


def in_domain(entries: list[dict[str, Any]], domain: str) -> list[dict[str, Any]]:
    for entry in entries:
        entry["nvlinkDomain"] = domain
    return entries


def sick(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    entries[7] = {**entries[7], "healthy": False, "healthReasons": ["ecc_uncorrected"]}
    return entries


CLUSTER: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    "board-0": (hgx_h100(near=False), [IB_A]),
    "board-1": (hgx_h100(near=False), [IB_A]),
    "pairs-0": (bridged_pairs(), [IB_A]),
    "pcie-0": (no_nvlink(), [IB_B]),
    "small-0": (with_peers(gpus(H100, 4), [[0, 1, 2, 3]]), [IB_B]),
    "unknown-0": (gpus(H100), [IB_B]),
    "dom-0": (in_domain(with_peers(gpus(H100, 4), [[0, 1, 2, 3]]), "nvl/1"), [IB_A]),
    "dom-1": (in_domain(with_peers(gpus(H100, 4), [[0, 1, 2, 3]]), "nvl/1"), [IB_A]),
    # The one node with near HCAs (each GPU's, on one fabric or the other).
    "dual-0": (hgx_h100(), [IB_A, IB_B]),
    "cordoned-0": (hgx_h100(near=False), [IB_A]),
    "sick-0": (sick(hgx_h100(near=False)), [IB_B]),
    "busy-0": (hgx_h100(near=False), [IB_B]),
}

SHAPES: list[dict[str, Any]] = [
    {"gpusPerShard": 8},
    {"gpusPerShard": 4, "nvlinkShards": True},
    {"gpusPerShard": 2, "nvlinkShards": True},
    {"gpusPerShard": 3},
    {"shards": 2, "gpusPerShard": 8},
    {"shards": 3, "gpusPerShard": 4, "fabric": "ib-b"},
    {"shards": 2, "gpusPerShard": 4, "nvlinkShards": True, "fabric": "ib-a"},
    {"shards": 2, "gpusPerShard": 4, "sameNvlinkDomain": True},
    {"gpusPerShard": 2, "railAligned": True, "fabric": "ib-a"},
    {"shards": 2, "gpusPerShard": 2, "railAligned": True, "fabric": "ib-a", "nvlinkShards": True},
]


@pytest.fixture
async def cluster(api: Api, engine: AsyncEngine, snapshots: Snapshots, fast_path: bool) -> None:
    """CLUSTER, registered through the API on this test's path by the first test on it,
    copied back for the others (tests/support/snapshots.py)."""

    async def build() -> None:
        await asyncio.gather(
            *(
                api(REGISTER, {"input": node_input(node_id, gpus=entries, fabrics=fabrics)})
                for node_id, (entries, fabrics) in CLUSTER.items()
            )
        )
        await api(CORDON, {"id": "cordoned-0"})
        held = await api(ALLOCATE, allocation("pre", shard("pre-s0", "busy-0", 0, 1, 2)))
        assert held["allocate"]["__typename"] == "Allocated"

    await snapshots.once(f"fit-{fast_path}", engine, build)


def shape_input(replica: str, shape: dict[str, Any]) -> dict[str, Any]:
    return {"replicaId": replica, "gpuClass": "H100-80GB", **shape}


async def fit(api: Api, shape: dict[str, Any], **variables: Any) -> dict[str, Any]:
    found: dict[str, Any] = (await api(FIT, {"shape": shape_input("any", shape), **variables}))[
        "fit"
    ]
    return found


async def place(api: Api, replica: str, shape: dict[str, Any]) -> dict[str, Any]:
    placed: dict[str, Any] = (await api(PLACE, {"input": shape_input(replica, shape)}))["place"]
    return placed


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
async def test_fit_is_exact_against_place_one_by_one(
    api: Api, cluster: None, shape: dict[str, Any]
) -> None:
    counted = await fit(api, shape)
    n = counted["replicas"]
    used = {node["nodeId"]: node["shards"] for node in counted["nodes"]}
    assert sum(used.values()) == n * shape.get("shards", 1)

    for i in range(n):
        placed = await place(api, f"r{i}", shape)
        assert placed["__typename"] == "Allocated", (i, n, placed)
    one_more = await place(api, "one-more", shape)
    assert one_more["__typename"] == "Unplaceable", (n, one_more)

    after = await fit(api, shape)
    assert after["replicas"] == 0
    assert after["limitedBy"], "something says why not one more"
    # What fit said limits it once the replicas are placed is what it says now.
    assert after["limitedBy"] == counted["limitedBy"]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
async def test_fit_is_exact_against_place_with_nodes_in_maintenance(
    api: Api, cluster: None, shape: dict[str, Any]
) -> None:
    # Two nodes drain for a window (start in an hour, draining for two): fit
    # counts without them (every pool read: no census while a window is in
    # force), and place, one by one, agrees.
    drained = ["board-1", "dual-0"]
    window = window_input("w", drained, at(3600), at(7200), drain_lead=7200)
    await api(SCHEDULE, {"input": window})
    counted = await fit(api, shape)
    n = counted["replicas"]
    assert not {node["nodeId"] for node in counted["nodes"]} & set(drained)
    for i in range(n):
        placed = await place(api, f"r{i}", shape)
        assert placed["__typename"] == "Allocated", (i, n, placed)
        assert not {a["nodeId"] for a in placed["allocations"]} & set(drained)
    one_more = await place(api, "one-more", shape)
    assert one_more["__typename"] == "Unplaceable", (n, one_more)
    codes = {v["nodeId"]: v["code"] for v in one_more["verdicts"]}
    assert [codes[node_id] for node_id in drained] == ["MAINTENANCE", "MAINTENANCE"]
    assert (await fit(api, shape))["replicas"] == 0


async def test_fit_writes_nothing_and_counts_what_limits_it(api: Api, cluster: None) -> None:
    counted = await fit(api, {"gpusPerShard": 8, "nvlinkShards": True})
    # Boards take one each (board-0, board-1, dual-0, busy-0's 5 left do not);
    # pairs, PCIe, the 4-GPU nodes and unknown topology cannot hold 8 in a group.
    assert counted["replicas"] == 3
    assert {n["nodeId"] for n in counted["nodes"]} == {"board-0", "board-1", "dual-0"}
    limited = {c["code"]: c["nodes"] for c in counted["limitedBy"]}
    assert limited == {
        # The three boards once used; small-0, dom-0, dom-1 (4 GPUs), busy-0 (5 left),
        # sick-0 (7 healthy).
        "NOT_ENOUGH_GPUS": 3 + 3 + 2,
        "NVLINK_GROUP_TOO_SMALL": 2,  # pairs-0, pcie-0
        "TOPOLOGY_UNKNOWN": 1,
        "NOT_SCHEDULABLE": 1,
    }
    assert (await api("{ allocations { shardId } }"))["allocations"] == [{"shardId": "pre-s0"}]
    assert (await fit(api, {"gpusPerShard": 8, "nvlinkShards": True})) == counted


async def test_excluded_nodes_count_as_drained(api: Api, cluster: None) -> None:
    shape = {"gpusPerShard": 8, "nvlinkShards": True}
    counted = await fit(api, shape, exclude=["board-0", "dual-0", "no-such-node"])
    assert counted["replicas"] == 1
    assert [n["nodeId"] for n in counted["nodes"]] == ["board-1"]


async def test_first_bounds_the_nodes_and_says_how_many_more(api: Api, cluster: None) -> None:
    counted = await fit(api, {"gpusPerShard": 1}, first=2)
    # Every free, healthy GPU of the schedulable nodes: six of 8, three of 4,
    # sick-0's 7 healthy, busy-0's 5 not held.
    assert counted["replicas"] == 6 * 8 + 3 * 4 + 7 + 5
    assert [n["nodeId"] for n in counted["nodes"]] == ["board-0", "board-1"]
    assert counted["nodesOmitted"] == 11 - 2


async def test_refusals_are_places_own(api: Api, cluster: None, settings: Any) -> None:
    placed = await place(api, "r1", {"gpusPerShard": 0})
    error = await api.fails(FIT, {"shape": shape_input("r1", {"gpusPerShard": 0})})
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["message"] == placed["message"]

    error = await api.fails(
        FIT, {"shape": shape_input("r1", {"gpusPerShard": 1}), "first": settings.max_page_size + 1}
    )
    assert error["extensions"] == {
        "code": "BAD_INPUT",
        "field": "first",
        "value": settings.max_page_size + 1,
    }
    error = await api.fails(FIT, {"shape": shape_input("r1", {"gpusPerShard": 1, "maxAge": -1})})
    assert error["extensions"]["code"] == "BAD_INPUT" and "maxAge=-1" in error["message"]


async def test_32_schedulers_after_a_fit_of_n_place_exactly_n(api: Api, cluster: None) -> None:
    shape = {"gpusPerShard": 4, "nvlinkShards": True}
    n = (await fit(api, shape))["replicas"]
    assert 0 < n < 32
    outcomes = await asyncio.gather(*(place(api, f"c{i}", shape) for i in range(32)))
    kinds = [o["__typename"] for o in outcomes]
    assert kinds.count("Allocated") == n
    assert kinds.count("Unplaceable") == 32 - n


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
async def test_the_shortcuts_count_what_the_planner_does_replica_by_replica(
    api: Api, cluster: None, engine: AsyncEngine, shape: dict[str, Any]
) -> None:
    request = PlaceRequest(
        replica_id="r",
        gpu_class="H100-80GB",
        gpus_per_shard=shape["gpusPerShard"],
        shards=shape.get("shards", 1),
        fabric=shape.get("fabric"),
        nvlink_shards=shape.get("nvlinkShards", False),
        same_nvlink_domain=shape.get("sameNvlinkDomain", False),
        rail_aligned=shape.get("railAligned", False),
    )
    async with connections.autocommit(engine) as conn:
        rows = await conn.execute(
            connections.cached_text(survey_sql(request)),
            {**request_params(request), "limit": NO_LIMIT},
        )
        facts = [facts_of(r) for r in rows]
    counting = fits.FitCount.of_nodes(facts, request)
    counting.count()
    assert counting.replicas == fits.count_by_plans(facts, request)
    # And with the node on two fabrics gone, by the per-group count.
    single = [f for f in facts if f.node_id != "dual-0"]
    counting = fits.FitCount.of_nodes(single, request)
    counting.count()
    assert counting.replicas == fits.count_by_plans(single, request)


LLAMA = "/models/llama-70b"
GB = 1 << 30
# Copies of the weights on the cluster's boards: a finished one, a download
# under way, and one present with its state unreported (an older agent).
COPIES: dict[str, dict[str, Any]] = {
    "board-0": {"path": LLAMA, "state": "READY", "sizeBytes": 140 * GB, "totalBytes": 140 * GB},
    "board-1": {
        "path": LLAMA,
        "state": "DOWNLOADING",
        "sizeBytes": 57 * GB,
        "totalBytes": 140 * GB,
    },
    "dual-0": {"path": LLAMA, "sizeBytes": 140 * GB},
}


@pytest.mark.parametrize(
    "shape",
    [
        {"gpusPerShard": 4, "weights": LLAMA, "weightsReady": True},
        {"gpusPerShard": 4, "weights": LLAMA},
        {"shards": 2, "gpusPerShard": 4, "weights": LLAMA, "weightsReady": True},
    ],
    ids=["ready-only", "ready-preferred", "two-shards-ready-only"],
)
async def test_fit_is_exact_against_place_with_weights(
    api: Api, cluster: None, shape: dict[str, Any]
) -> None:
    for node_id, copy in COPIES.items():
        entries, fabrics = CLUSTER[node_id]
        report = node_input(node_id, gpus=entries, fabrics=fabrics, weights=[copy])
        await api(REGISTER, {"input": report})
    counted = await fit(api, shape)
    n = counted["replicas"]
    assert n > 0
    for i in range(n):
        placed = await place(api, f"w{i}", shape)
        assert placed["__typename"] == "Allocated", (i, n, placed)
    one_more = await place(api, "one-more", shape)
    assert one_more["__typename"] == "Unplaceable", (n, one_more)
    if shape.get("weightsReady"):
        limited = {c["code"] for c in counted["limitedBy"]}
        assert "WEIGHTS_NOT_READY" in limited


async def test_pools_summarize_free_nvlink_groups_as_a_recount_would(
    api: Api, cluster: None, engine: AsyncEngine
) -> None:
    """fit with nvlinkShards reads each pool's free_groups and nvlink_known, not the GPUs.

    Claims (a delta), releases and reports (a recount) keep them: after each,
    the pools are what recounting every node gives (tests/support/consistency.py).
    """
    for i, shape in enumerate(SHAPES[:3]):
        placed = await place(api, f"nv{i}", shape)
        assert placed["__typename"] == "Allocated"
        assert await inconsistencies(engine) == []
    async with connections.autocommit(engine) as conn:
        pools = {
            r.node_id: (list(r.free_groups), r.nvlink_known, r.free)
            for r in await conn.execute(
                text("SELECT node_id, free_groups, nvlink_known, free FROM gpu_pools")
            )
        }
    # Bridged pairs: each free GPU's group is its pair's lowest index; no peers: unknown.
    # (The TP-8 of SHAPES[0] may have taken unknown-0 whole: equal candidates are
    # drawn at random, so its free count is read, not assumed.)
    groups, known, free = pools["unknown-0"]
    assert (groups, known) == ([None] * free, False)
    assert pools["pairs-0"][1] is True
    await api('mutation { releaseReplica(replicaId: "nv0") }')
    assert await inconsistencies(engine) == []
