"""placeGroup, group, scaleGroup, releaseGroup: stories a scheduler of disaggregated serving lives through."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections
from tests.support.api import Api
from tests.support.place_group import EXPLAIN_GROUP, FIT_GROUP, GROUP_FIELDS, PLACE_GROUP, role
from tests.support.placing import statements_sent
from tests.support.reports import PLACE, REGISTER, node_input
from tests.support.statements import StatementCounter
from tests.support.topology import IB_A, IB_B, gb200_tray, hgx_h100

SCALE_GROUP = f"""
mutation S($id: ID!, $role: String!, $replicas: Int!, $shape: PlaceInput, $generation: Int) {{
  scaleGroup(groupId: $id, role: $role, replicas: $replicas, shape: $shape,
             generation: $generation) {{
    __typename
    ... on GroupPlaced {{ {GROUP_FIELDS} }}
    ... on Unplaceable {{ message }}
    ... on AllocationRejected {{ code message }}
  }}
}}
"""

READ_GROUP = f"query G($id: ID!) {{ group(groupId: $id) {{ {GROUP_FIELDS} }} }}"
RELEASE_GROUP = "mutation R($id: ID!, $g: Int) { releaseGroup(groupId: $id, generation: $g) }"


def disaggregated(
    group_id: str, level: str = "NODE", hard: bool = False, cls: str = "H100-80GB", **extra: Any
) -> dict[str, Any]:
    """2 prefill TP-4 + 4 decode TP-2, prefill sending KV cache to decode."""
    return {
        "groupId": group_id,
        "roles": [role("prefill", 2, 4, cls), role("decode", 4, 2, cls)],
        "locality": {"level": level, "hard": hard},
        "kvFrom": "prefill",
        "kvTo": "decode",
        **extra,
    }


async def place_group(api: Api, group: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = (await api(PLACE_GROUP, {"input": group}))["placeGroup"]
    return answer


def nodes_of(placed: dict[str, Any]) -> dict[str, set[str]]:
    return {m["replicaId"]: {a["nodeId"] for a in m["allocations"]} for m in placed["members"]}


async def register_boards(api: Api, count: int, fabric: dict[str, Any] = IB_A) -> None:
    for i in range(count):
        report = node_input(f"hgx-{i}", gpus=hgx_h100(near=False), fabrics=[fabric])
        await api(REGISTER, {"input": report})


async def test_nvlink_domain_hard_lands_in_one_gb200_domain(api: Api) -> None:
    # Domain nvl-a has 2 trays (8 GPUs), nvl-b 4 (16): the group's 16 GPUs fit only in nvl-b,
    # and trays in no domain, with room to spare, do not count.
    trays = [("a", "nvl-a")] * 2 + [("b", "nvl-b")] * 4 + [("none", None)] * 6
    for i, (tag, domain) in enumerate(trays):
        report = node_input(f"tray-{tag}-{i}", gpus=gb200_tray(domain), fabrics=[IB_A])
        await api(REGISTER, {"input": report})
    placed = await place_group(api, disaggregated("gb", "NVLINK_DOMAIN", hard=True, cls="GB200"))
    assert placed["__typename"] == "GroupPlaced", placed
    used = set().union(*nodes_of(placed).values())
    assert used == {f"tray-b-{i}" for i in range(2, 6)}
    assert sorted(m["replicaId"] for m in placed["members"]) == [
        "gb-decode-0",
        "gb-decode-1",
        "gb-decode-2",
        "gb-decode-3",
        "gb-prefill-0",
        "gb-prefill-1",
    ]
    kinds = {p["kind"] for p in placed["kvPaths"]}
    assert kinds <= {"SAME_NVLINK_GROUP", "SAME_NODE", "SAME_NVLINK_DOMAIN"}
    # A second such group has no domain with room: the hard level is what failed.
    again = await place_group(api, disaggregated("gb2", "NVLINK_DOMAIN", hard=True, cls="GB200"))
    assert again["__typename"] == "Unplaceable", again
    assert "NVLINK_DOMAIN (hard)" in again["message"]


async def test_node_preferred_puts_pairs_on_shared_nodes_and_kv_paths_say_so(api: Api) -> None:
    await register_boards(api, 3)
    placed = await place_group(api, disaggregated("pd"))
    assert placed["__typename"] == "GroupPlaced", placed
    where = nodes_of(placed)
    # 16 GPUs on 8-GPU boards: each prefill with its two decodes on one board.
    for p, ds in (
        ("pd-prefill-0", ["pd-decode-0", "pd-decode-2"]),
        ("pd-prefill-1", ["pd-decode-1", "pd-decode-3"]),
    ):
        assert all(where[d] == where[p] for d in ds), where
    assert where["pd-prefill-0"] != where["pd-prefill-1"]
    paths = {(p["from"], p["to"]): p["kind"] for p in placed["kvPaths"]}
    assert len(paths) == 8
    assert paths[("pd-prefill-0", "pd-decode-0")] == "SAME_NVLINK_GROUP"
    assert paths[("pd-prefill-0", "pd-decode-1")] == "SAME_FABRIC"
    # Read back, the group is what placeGroup answered.
    read = (await api(READ_GROUP, {"id": "pd"}))["group"]
    assert read == {k: placed[k] for k in read}
    # The same input again is answered from what is stored; another is CONFLICT.
    assert await place_group(api, disaggregated("pd")) == placed
    other = await place_group(api, disaggregated("pd", level="FABRIC"))
    assert other["__typename"] == "AllocationRejected" and other["code"] == "CONFLICT"


async def test_a_group_one_gpu_too_big_places_nothing_ever_visible(
    api: Api, engine: AsyncEngine
) -> None:
    await register_boards(api, 2)
    too_big = {
        "groupId": "big",
        "roles": [role("prefill", 2, 4), role("decode", 4, 2), role("extra", 1, 1)],
    }
    seen: set[int] = set()
    done = asyncio.Event()

    async def watch() -> None:
        # Another connection, reading while the call runs: no member shard is ever committed.
        async with connections.autocommit(engine) as conn:
            while not done.is_set():
                count = (
                    await conn.execute(
                        text("SELECT count(*) FROM shards WHERE replica_id LIKE 'big-%'")
                    )
                ).scalar_one()
                seen.add(int(count))
                await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    answer = await place_group(api, too_big)
    done.set()
    await watcher
    assert answer["__typename"] == "Unplaceable", answer
    assert seen == {0}
    verdicts = {r["role"]: r["placeable"] for r in answer["roles"]}
    assert verdicts == {"prefill": True, "decode": True, "extra": True} or not all(
        verdicts.values()
    )
    assert (await api("{ allocations { shardId } }"))["allocations"] == []
    assert (await api(READ_GROUP, {"id": "big"}))["group"] is None
    # One GPU less fits, whole.
    fits = await place_group(api, {**too_big, "roles": too_big["roles"][:2]})
    assert fits["__typename"] == "GroupPlaced"


async def test_members_are_ordinary_replicas(api: Api) -> None:
    await register_boards(api, 2)
    placed = await place_group(api, disaggregated("ord"))
    assert placed["__typename"] == "GroupPlaced"
    freed = await api('mutation { releaseReplica(replicaId: "ord-decode-3") }')
    assert freed["releaseReplica"] == 2
    read = (await api(READ_GROUP, {"id": "ord"}))["group"]
    left = {m["replicaId"]: m["allocations"] for m in read["members"]}
    assert left["ord-decode-3"] == [] and all(left[k] for k in left if k != "ord-decode-3")
    # A replica id of the group placed on its own beforehand: the group is refused.
    await api(
        PLACE,
        {"input": {"replicaId": "taken-prefill-0", "gpuClass": "H100-80GB", "gpusPerShard": 1}},
    )
    clash = await place_group(api, disaggregated("taken"))
    assert clash["__typename"] == "AllocationRejected" and clash["code"] == "CONFLICT"
    assert "taken-prefill-0" in clash["message"]


async def test_scale_adds_a_decode_on_the_closest_free_gpus_and_refuses_a_stale_generation(
    api: Api,
) -> None:
    await register_boards(api, 3)
    group = {
        "groupId": "sc",
        "roles": [role("prefill", 1, 4), role("decode", 1, 2)],
        "kvFrom": "prefill",
        "kvTo": "decode",
    }
    placed = await place_group(api, group)
    assert placed["__typename"] == "GroupPlaced"
    home = nodes_of(placed)["sc-prefill-0"]
    generation = placed["generation"]
    grown = (
        await api(
            SCALE_GROUP, {"id": "sc", "role": "decode", "replicas": 1, "generation": generation}
        )
    )["scaleGroup"]
    assert grown["__typename"] == "GroupPlaced", grown
    assert nodes_of(grown)["sc-decode-1"] == home
    assert grown["generation"] == generation + 1
    assert {p["kind"] for p in grown["kvPaths"]} == {"SAME_NVLINK_GROUP"}
    stale = await api.fails(
        SCALE_GROUP, {"id": "sc", "role": "decode", "replicas": 1, "generation": generation}
    )
    assert stale["extensions"]["code"] == "CONFLICT"
    assert stale["extensions"]["currentGeneration"] == generation + 1
    # Removing takes the farthest first; the group keeps what is close.
    shrunk = (await api(SCALE_GROUP, {"id": "sc", "role": "decode", "replicas": -1}))["scaleGroup"]
    assert [m["replicaId"] for m in shrunk["members"]] == ["sc-prefill-0", "sc-decode-0"]
    bad = (await api(SCALE_GROUP, {"id": "sc", "role": "decode", "replicas": 0}))["scaleGroup"]
    assert bad["code"] == "INVALID" and "replicas=0" in bad["message"]
    # Release: a stale generation is refused, the current one frees everything.
    stale = await api.fails(RELEASE_GROUP, {"id": "sc", "g": generation})
    assert stale["extensions"]["code"] == "CONFLICT"
    freed = await api(RELEASE_GROUP, {"id": "sc", "g": shrunk["generation"]})
    assert freed["releaseGroup"] == 6
    assert (await api("{ allocations { shardId } }"))["allocations"] == []
    assert (await api(READ_GROUP, {"id": "sc"}))["group"] is None


TAINT_NODE = """
mutation T($node: ID!, $taint: TaintInput!) { taintNode(nodeId: $node, taint: $taint) { id } }
"""
BURN_IN = {"key": "burn-in", "value": "week-1", "effect": "NO_SCHEDULE", "reason": "new racks"}
TOLERATE_BURN_IN = [{"key": "burn-in", "operator": "EQUAL", "value": "week-1"}]


async def test_a_group_that_tolerates_a_taint_keeps_tolerating_it_when_scaled(
    api: Api, engine: AsyncEngine
) -> None:
    # Every GPU is behind a NO_SCHEDULE taint: only a shape that tolerates it places.
    await register_boards(api, 2)
    for node in ("hgx-0", "hgx-1"):
        await api(TAINT_NODE, {"node": node, "taint": BURN_IN})
    tolerating = {
        "groupId": "burn",
        "roles": [
            role("prefill", 1, 4, tolerations=TOLERATE_BURN_IN),
            role("decode", 1, 2, tolerations=TOLERATE_BURN_IN),
        ],
        "kvFrom": "prefill",
        "kvTo": "decode",
    }
    untolerating = {"groupId": "plain", "roles": [role("decode", 1, 2)]}
    refused = await place_group(api, untolerating)
    assert refused["__typename"] == "Unplaceable", refused
    placed = await place_group(api, tolerating)
    assert placed["__typename"] == "GroupPlaced", placed
    home = nodes_of(placed)["burn-prefill-0"]
    # Sent again, the same input (tolerations and all) is a retry, answered from what is stored.
    assert await place_group(api, tolerating) == placed

    # scaleGroup reads the role's shape back from the stored group: the new
    # decode replica needs the toleration as much as the first did.
    grown = (
        await api(
            SCALE_GROUP,
            {"id": "burn", "role": "decode", "replicas": 1, "generation": placed["generation"]},
        )
    )["scaleGroup"]
    assert grown["__typename"] == "GroupPlaced", grown
    assert nodes_of(grown)["burn-decode-1"] == home
    # The same shape given again is the role's shape, tolerations included;
    # another toleration is another shape.
    again = (
        await api(
            SCALE_GROUP,
            {
                "id": "burn",
                "role": "decode",
                "replicas": 1,
                "shape": {
                    "replicaId": "x",
                    "gpuClass": "H100-80GB",
                    "gpusPerShard": 2,
                    "tolerations": TOLERATE_BURN_IN,
                },
            },
        )
    )["scaleGroup"]
    assert again["__typename"] == "GroupPlaced", again
    other = (
        await api(
            SCALE_GROUP,
            {
                "id": "burn",
                "role": "decode",
                "replicas": 1,
                "shape": {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": 2},
            },
        )
    )["scaleGroup"]
    assert other["code"] == "INVALID" and "shape differs" in other["message"]
    # The added replicas' shards keep the toleration (NO_EXECUTE counts from it).
    async with engine.connect() as conn:
        kept = (
            await conn.execute(
                text(
                    "SELECT replica_id, tolerations FROM shards"
                    " WHERE replica_id LIKE 'burn-%' ORDER BY replica_id"
                )
            )
        ).all()
    assert [r.replica_id for r in kept] == [
        "burn-decode-0",
        "burn-decode-1",
        "burn-decode-2",
        "burn-prefill-0",
    ]
    assert all(r.tolerations and r.tolerations[0]["key"] == "burn-in" for r in kept), kept


BAD: list[tuple[dict[str, Any], str]] = [
    ({"roles": [role("p", 0, 1)]}, "roles[0].replicas=0"),
    ({"roles": [role("p", -2, 1)]}, "roles[0].replicas=-2"),
    ({"roles": [role("p", 1, 1), role("p", 1, 2)]}, "roles[1].role 'p' appears twice"),
    ({"roles": [role("p", 1, 1)], "kvFrom": "p", "kvTo": "nope"}, "kvTo 'nope' names no role"),
    ({"roles": [role("p", 1, 1)], "kvFrom": "q", "kvTo": "p"}, "kvFrom 'q' names no role"),
    ({"roles": [role("p", 1, 1)], "locality": {"level": "LABEL"}}, "locality.label is missing"),
    ({"roles": [role("p", 300, 1)]}, "at most 256 replicas"),
    ({"roles": [role("p", 200, 1), role("d", 100, 1)]}, "roles ask for 300 replicas"),
    ({"roles": []}, "roles is empty"),
    ({"roles": [role("p", 1, 0)]}, "roles[0].shape: gpusPerShard=0"),
    ({"roles": [role("", 1, 1)]}, "roles[0].role '' is not a role name"),
]


@pytest.mark.parametrize("bad,said", BAD, ids=[said for _, said in BAD])
async def test_bad_input_is_refused_naming_the_field_and_holds_nothing(
    api: Api, bad: dict[str, Any], said: str
) -> None:
    await register_boards(api, 1)
    answer = await place_group(api, {"groupId": "g", **bad})
    assert answer["__typename"] == "AllocationRejected", answer
    assert answer["code"] == "INVALID" and said in answer["message"], answer
    assert (await api("{ allocations { shardId } }"))["allocations"] == []
    error = await api.fails(FIT_GROUP, {"g": {"groupId": "g", **bad}})
    assert error["extensions"]["code"] == "BAD_INPUT" and said in error["message"]


async def test_fit_group_counts_what_place_group_places_one_by_one(api: Api) -> None:
    await register_boards(api, 3, IB_A)
    await register_boards_on(api, 2, IB_B)
    group = disaggregated("f")
    counted = [(await api(FIT_GROUP, {"g": group}))["fitGroup"] for _ in range(3)]
    assert counted[0] == counted[1] == counted[2]
    n = counted[0]["groups"]
    assert n == 2  # 5 boards, 16 GPUs a group: each group on two boards
    for i in range(n):
        assert (await place_group(api, {**group, "groupId": f"f{i}"}))[
            "__typename"
        ] == "GroupPlaced"
    assert (await place_group(api, {**group, "groupId": "one-more"}))["__typename"] == "Unplaceable"
    after = (await api(FIT_GROUP, {"g": group}))["fitGroup"]
    assert after["groups"] == 0 and after["limitedBy"]


async def register_boards_on(api: Api, count: int, fabric: dict[str, Any]) -> None:
    for i in range(count):
        report = node_input(
            f"hgx-{fabric['fabric']}-{i}", gpus=hgx_h100(near=False), fabrics=[fabric]
        )
        await api(REGISTER, {"input": report})


async def test_explain_group_placement_says_the_plan_level_and_each_roles_verdicts(
    api: Api,
) -> None:
    await register_boards(api, 2)
    await api('mutation { cordonNode(id: "hgx-1", reason: "psu") { id } }')
    fits = (await api(EXPLAIN_GROUP, {"input": disaggregated("e")}))["explainGroupPlacement"]
    # 16 GPUs do not fit on one board: NODE preferred falls back; the pairs still share it.
    assert fits["placeable"] is False
    assert {r["role"]: r["placeable"] for r in fits["roles"]} == {"prefill": True, "decode": True}
    verdicts = {v["nodeId"]: v["code"] for v in fits["roles"][0]["verdicts"]}
    assert verdicts == {"hgx-0": "FITS", "hgx-1": "NOT_SCHEDULABLE"}
    await api('mutation { uncordonNode(id: "hgx-1") { id } }')
    plan = (await api(EXPLAIN_GROUP, {"input": disaggregated("e")}))["explainGroupPlacement"]
    assert plan["placeable"] is True and plan["level"] == "FABRIC" and plan["zone"] == "ib-a"
    assert len(plan["members"]) == 6 and len(plan["kvPaths"]) == 8
    assert (await api("{ allocations { shardId } }"))["allocations"] == []
    # What explain planned is what placeGroup places.
    placed = await place_group(api, disaggregated("e"))
    assert {m["replicaId"]: sorted(nodes_of(placed)[m["replicaId"]]) for m in plan["members"]} == {
        m["replicaId"]: sorted(set(m["nodeIds"])) for m in plan["members"]
    }


async def test_one_roles_replicas_spread_over_numa_nodes_where_the_shape_allows(api: Api) -> None:
    """Dynamo #10171: two prefill workers on one PCIe root halved throughput.

    hgx_h100 puts GPUs 0-3 on NUMA node 0 and 4-7 on NUMA node 1; on one node,
    each role's replicas take the NUMA node its others hold fewest GPUs of.
    """
    await register_boards(api, 1)
    group = {
        "groupId": "numa",
        "roles": [role("prefill", 2, 1), role("decode", 2, 2)],
        "locality": {"level": "NODE", "hard": True},
    }
    placed = await place_group(api, group)
    assert placed["__typename"] == "GroupPlaced", placed
    gpus = {m["replicaId"]: m["allocations"][0]["gpuIndices"] for m in placed["members"]}
    assert gpus == {
        "numa-prefill-0": [0],
        "numa-prefill-1": [4],
        "numa-decode-0": [1, 2],
        "numa-decode-1": [5, 6],
    }
    # Scaling adds away from the role's others too.
    grown = (await api(SCALE_GROUP, {"id": "numa", "role": "prefill", "replicas": 1}))["scaleGroup"]
    added = next(m for m in grown["members"] if m["replicaId"] == "numa-prefill-2")
    assert added["allocations"][0]["gpuIndices"] in ([3], [7])


async def test_a_group_is_placed_in_a_fixed_number_of_statements(
    api: Api, count_statements: StatementCounter
) -> None:
    """placeGroup's round trips, counted: each one waits in a busy machine's run queue.

    Its ratio to one place (benchmarks/groups.py) grows with them under load,
    so the count is held here: the window read, the savepoint, the group's
    rows written by the statement that asks whether its groupId or ids are in
    use, the members' nodes locked with their GPUs and NUMA nodes, one store
    of every member (the savepoint is not released: COMMIT keeps its work)
    and the group read back.
    """
    await register_boards(api, 5)
    count_statements.statements.clear()
    placed = await place_group(api, disaggregated("pd"))
    assert placed["__typename"] == "GroupPlaced", placed
    sent = statements_sent(count_statements)
    assert len(sent) == 6, sent
    assert sum("FOR NO KEY UPDATE" in s for s in sent) == 1, sent
    assert sum("INSERT INTO shards" in s for s in sent) == 1, sent
    # With room for it again, the same input is answered what is stored and
    # another input is CONFLICT, nothing held twice.
    assert await place_group(api, disaggregated("pd")) == placed
    other = await place_group(api, disaggregated("pd", level="FABRIC"))
    assert other["__typename"] == "AllocationRejected" and other["code"] == "CONFLICT"
    # An id of the group held by a replica placed on its own: CONFLICT naming it.
    alone = {"replicaId": "pd2-decode-1", "gpuClass": "H100-80GB", "gpusPerShard": 1}
    assert (await api(PLACE, {"input": alone}))["place"]["__typename"] == "Allocated"
    clash = await place_group(api, disaggregated("pd2"))
    assert clash["__typename"] == "AllocationRejected" and clash["code"] == "CONFLICT"
    assert "pd2-decode-1" in clash["message"]
    held = (await api("{ allocations { shardId } }"))["allocations"]
    assert len(held) == 6 + 1
