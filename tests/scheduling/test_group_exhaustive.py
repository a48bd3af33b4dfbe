"""placeGroup, fitGroup and explainGroupPlacement against an exhaustive search (issue 44, a seeded differential).

The planner claims to find a placement whenever one exists, to put a group
in the finest zone of its preferred level that has room, and fitGroup to
count exactly what placeGroup then places one by one. Here an independent
search, written from the docs alone (docs/scheduler/groups.md, placement.md,
topology.md, taints.md), decides on small random clusters whether a group
fits, tries every way each replica can go, and judges every answer:

- nodes of 8 H100 on one NVSwitch (1 x 8), on a 2 x 4 board, in bridged
  pairs, or of unknown topology (no NVLink peers reported); on ib-a, ib-b
  or both; some in an NVLink domain, some with a rack label; GPUs sick,
  held by other replicas (holes), tainted NO_SCHEDULE (not offered) or
  PREFER_NO_SCHEDULE (offered, used last); a node cordoned;
- groups of one to three roles, replicas, shards, gpusPerShard,
  nvlinkShards, a fabric, kvFrom/kvTo, every locality level, hard or
  preferred.

For each group: explainGroupPlacement is placeable exactly when the search
finds room; fitGroup's count N; then placeGroup is called one group after
another: while the search finds room it must answer GroupPlaced (a lone
caller: never CONFLICT, never "no room" when there is some), with every
member's GPUs offered and shaped as asked, the whole group in one zone of
the finest level the search finds room at (preferred) or of its level
(hard); once the search finds none it must answer Unplaceable; and the
groups placed must number N. SEARCH_BOUND never comes on clusters this size.

Seeds: GROUP_DIFFERENTIAL_SEEDS (default 10, as CI runs it); set it higher
locally, e.g. GROUP_DIFFERENTIAL_SEEDS=200.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from service.scheduling.groups import planning
from tests.support.api import Api
from tests.support.group_windows import CORDON
from tests.support.place_group import EXPLAIN_GROUP, FIT_GROUP
from tests.support.reports import ALLOCATE, H100, REGISTER, allocation, gpus, node_input, shard
from tests.support.topology import with_peers
from tests.support.two_fabrics import TAINT_GPUS, attachment

SEEDS = int(os.environ.get("GROUP_DIFFERENTIAL_SEEDS", "10"))
GROUPS_PER_CLUSTER = 6

PLACE_GROUP = """
mutation P($input: PlaceGroupInput!) {
  placeGroup(input: $input) {
    __typename
    ... on GroupPlaced { groupId members { role replicaId allocations { nodeId gpuIndices fabric } } }
    ... on Unplaceable { message }
    ... on AllocationRejected { code message }
  }
}
"""
RELEASE_GROUP = "mutation R($id: ID!) { releaseGroup(groupId: $id) }"
LEVELS = ["NODE", "NVLINK_DOMAIN", "LABEL", "FABRIC", "ANY"]


# The cluster as the test made it: what the docs say decides where a shard may go.


@dataclass
class Node:
    node_id: str
    fabrics: tuple[str, ...]
    domain: str | None
    rack: str | None
    schedulable: bool
    # GPU index -> its NVLink group (topology.md: the lowest index of its
    # NVLink-connected set); None: the agent reported no peers (unknown).
    groups: dict[int, int] | None
    # The GPUs a request without tolerations is offered now (taints.md):
    # healthy, not held, no NO_SCHEDULE or NO_EXECUTE taint.
    free: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Shape:
    per: int
    shards: int
    nvlink: bool
    fabric: str | None


LAYOUTS: dict[str, list[list[int]] | None] = {
    "1x8": [list(range(8))],
    "2x4": [[0, 1, 2, 3], [4, 5, 6, 7]],
    "pairs": [[i, i + 1] for i in range(0, 8, 2)],
    "unknown": None,
}


async def random_cluster(api: Api, rng: random.Random) -> dict[str, Node]:
    nodes: dict[str, Node] = {}
    for i in range(rng.randint(3, 5)):
        node_id = f"n{i}"
        layout = rng.choice(list(LAYOUTS))
        groups = LAYOUTS[layout]
        entries = gpus(H100) if groups is None else with_peers(gpus(H100), groups)
        domain = rng.choice([None, None, "nvl/0", "nvl/1"])
        sick = set()
        for entry in entries:
            entry["numaNode"] = entry["index"] // 4
            if domain is not None:
                entry["nvlinkDomain"] = domain
            if rng.random() < 0.08:
                entry.update(healthy=False, healthReasons=["ecc_uncorrected"])
                sick.add(entry["index"])
        fabrics = rng.choice([("ib-a",), ("ib-b",), ("ib-a", "ib-b"), ("ib-a", "ib-b")])
        rack = rng.choice([None, "r0", "r1", "r1"])
        report = node_input(
            node_id,
            gpus=entries,
            fabrics=[attachment(f) for f in fabrics],
            labels=[{"key": "rack", "value": rack}] if rack is not None else [],
        )
        await api(REGISTER, {"input": report})
        member = (
            None if groups is None else {g: min(members) for members in groups for g in members}
        )
        node = Node(node_id, fabrics, domain, rack, True, member, set(range(8)) - sick)
        if rng.random() < 0.4:
            held = sorted(rng.sample(sorted(node.free), k=min(len(node.free), rng.randint(1, 3))))
            answer = await api(
                ALLOCATE, allocation(f"hole-{node_id}", shard(f"hole-{node_id}-s0", node_id, *held))
            )
            assert answer["allocate"]["__typename"] == "Allocated", answer
            node.free -= set(held)
        for effect, chance in (("NO_SCHEDULE", 0.2), ("PREFER_NO_SCHEDULE", 0.2)):
            if rng.random() < chance:
                indices = sorted(rng.sample(range(8), k=rng.randint(1, 2)))
                taint = {"key": f"t-{effect.lower()}", "effect": effect, "reason": "drawn"}
                await api(TAINT_GPUS, {"node": node_id, "indices": indices, "taint": taint})
                if effect == "NO_SCHEDULE":
                    node.free -= set(indices)
        nodes[node_id] = node
    if rng.random() < 0.25:
        cordoned = rng.choice(sorted(nodes))
        await api(CORDON, {"id": cordoned})
        nodes[cordoned].schedulable = False
    return nodes


def random_group(rng: random.Random) -> dict[str, Any]:
    """One to three roles, at most five replicas and 16 GPUs, of every kind the planner reads."""
    while True:
        roles = []
        for k in range(rng.randint(1, 3)):
            per = rng.choice([1, 2, 2, 4])
            shape: dict[str, Any] = {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": per}
            if per <= 2 and rng.random() < 0.25:
                shape["shards"] = 2
            if rng.random() < 0.4:
                shape["nvlinkShards"] = True
            if rng.random() < 0.15:
                shape["fabric"] = rng.choice(["ib-a", "ib-b"])
            roles.append({"role": f"r{k}", "replicas": rng.randint(1, 3), "shape": shape})
        replicas = sum(r["replicas"] for r in roles)
        asked = sum(
            r["replicas"] * r["shape"]["gpusPerShard"] * r["shape"].get("shards", 1) for r in roles
        )
        if replicas <= 5 and 3 <= asked <= 16:
            break
    level = rng.choice(LEVELS)
    locality: dict[str, Any] = {"level": level, "hard": rng.random() < 0.3}
    if level == "LABEL":
        locality["label"] = "rack"
    group: dict[str, Any] = {"roles": roles, "locality": locality}
    if len(roles) >= 2 and rng.random() < 0.6:
        sender, receiver = rng.sample([r["role"] for r in roles], 2)
        group |= {"kvFrom": sender, "kvTo": receiver}
    return group


def shapes_of(group: dict[str, Any]) -> list[Shape]:
    """Every replica's shape, like ones together (the search treats replicas of one role alike)."""
    found = []
    for r in group["roles"]:
        s = r["shape"]
        shape = Shape(
            s["gpusPerShard"], s.get("shards", 1), s.get("nvlinkShards", False), s.get("fabric")
        )
        found += [shape] * r["replicas"]
    return found


