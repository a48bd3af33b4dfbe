"""A node's topology as an agent reports it: stored, shown, and refused when it cannot be true."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.fleet import topology as topology_rules
from service.fleet.node_details import gpus_of
from service.fleet.topology import describe_groups, nvlink_groups
from tests.support.api import Api
from tests.support.holds import hold
from tests.support.reports import ALLOCATE, H100, REGISTER, allocation, gpus, node_input, shard
from tests.support.topology import (
    IB_A,
    IB_B,
    bridged_pairs,
    gb200_tray,
    hgx_h100,
    no_nvlink,
    with_peers,
)

TOPOLOGY = """
query Topology($id: ID!) {
  node(id: $id) {
    largestFreeNvlinkGroup nvlinkGroups
    gpus { index numaNode nvlinkPeers nvlinkGroup nvlinkDomain nearHcas }
  }
}
"""


async def topology(api: Api, node_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await api(TOPOLOGY, {"id": node_id}))["node"]
    return found


async def test_an_hgx_board_is_one_group_with_its_numa_and_near_hcas(api: Api) -> None:
    await api(REGISTER, {"input": node_input("hgx", gpus=hgx_h100(), fabrics=[IB_A, IB_B])})

    node = await topology(api, "hgx")

    assert node["nvlinkGroups"] == "NVLink 8"
    assert node["largestFreeNvlinkGroup"] == 8
    assert {g["nvlinkGroup"] for g in node["gpus"]} == {0}
    assert node["gpus"][5] == {
        "index": 5,
        "numaNode": 1,
        "nvlinkPeers": [0, 1, 2, 3, 4, 6, 7],
        "nvlinkGroup": 0,
        "nvlinkDomain": None,
        "nearHcas": ["mlx5_4", "mlx5_5"],
    }


async def test_largest_free_group_counts_only_free_gpus(api: Api) -> None:
    await api(REGISTER, {"input": node_input("pairs", gpus=bridged_pairs())})
    assert (await topology(api, "pairs"))["nvlinkGroups"] == "NVLink 2x4"

    taken = allocation("r", shard("r-s0", "pairs", 0, 2, 4, 6))
    assert (await api(ALLOCATE, taken))["allocate"]["__typename"] == "Allocated"
    assert (await topology(api, "pairs"))["largestFreeNvlinkGroup"] == 1

    sick = bridged_pairs()
    sick[7].update(healthy=False, healthReasons=["ecc_uncorrected"])
    await api(REGISTER, {"input": node_input("pairs", gpus=sick)})
    node = await topology(api, "pairs")
    assert node["largestFreeNvlinkGroup"] == 1
    assert [g["nvlinkGroup"] for g in node["gpus"]] == [0, 0, 2, 2, 4, 4, 6, 6]


async def test_no_nvlink_unknown_and_a_domain_read_as_such(api: Api) -> None:
    await api(REGISTER, {"input": node_input("l40s", gpus=no_nvlink())})
    await api(REGISTER, {"input": node_input("old")})
    await api(REGISTER, {"input": node_input("tray", gpus=gb200_tray("c1a2/3"))})

    l40s, old, tray = [await topology(api, n) for n in ("l40s", "old", "tray")]

    assert (l40s["nvlinkGroups"], l40s["largestFreeNvlinkGroup"]) == ("none", 1)
    assert [g["nvlinkGroup"] for g in l40s["gpus"]] == list(range(8))
    assert (old["nvlinkGroups"], old["largestFreeNvlinkGroup"]) == ("unknown", None)
    assert {(g["nvlinkPeers"], g["nvlinkGroup"]) for g in old["gpus"]} == {(None, None)}
    assert (tray["nvlinkGroups"], tray["largestFreeNvlinkGroup"]) == ("NVLink 4", 4)
    assert {g["nvlinkDomain"] for g in tray["gpus"]} == {"c1a2/3"}


def test_groups_are_connected_sets_named_by_their_lowest_index() -> None:
    # 3 reaches 1 only through 2: one set all the same.
    assert nvlink_groups({0: [], 1: [2], 2: [1, 3], 3: [2], 4: None}) == {
        0: 0,
        1: 1,
        2: 1,
        3: 1,
        4: None,
    }
    assert describe_groups([4, 2, 2]) == "NVLink 4 + 2x2"
    assert describe_groups([4, 4]) == "NVLink 4x2"
    assert describe_groups([1, 1]) == "none"
    assert describe_groups(None) == "unknown"


async def test_the_sql_forms_agree_with_the_python_definitions(
    api: Api, engine: AsyncEngine
) -> None:
    """topology.describe_groups_sql and largest_free_group_sql (what a page built by
    PostgreSQL answers) against describe_groups(group_sizes) and largest_free_group on
    the loaded GPUs (what the resolvers answer), on every shape of topology and GPU."""
    mixed = with_peers(gpus(H100, 9), [[0, 1, 2, 3], [4, 5], [6, 7]])  # 4 + 2x2 and a lone 8
    partly = with_peers(gpus(H100, 4), [[0, 1]])
    partly[2]["nvlinkPeers"] = partly[3]["nvlinkPeers"] = None  # unknown beside known
    sick = bridged_pairs()
    sick[7].update(healthy=False, healthReasons=["ecc_uncorrected"])
    nodes = {
        "hgx": hgx_h100(near=False), "pairs": bridged_pairs(), "mixed": mixed, "partly": partly,
        "l40s": no_nvlink(), "old": gpus(H100, 2), "tray": gb200_tray("c1/1"), "sick": sick,
        "taken": hgx_h100(near=False), "bare": [],
    }  # fmt: skip
    for node_id, entries in nodes.items():
        await api(REGISTER, {"input": node_input(node_id, gpus=entries)})
    await hold(engine, "taken", [0, 1, 2, 3, 4, 5, 6, 7], shard="all")
    await hold(engine, "mixed", [0, 4], shard="some")
    await api('mutation { cordonGpu(nodeId: "pairs", index: 2, reason: "fan") { index } }')
    async with engine.connect() as conn:
        built = {
            r.id: (r.words, r.largest)
            for r in await conn.execute(
                text(
                    f"SELECT n.id, {topology_rules.describe_groups_sql('n')} AS words,"
                    f" {topology_rules.largest_free_group_sql('n')} AS largest FROM nodes n"
                )
            )
        }
        loaded = await gpus_of(conn, list(nodes))
    defined = {
        node_id: (
            describe_groups(topology_rules.group_sizes(loaded.get(node_id, []))),
            topology_rules.largest_free_group(loaded.get(node_id, [])),
        )
        for node_id in nodes
    }
    assert built == defined
    # Every kind of answer is among them.
    assert {words for words, _ in defined.values()} >= {
        "NVLink 8", "NVLink 2x4", "NVLink 4 + 2x2", "none", "unknown", "NVLink 4", "NVLink 2",
    }  # fmt: skip
    assert {largest for _, largest in defined.values()} >= {None, 0, 1, 2, 3, 8}


def _bad(change: Any) -> list[dict[str, Any]]:
    entries = hgx_h100()
    change(entries)
    return entries


BAD = [
    ("peer not on node", lambda g: g[1].update(nvlinkPeers=[0, 9]), "input.gpus[1].nvlinkPeers", 9),
    ("lists itself", lambda g: g[2]["nvlinkPeers"].append(2), "input.gpus[2].nvlinkPeers", 2),
    (
        "not symmetric",
        lambda g: g[6]["nvlinkPeers"].remove(7),
        "input.gpus[7].nvlinkPeers",
        6,
    ),
    (
        "hca of no fabric",
        lambda g: g[0].update(nearHcas=["mlx5_9"]),
        "input.gpus[0].nearHcas",
        "mlx5_9",
    ),
    ("negative numa", lambda g: g[6].update(numaNode=-1), "input.gpus[6].numaNode", -1),
    ("empty domain", lambda g: g[7].update(nvlinkDomain=""), "input.gpus[7].nvlinkDomain", ""),
]


@pytest.mark.parametrize(("story", "change", "field", "value"), BAD, ids=[b[0] for b in BAD])
async def test_a_topology_that_cannot_be_true_is_refused_and_nothing_changes(
    api: Api, story: str, change: Any, field: str, value: Any
) -> None:
    await api(REGISTER, {"input": node_input("hgx", gpus=hgx_h100(), fabrics=[IB_A, IB_B])})
    before = await topology(api, "hgx")

    report = node_input("hgx", gpus=_bad(change), fabrics=[IB_A, IB_B])
    error = await api.fails(REGISTER, {"input": report})

    assert error["extensions"]["code"] == "BAD_INPUT", error
    assert error["extensions"]["field"] == field
    assert error["extensions"]["value"] == value
    assert await topology(api, "hgx") == before


FRAGMENTATION = (
    "{ gpuClasses { gpuClass free nvlinkFragmentedFree tp2: nvlinkFragmentedFree(shardSize: 2) } }"
)


async def test_fragmentation_counts_free_gpus_no_tp8_shard_can_use(api: Api) -> None:
    await api(REGISTER, {"input": node_input("board", gpus=hgx_h100(near=False))})
    await api(REGISTER, {"input": node_input("pairs", gpus=bridged_pairs())})
    await api(REGISTER, {"input": node_input("old")})  # unknown topology: not counted
    for taken in (
        allocation("r1", shard("r1-s0", "board", 0)),
        allocation("r2", shard("r2-s0", "pairs", 0, 2)),
    ):
        assert (await api(ALLOCATE, taken))["allocate"]["__typename"] == "Allocated"

    (h100,) = (await api(FRAGMENTATION))["gpuClasses"]

    # board: 7 free in a group of 8 (can no longer take TP-8); pairs: 6 free, all in pairs.
    assert h100 == {"gpuClass": "H100-80GB", "free": 21, "nvlinkFragmentedFree": 13, "tp2": 2}
    error = await api.fails("{ gpuClasses { nvlinkFragmentedFree(shardSize: 0) } }")
    assert error["extensions"]["code"] == "BAD_INPUT"


async def test_a_page_of_nodes_shows_the_same_topology_as_one_node(api: Api) -> None:
    await api(REGISTER, {"input": node_input("hgx", gpus=hgx_h100(), fabrics=[IB_A, IB_B])})
    await api(REGISTER, {"input": node_input("tray", gpus=gb200_tray("c/1"))})
    fields = "index numaNode nvlinkPeers nvlinkGroup nvlinkDomain nearHcas"

    page = (await api(f"{{ nodes {{ id gpus {{ {fields} }} }} }}"))["nodes"]

    for node in page:
        assert node["gpus"] == (await topology(api, node["id"]))["gpus"]
