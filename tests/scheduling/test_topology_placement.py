"""Topology-aware placement as schedulers use it: one story per option and per verdict."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.api import Api
from tests.support.placing import hold_gpus as hold
from tests.support.placing import place, register
from tests.support.reports import (
    ALLOCATE,
    EXPLAIN,
    H100,
    allocation,
    gpus,
    placement,
    shard,
)
from tests.support.topology import (
    IB_A,
    IB_B,
    bridged_pairs,
    gb200_tray,
    hgx_h100,
    no_nvlink,
    with_peers,
)

EXPLAIN_DOMAIN = EXPLAIN.replace(
    "placeable message fabric", "placeable message fabric nvlinkDomain"
)


async def explain(api: Api, replica_id: str, **fields: Any) -> dict[str, Any]:
    found: dict[str, Any] = (await api(EXPLAIN_DOMAIN, placement(replica_id, **fields)))[
        "explainPlacement"
    ]
    return found


def where(result: dict[str, Any]) -> list[tuple[str, list[int]]]:
    assert result["__typename"] == "Allocated", result
    return [(a["nodeId"], a["gpuIndices"]) for a in result["allocations"]]


def verdicts(result: dict[str, Any]) -> dict[str, tuple[str, str]]:
    assert result["__typename"] == "Unplaceable", result
    return {v["nodeId"]: (v["code"], v["detail"]) for v in result["verdicts"]}


async def test_nvlink_shards_take_the_smallest_group_that_fits(api: Api) -> None:
    # Groups {0,1}, {2,3} and {4,5,6,7}; GPU 0 is busy, so pair {0,1} cannot take 2.
    await register(api, "mixed", gpus=with_peers(gpus(H100), [[0, 1], [2, 3], [4, 5, 6, 7]]))
    await hold(api, "mixed", 0)

    # Best fit: the free pair, not a slice of the 4-GPU group.
    assert where(await place(api, "tp2", gpusPerShard=2, nvlinkShards=True)) == [("mixed", [2, 3])]
    assert where(await place(api, "tp4", gpusPerShard=4, nvlinkShards=True)) == [
        ("mixed", [4, 5, 6, 7])
    ]


async def test_without_nvlink_shards_a_shard_may_span_groups(api: Api) -> None:
    await register(api, "pairs", gpus=bridged_pairs())
    await hold(api, "pairs", 0, 2)

    assert where(await place(api, "r1", gpusPerShard=2)) == [("pairs", [1, 3])]
    assert where(await place(api, "r2", gpusPerShard=2, nvlinkShards=True)) == [("pairs", [4, 5])]


async def test_nvlink_group_too_small_names_the_largest_group(api: Api) -> None:
    await register(api, "pairs", gpus=bridged_pairs())

    got = await place(api, "tp4", gpusPerShard=4, nvlinkShards=True)

    assert verdicts(got) == {
        "pairs": ("NVLINK_GROUP_TOO_SMALL", "largest free NVLink group has 2 H100-80GB, needs 4")
    }
    # The same request without the option is placed: the pairs are not broken hardware.
    assert where(await place(api, "any4", gpusPerShard=4)) == [("pairs", [0, 1, 2, 3])]


async def test_several_shards_on_one_node_each_get_a_group(api: Api) -> None:
    await register(api, "pairs", gpus=bridged_pairs())
    await register(api, "none", gpus=no_nvlink())

    got = await place(api, "tp2x3", shards=3, gpusPerShard=2, nvlinkShards=True)

    assert where(got) == [("pairs", [0, 1]), ("pairs", [2, 3]), ("pairs", [4, 5])]
    explained = await explain(api, "tp2x1", gpusPerShard=2, nvlinkShards=True)
    assert explained["placeable"]
    assert {v["nodeId"]: v["code"] for v in explained["verdicts"]} == {
        "pairs": "FITS",
        "none": "NVLINK_GROUP_TOO_SMALL",
    }


async def test_shards_spread_over_nodes_stay_inside_groups(api: Api) -> None:
    await register(api, "p1", gpus=bridged_pairs(), fabrics=[IB_A])
    await register(api, "p2", gpus=bridged_pairs(), fabrics=[IB_A])
    await hold(api, "p1", 0, 2, 4)  # free: 1, 3, 5, 6, 7: one whole pair (6, 7)
    await register(api, "p2", gpus=bridged_pairs(), fabrics=[IB_A])
    request = allocation("busy-p2", shard("busy-p2-s0", "p2", 0, 1, 2, 3, 4))
    assert (await api(ALLOCATE, request))["allocate"]["__typename"] == "Allocated"

    got = await place(api, "tp2x2", shards=2, gpusPerShard=2, nvlinkShards=True)

    assert sorted(where(got)) == [("p1", [6, 7]), ("p2", [6, 7])]


async def test_unknown_topology_constrains_nothing_unless_asked(api: Api) -> None:
    await register(api, "old-agent")  # no nvlinkPeers: unknown, not "none"

    assert where(await place(api, "plain", gpusPerShard=4)) == [("old-agent", [0, 1, 2, 3])]
    got = await place(api, "tp2", gpusPerShard=2, nvlinkShards=True)
    assert verdicts(got) == {
        "old-agent": ("TOPOLOGY_UNKNOWN", "its agent reported no NVLink peers")
    }


async def test_tp8_on_one_nvswitch_board(api: Api) -> None:
    await register(api, "hgx", gpus=hgx_h100(), fabrics=[IB_A, IB_B])
    await register(api, "pcie", gpus=no_nvlink(), fabrics=[IB_A, IB_B])

    got = await place(api, "tp8", gpusPerShard=8, nvlinkShards=True)

    assert where(got) == [("hgx", list(range(8)))]


async def test_same_nvlink_domain_chooses_the_domain_that_fits_and_says_which(api: Api) -> None:
    for tray in ("a1", "a2"):
        await register(api, tray, gpus=gb200_tray("cluster-a/1"), fabrics=[IB_A])
    for tray in ("b1", "b2", "b3"):
        await register(api, tray, gpus=gb200_tray("cluster-b/7"), fabrics=[IB_A])
    await register(api, "lone", gpus=gb200_tray(None), fabrics=[IB_A])

    explained = await explain(
        api, "big", gpuClass="GB200", shards=3, gpusPerShard=4, sameNvlinkDomain=True
    )

    assert explained["placeable"], explained
    assert explained["nvlinkDomain"] == "cluster-b/7"
    assert "in NVLink domain cluster-b/7" in explained["message"]
    codes = {v["nodeId"]: (v["code"], v["detail"]) for v in explained["verdicts"]}
    assert codes["lone"] == (
        "NOT_IN_NVLINK_DOMAIN",
        "its GB200 GPUs are in no single NVLink domain",
    )
    got = await place(api, "big", gpuClass="GB200", shards=3, gpusPerShard=4, sameNvlinkDomain=True)
    assert sorted(node for node, _ in where(got)) == ["b1", "b2", "b3"]
    # Four trays in one domain: there are none left.
    got = await place(
        api, "huge", gpuClass="GB200", shards=4, gpusPerShard=4, sameNvlinkDomain=True
    )
    assert got["__typename"] == "Unplaceable"
    # One shard: any tray in a domain, the lone one left out.
    got = await place(api, "one", gpuClass="GB200", gpusPerShard=4, sameNvlinkDomain=True)
    assert where(got)[0][0] in ("a1", "a2")
    # Without the option two shards are placed across domains (a tray of a, the lone one).
    assert len(where(await place(api, "wide", gpuClass="GB200", shards=2, gpusPerShard=4))) == 2


async def test_rail_aligned_shards_get_exactly_their_near_hcas(api: Api) -> None:
    await register(api, "hgx", gpus=hgx_h100(), fabrics=[IB_A, IB_B])

    got = await place(api, "r2", gpusPerShard=2, fabric="ib-a", railAligned=True)

    assert where(got) == [("hgx", [0, 1])]
    assert (got["allocations"][0]["fabric"], got["allocations"][0]["hcas"]) == (
        "ib-a",
        ["mlx5_0", "mlx5_1"],
    )
    # GPUs 4-7 sit under the switches of ib-b's adapters: only 2-3 are left on ib-a.
    got = await place(api, "r4", gpusPerShard=4, fabric="ib-a", railAligned=True)
    assert verdicts(got) == {
        "hgx": (
            "NO_RAIL_ALIGNED_HCA",
            "2 free H100-80GB have a near HCA on fabric ib-a, needs 4; "
            "no near HCA on ib-a for GPU 4-7",
        )
    }
    got = await place(api, "r4b", gpusPerShard=4, fabric="ib-b", railAligned=True)
    assert where(got) == [("hgx", [4, 5, 6, 7])]
    assert got["allocations"][0]["hcas"] == ["mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]


async def test_rail_aligned_needs_a_fabric_and_known_hcas(api: Api) -> None:
    await register(api, "hgx", gpus=hgx_h100(near=False), fabrics=[IB_A])

    got = await place(api, "r1", gpusPerShard=2, railAligned=True)
    assert got["__typename"] == "AllocationRejected"
    assert "railAligned needs fabric" in got["message"]

    got = await place(api, "r1", gpusPerShard=2, fabric="ib-a", railAligned=True)
    assert verdicts(got) == {"hgx": ("TOPOLOGY_UNKNOWN", "its agent reported no near HCAs")}


async def test_nvlink_and_rail_together(api: Api) -> None:
    await register(api, "hgx", gpus=hgx_h100(), fabrics=[IB_A, IB_B])

    got = await place(
        api, "r", shards=2, gpusPerShard=2, fabric="ib-b", railAligned=True, nvlinkShards=True
    )

    assert where(got) == [("hgx", [4, 5]), ("hgx", [6, 7])]
    assert [a["hcas"] for a in got["allocations"]] == [
        ["mlx5_4", "mlx5_5"],
        ["mlx5_6", "mlx5_7"],
    ]


async def test_concurrent_nvlink_placements_fill_exactly_the_free_pairs(api: Api) -> None:
    for node_id in ("p1", "p2", "p3"):
        await register(api, node_id, gpus=bridged_pairs())

    results = await asyncio.gather(
        *(place(api, f"tp2-{k}", gpusPerShard=2, nvlinkShards=True) for k in range(16))
    )

    placed = [where(r)[0] for r in results if r["__typename"] == "Allocated"]
    assert len(placed) == 12
    assert sorted(r["__typename"] for r in results).count("Unplaceable") == 4
    # Every shard is one whole pair, and no GPU is held twice.
    assert all(held[0] % 2 == 0 and held[1] == held[0] + 1 for _, held in placed)
    assert len({(node, g) for node, held in placed for g in held}) == 24


async def test_a_node_that_fits_is_found_past_many_better_packed_ones_that_do_not(
    api: Api,
) -> None:
    # More nodes than place draws its window from, each a better fit by free
    # GPUs (4 < 8) but without NVLink: the one board must still be found.
    await asyncio.gather(
        *(register(api, f"pcie-{i:03d}", gpus=no_nvlink(count=4)) for i in range(70))
    )
    await register(api, "board", gpus=hgx_h100(near=False))

    assert where(await place(api, "tp2", gpusPerShard=2, nvlinkShards=True)) == [("board", [0, 1])]
    assert where(await place(api, "plain", gpusPerShard=2))[0][0].startswith("pcie-")
    got = await place(api, "tp8", gpusPerShard=8, nvlinkShards=True)
    assert got["__typename"] == "Unplaceable"


CORDON_GPU = """
mutation Cordon($node: ID!, $index: Int!) {
  cordonGpu(nodeId: $node, index: $index, reason: "flaky NVLink") { index cordonReason }
}
"""


async def test_a_cordoned_gpu_breaks_its_group_for_placement_and_the_largest_free_group(
    api: Api,
) -> None:
    # Free is service/scheduling/availability.py's: a cordoned GPU is not free in a group either.
    await register(api, "pairs", gpus=bridged_pairs(4))
    for index in (1, 3):
        await api(CORDON_GPU, {"node": "pairs", "index": index})

    largest = '{ node(id: "pairs") { largestFreeNvlinkGroup } }'
    assert (await api(largest))["node"]["largestFreeNvlinkGroup"] == 1
    got = await place(api, "tp2", gpusPerShard=2, nvlinkShards=True)
    assert verdicts(got) == {
        "pairs": ("NVLINK_GROUP_TOO_SMALL", "largest free NVLink group has 1 H100-80GB, needs 2")
    }