# The exhaustive search: every way every replica can go, from the docs.


def cell_of(node: Node, gpu: int) -> int | None:
    """The NVLink group a GPU is in (None: unknown topology); GPUs of one cell are alike to every shape."""
    return None if node.groups is None else node.groups[gpu]


Counts = dict[str, dict[int | None, int]]


def counts_of(nodes: dict[str, Node], zone: Callable[[Node], bool]) -> Counts:
    counts: Counts = {}
    for node in nodes.values():
        if not node.schedulable or not zone(node):
            continue
        cells: dict[int | None, int] = {}
        for gpu in node.free:
            cells[cell_of(node, gpu)] = cells.get(cell_of(node, gpu), 0) + 1
        counts[node.node_id] = cells
    return counts


def shard_takes(
    node: Node, cells: dict[int | None, int], shape: Shape
) -> Iterator[dict[int | None, int]]:
    """Every way one shard takes `per` GPUs of a node's cells (placement.md: a shard is never split)."""
    if shape.fabric is not None and shape.fabric not in node.fabrics:
        return
    if shape.nvlink:
        # topology.md: each shard's GPUs in one NVLink group; unknown topology takes none.
        for cell, count in sorted(cells.items(), key=lambda item: str(item[0])):
            if cell is not None and count >= shape.per:
                yield {cell: shape.per}
        return
    keys = sorted(cells, key=str)

    def fill(k: int, need: int, taken: dict[int | None, int]) -> Iterator[dict[int | None, int]]:
        if need == 0:
            yield dict(taken)
            return
        if k == len(keys):
            return
        for amount in range(min(cells[keys[k]], need), -1, -1):
            if amount:
                taken[keys[k]] = amount
            yield from fill(k + 1, need - amount, taken)
            taken.pop(keys[k], None)

    yield from fill(0, shape.per, {})


