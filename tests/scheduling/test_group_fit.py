"""fitGroup is deterministic and exact against placeGroup one by one, also across service processes.

A seeded differential: random clusters with nodes on ib-a, ib-b or both,
boards and pairs, sick GPUs and holes (GPUs held by other replicas), and
groups of several roles, shapes and localities. For each, fitGroup answers
the same count three times, placing groups one by one places exactly that
many, and fitGroup then says 0.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections
from service.scheduling.groups.fitting import count_groups
from service.scheduling.groups.placing import requests_of
from service.scheduling.groups.reads import read_board
from tests.support.api import Api
from tests.support.groups import PLACE_GROUP, RELEASE_GROUP, request_of, role
from tests.support.reports import ALLOCATE, H100, REGISTER, allocation, gpus, node_input, shard
from tests.support.topology import bridged_pairs, hgx_h100
from tests.support.two_fabrics import FABRIC_LAYOUTS
from tests.support.two_fabrics import random_cluster as two_fabric_cluster

FIT_GROUP = "query F($g: PlaceGroupInput!) { fitGroup(group: $g) { groups limitedBy } }"


def attachment(fabric: str) -> dict[str, Any]:
    hcas = ["mlx5_0", "mlx5_1"] if fabric == "ib-a" else ["mlx5_2", "mlx5_3"]
    return {"fabric": fabric, "hcas": hcas, "rateGbps": 400}


GROUPS: list[dict[str, Any]] = [
    {
        "roles": [role("prefill", 2, 4), role("decode", 4, 2)],
        "kvFrom": "prefill",
        "kvTo": "decode",
        "locality": {"level": "NODE"},
    },
    {
        "roles": [role("prefill", 1, 4), role("decode", 2, 2)],
        "locality": {"level": "FABRIC", "hard": True},
    },
    {
        "roles": [role("prefill", 1, 4, shards=2), role("decode", 3, 2)],
        "kvFrom": "prefill",
        "kvTo": "decode",
    },
    {
        "roles": [role("p", 1, 2, nvlinkShards=True), role("d", 2, 1)],
        "locality": {"level": "NODE", "hard": True},
    },
    {"roles": [role("a", 3, 1), role("b", 1, 3)], "locality": {"level": "FABRIC"}},
]


def boards(rng: random.Random) -> list[dict[str, Any]]:
    return rng.choice([hgx_h100(near=False), bridged_pairs(), gpus(H100, 4)])


async def random_cluster(api: Api, rng: random.Random) -> None:
    """Boards, bridged pairs and 4-GPU nodes on ib-a, ib-b or both; sick GPUs, holes."""
    await two_fabric_cluster(api, rng, nodes=(4, 8), layouts=FABRIC_LAYOUTS[:3], gpus_of=boards)


async def fit_group(api: Api, group: dict[str, Any]) -> int:
    return int((await api(FIT_GROUP, {"g": {"groupId": "fit", **group}}))["fitGroup"]["groups"])


@pytest.mark.seeds(range(8))
async def test_fit_group_is_stable_and_exact_on_random_two_fabric_clusters(
    api: Api, seed: int
) -> None:
    rng = random.Random(seed)
    await random_cluster(api, rng)
    for k, group in enumerate(GROUPS):
        counted = {await fit_group(api, group) for _ in range(3)}
        assert len(counted) == 1, (seed, k, counted)
        expected = counted.pop()
        placed = []
        while True:
            answer = (
                await api(PLACE_GROUP, {"input": {"groupId": f"g{k}-{len(placed)}", **group}})
            )["placeGroup"]
            if answer["__typename"] != "GroupPlaced":
                assert answer["__typename"] == "Unplaceable", answer
                break
            placed.append(answer["groupId"])
            assert len(placed) <= 64
        assert len(placed) == expected, (seed, k, group)
        assert await fit_group(api, group) == 0
        for group_id in placed:
            await api(RELEASE_GROUP, {"id": group_id})


async def test_32_concurrent_place_groups_through_two_processes_place_exactly_k(
    api: Api, live_service_factory: Any
) -> None:
    # Room for exactly 3 groups of 16 GPUs on 6 boards (two boards a group).
    for i in range(6):
        fabric = attachment("ib-a" if i < 4 else "ib-b")
        report = node_input(f"hgx-{i}", gpus=hgx_h100(near=False), fabrics=[fabric])
        await api(REGISTER, {"input": report})
    group = GROUPS[0]
    k = await fit_group(api, group)
    assert k == 3
    services = [live_service_factory(), live_service_factory()]
    async with httpx.AsyncClient(timeout=120) as client:

        async def place(i: int) -> dict[str, Any]:
            url = services[i % 2].url
            body = {"query": PLACE_GROUP, "variables": {"input": {"groupId": f"c{i}", **group}}}
            response = await client.post(url, json=body)
            assert response.status_code == 200, response.text
            answer: dict[str, Any] = response.json()["data"]["placeGroup"]
            return answer

        outcomes = await asyncio.gather(*(place(i) for i in range(32)))
    kinds = [o["__typename"] for o in outcomes]
    assert kinds.count("GroupPlaced") == k, kinds
    assert kinds.count("Unplaceable") == 32 - k
    held: list[tuple[str, int]] = []
    for o in outcomes:
        if o["__typename"] == "GroupPlaced":
            assert len(o["members"]) == 6 and all(m["allocations"] for m in o["members"])
            held += [
                (a["nodeId"], i)
                for m in o["members"]
                for a in m["allocations"]
                for i in a["gpuIndices"]
            ]
    assert len(held) == len(set(held)) == 3 * 16
    everything = (await api("{ allocations { replicaId gpuIndices } }"))["allocations"]
    assert sum(len(a["gpuIndices"]) for a in everything) == 48
    # No partial group: every replica held belongs to a group placed whole.
    placed = {o["groupId"] for o in outcomes if o["__typename"] == "GroupPlaced"}
    assert {a["replicaId"].rsplit("-", 2)[0] for a in everything} == placed


async def test_counting_repeated_rounds_at_once_counts_what_round_by_round_does(
    api: Api, engine: AsyncEngine
) -> None:
    """fitGroup applies a round that provably repeats many times at once (fitting.count_groups).

    On a cluster with classes of many like nodes (where it applies), the
    count equals planning every round, for every group of the differential,
    and placing one by one.
    """
    rng = random.Random(39)
    for i in range(48):
        fabrics = [["ib-a"], ["ib-b"], ["ib-a", "ib-b"]][i % 3]
        entries = hgx_h100(near=False) if i % 4 else bridged_pairs()
        report = node_input(f"m{i:02d}", gpus=entries, fabrics=[attachment(f) for f in fabrics])
        await api(REGISTER, {"input": report})
        if rng.random() < 0.2:
            held = await api(ALLOCATE, allocation(f"h{i}", shard(f"h{i}-s0", f"m{i:02d}", 0, 1)))
            assert held["allocate"]["__typename"] == "Allocated"
    for k, spec in enumerate(GROUPS):
        group = request_of(spec)
        requests = requests_of(group)
        async with connections.autocommit(engine) as conn:
            fast_board = await read_board(conn, group, requests)
            slow_board = await read_board(conn, group, requests)
        fast, _, _ = count_groups(fast_board, group)
        slow, _, _ = count_groups(slow_board, group, repeats=False)
        assert fast == slow, (k, fast, slow)
        assert await fit_group(api, spec) == fast
    spec = GROUPS[0]
    expected = await fit_group(api, spec)
    assert expected >= 10
    for i in range(expected):
        answer = await api(PLACE_GROUP, {"input": {"groupId": f"one-{i}", **spec}})
        assert answer["placeGroup"]["__typename"] == "GroupPlaced", (i, expected)
    answer = await api(PLACE_GROUP, {"input": {"groupId": "one-more", **spec}})
    assert answer["placeGroup"]["__typename"] == "Unplaceable"
