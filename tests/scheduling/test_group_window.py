"""placeGroup's window gives the plan the whole board gives, on random clusters (a seeded differential).

placeGroup plans on the first members of every class that may take a shard
(reads.read_window, from the pool census) instead of every node of the class
(reads.read_board), because the planner never looks further into a class.
Here both are read on random clusters (NVSwitch boards, bridged pairs and
4-GPU nodes on ib-a, ib-b or both, some in GB200-style NVLink domains, sick
GPUs, holes, taints of each effect, cordoned nodes) for groups of every
locality level, hard and preferred, with spreads and nvlinkShards; the plans
must be equal, and a window that finds no plan must stand for a board that
finds none. Then a group is placed and the comparison made again, until the
cluster holds no more.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections
from service.scheduling.groups.fitting import count_groups
from service.scheduling.groups.placing import requests_of
from service.scheduling.groups.planning import Misfit, plan_group
from service.scheduling.groups.reads import read_board, read_window, windowed
from tests.support.api import Api
from tests.support.group_windows import CORDON, GROUPS, boards
from tests.support.groups import PLACE_GROUP, RELEASE_GROUP, request_of, role
from tests.support.reports import REGISTER, node_input
from tests.support.topology import hgx_h100
from tests.support.two_fabrics import TAINT_GPUS, random_cluster


async def plans(engine: AsyncEngine, spec: dict[str, Any]) -> tuple[Any, Any]:
    """The plan on the window and on the whole board, read one after the other."""
    group = request_of(spec, "w")
    requests = requests_of(group)
    assert windowed(group, requests)
    async with connections.read_only(engine) as conn:
        window = await read_window(conn, group, requests)
        whole = await read_board(conn, group, requests, census=False)
        # fitGroup's board from the census counts what the survey's does
        # (counting moves the boards' members: boards of their own).
        counted = count_groups(await read_board(conn, group, requests), group)
        surveyed = count_groups(await read_board(conn, group, requests, census=False), group)
    assert counted[0] == surveyed[0]
    assert counted[1] == surveyed[1]
    if window is None:
        # The census declines a kind whose pools send GPUs of different
        # NVLink groups last (reads._cells_sql): placeGroup plans on the
        # whole board then, which is what it is compared with.
        assert any(r.shape.nvlink_shards for r in group.roles), spec
        window = whole
    on_window, on_whole = plan_group(window, group), plan_group(whole, group)
    if isinstance(on_whole, Misfit):
        return isinstance(on_window, Misfit), True
    assert not isinstance(on_window, Misfit), on_whole
    return on_window[1], on_whole[1]


@pytest.mark.seeds(range(8))
async def test_the_window_plans_what_the_whole_board_plans(
    api: Api, engine: AsyncEngine, seed: int
) -> None:
    rng = random.Random(seed)
    await random_cluster(api, rng, nodes=(6, 12), gpus_of=boards)
    await api(CORDON, {"id": f"n{rng.randrange(6)}"})
    planned = 0
    for k, spec in enumerate(GROUPS):
        placed = []
        while True:
            on_window, on_whole = await plans(engine, spec)
            assert on_window == on_whole, (seed, k, len(placed))
            if on_whole is True:
                break
            planned += 1
            answer = (
                await api(PLACE_GROUP, {"input": {"groupId": f"w{k}-{len(placed)}", **spec}})
            )["placeGroup"]
            assert answer["__typename"] == "GroupPlaced", (seed, k, answer)
            placed.append(answer["groupId"])
            assert len(placed) <= 32
        for group_id in placed:
            await api(RELEASE_GROUP, {"id": group_id})
    assert planned >= len(GROUPS) // 2, planned


@pytest.mark.parametrize("keys", [("xid-79", "dedicated"), ("dedicated", "xid-79")])
async def test_nodes_withheld_by_different_taints_take_their_turn_by_id(
    api: Api, engine: AsyncEngine, keys: tuple[str, str]
) -> None:
    """The window cannot tell which taint withholds a GPU; the plan must not depend on it either."""
    for node_id, key in zip(("t0", "t1"), keys, strict=True):
        await api(REGISTER, {"input": node_input(node_id, gpus=hgx_h100(near=False))})
        taint = {"key": key, "effect": "NO_SCHEDULE", "reason": "drawn"}
        await api(TAINT_GPUS, {"node": node_id, "indices": [7], "taint": taint})
    spec = {"roles": [role("only", 1, 4)], "locality": {"level": "ANY"}}
    on_window, on_whole = await plans(engine, spec)
    assert on_window == on_whole
    assert [n for m in on_whole.members for n, _ in m.plan.nodes] == ["t0"]