def fits(nodes: dict[str, Node], shapes: list[Shape], zone: Callable[[Node], bool]) -> bool:
    """Whether every replica can go on the zone's nodes at once: depth first over everything, failures remembered."""
    counts = counts_of(nodes, zone)
    failed: set[tuple[object, ...]] = set()

    def frozen() -> tuple[object, ...]:
        return tuple(sorted((n, tuple(sorted(c.items(), key=str))) for n, c in counts.items()))

    def replica(i: int, shard: int, used: list[str]) -> bool:
        shape = shapes[i]
        if shard == shape.shards:
            on = set(used)
            if len(on) > 1:
                # placement.md: a multi-node replica's nodes share a fabric.
                common = set.intersection(*(set(nodes[n].fabrics) for n in on))
                if not common:
                    return False
            return place(i + 1)
        for node_id in sorted(counts):
            if used and node_id < used[-1]:
                continue  # the shards of one replica in node order: each set once
            for take in shard_takes(nodes[node_id], counts[node_id], shape):
                for cell, k in take.items():
                    counts[node_id][cell] -= k
                if replica(i, shard + 1, [*used, node_id]):
                    return True
                for cell, k in take.items():
                    counts[node_id][cell] += k
        return False

    def place(i: int) -> bool:
        if i == len(shapes):
            return True
        key = (i, frozen())
        if key in failed:
            return False
        if replica(i, 0, []):
            return True
        failed.add(key)
        return False

    return place(0)


def zones(nodes: dict[str, Node], level: str) -> list[Callable[[Node], bool]]:
    """groups.md: one node, one NVLink domain, one value of the label, one fabric, or everything."""
    if level == "NODE":
        return [lambda n, i=i: n.node_id == i for i in sorted(nodes)]
    if level == "NVLINK_DOMAIN":
        names = sorted({n.domain for n in nodes.values() if n.domain is not None})
        return [lambda n, d=d: n.domain == d for d in names]
    if level == "LABEL":
        names = sorted({n.rack for n in nodes.values() if n.rack is not None})
        return [lambda n, r=r: n.rack == r for r in names]
    if level == "FABRIC":
        return [lambda n, f=f: f in n.fabrics for f in ("ib-a", "ib-b")]
    return [lambda n: True]


def levels_of(group: dict[str, Any]) -> list[str]:
    """groups.md: hard, its level alone; preferred, its level then the coarser ones (LABEL only when asked)."""
    locality = group["locality"]
    if locality["hard"]:
        return [locality["level"]]
    found = LEVELS[LEVELS.index(locality["level"]) :]
    return [lv for lv in found if lv != "LABEL" or locality["level"] == "LABEL"]


def finest(nodes: dict[str, Node], group: dict[str, Any]) -> str | None:
    """The finest level at which some zone holds the group (None: no room anywhere it may go)."""
    shapes = shapes_of(group)
    for level in levels_of(group):
        if any(fits(nodes, shapes, zone) for zone in zones(nodes, level)):
            return level
    return None


def check_placed(
    nodes: dict[str, Node], group: dict[str, Any], placed: dict[str, Any], level: str
) -> None:
    """Every member shaped as asked on GPUs offered now, the group in one zone of `level`; then held."""
    shapes = {r["role"]: shapes_of({"roles": [r]})[0] for r in group["roles"]}
    counts = {r["role"]: r["replicas"] for r in group["roles"]}
    assert sorted(m["role"] for m in placed["members"]) == sorted(
        role for role, k in counts.items() for _ in range(k)
    ), placed
    taken: list[tuple[str, int]] = []
    used: set[str] = set()
    for m in placed["members"]:
        shape = shapes[m["role"]]
        shards = m["allocations"]
        assert len(shards) == shape.shards, m
        on = {a["nodeId"] for a in shards}
        used |= on
        if len(on) > 1:
            assert set.intersection(*(set(nodes[n].fabrics) for n in on)), m
        for a in shards:
            node = nodes[a["nodeId"]]
            assert node.schedulable and len(a["gpuIndices"]) == shape.per, m
            assert set(a["gpuIndices"]) <= node.free, (m, sorted(node.free))
            if shape.fabric is not None:
                assert shape.fabric in node.fabrics, m
            if shape.nvlink:
                assert node.groups is not None, m
                assert len({node.groups[g] for g in a["gpuIndices"]}) == 1, m
            taken += [(a["nodeId"], g) for g in a["gpuIndices"]]
    assert len(taken) == len(set(taken)), placed
    within = [zone for zone in zones(nodes, level) if all(zone(nodes[n]) for n in used)]
    assert within, (level, sorted(used))
    for node_id, gpu in taken:
        nodes[node_id].free.discard(gpu)


def release(nodes: dict[str, Node], placed: dict[str, Any]) -> None:
    for m in placed["members"]:
        for a in m["allocations"]:
            nodes[a["nodeId"]].free |= set(a["gpuIndices"])


@pytest.fixture
def trials(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The most replica plans any one plan_group call tried (planning.Budget), to set against SEARCH_BOUND."""
    most = [0]
    spend = planning.Budget.spend

    def counted(budget: planning.Budget) -> None:
        spend(budget)
        most[0] = max(most[0], budget.spent)

    monkeypatch.setattr(planning.Budget, "spend", counted)
    return most


@pytest.mark.seeds(range(SEEDS))
async def test_place_group_finds_room_whenever_an_exhaustive_search_does(
    api: Api, seed: int, trials: list[int]
) -> None:
    rng = random.Random(4400 + seed)
    nodes = await random_cluster(api, rng)
    for k in range(GROUPS_PER_CLUSTER):
        group = random_group(rng)
        level = finest(nodes, group)
        said = {"seed": seed, "group": k, "spec": group, "level": level}
        explained = (await api(EXPLAIN_GROUP, {"input": {"groupId": "x", **group}}))[
            "explainGroupPlacement"
        ]
        assert explained["placeable"] is (level is not None), (said, explained["message"])
        if level is not None and not group["locality"]["hard"]:
            assert explained["level"] == level, (said, explained)
        counted = (await api(FIT_GROUP, {"g": {"groupId": "fit", **group}}))["fitGroup"]
        placed: list[dict[str, Any]] = []
        while True:
            level = finest(nodes, group)
            answer = (
                await api(PLACE_GROUP, {"input": {"groupId": f"g{k}-{len(placed)}", **group}})
            )["placeGroup"]
            if level is None:
                assert answer["__typename"] == "Unplaceable", (said, answer)
                break
            assert answer["__typename"] == "GroupPlaced", (said, len(placed), answer)
            check_placed(nodes, group, answer, level)
            placed.append(answer)
            assert len(placed) <= 20
        assert counted["groups"] == len(placed), (said, counted)
        assert (await api(FIT_GROUP, {"g": {"groupId": "fit", **group}}))["fitGroup"]["groups"] == 0
        for answer in placed:
            await api(RELEASE_GROUP, {"id": answer["groupId"]})
            release(nodes, answer)
    assert trials[0] < planning.SEARCH_BOUND // 4, trials
