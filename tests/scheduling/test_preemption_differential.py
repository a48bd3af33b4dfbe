"""Preemption's choice against an exhaustive search, on seeded random small clusters.

Each seed draws a cluster (nodes of 4 or 8 H100 on fabric ib-a, ib-b or
both, some GPUs sick), tenants with and without guarantees, replicas of
random priorities and deployments held on random GPUs (some over two
nodes), and disruption budgets; then a replica that does not fit on free
GPUs, placed with preemption LOWER_PRIORITY by a random tenant and
priority. The oracle here is written from docs/scheduler/tenancy.md alone:
which replicas may be victims, which sets keep the budgets and reclaim only
what was borrowed, whether the shape fits once a set is stopped (one node
with room for every shard, or one fabric with room for one shard per
node), and the order of sets. It tries every subset. explainPlacement must
show the oracle's least set, and place must stop exactly it (or both say
there is none).

Groups too: a group of one role of replicas of one shard (preferred
locality: it fits when the nodes' free GPUs hold its replicas, wherever), by
a random tenant and priority, and then scaleGroup adding replicas to it: the
victims placeGroup and scaleGroup stop are the oracle's least set for all of
what they place (the group's own replicas, of its priority and tenant, are
never among them), or nothing is stopped.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.api import Api
from tests.support.preemption import PLACE_GROUP, SCALE_GROUP, explain, place, victims
from tests.support.reports import H100, REGISTER, gpus, node_input
from tests.support.tenancy import SET_BUDGET, quota, set_tenant
from tests.support.two_fabrics import attachment

ALLOCATE = """
mutation A($input: AllocateInput!) {
  allocate(input: $input) { __typename ... on AllocationRejected { code message } }
}
"""
TENANTS = {"t1": 8, "t2": 0, "t3": 4}  # guaranteed H100s ("t2": a quota of 0)
PRIORITIES = (0, 10, 20, 30)
DEPLOYMENTS = ("d1", "d2", "d3")


@dataclass
class Replica:
    replica_id: str
    tenant: str
    priority: int
    deployment: str | None
    # (node, GPUs) per shard.
    shards: list[tuple[str, list[int]]]
    order: int

    @property
    def gpus(self) -> int:
        return sum(len(i) for _, i in self.shards)


@dataclass
class Cluster:
    size: dict[str, int] = field(default_factory=dict)
    fabrics: dict[str, list[str]] = field(default_factory=dict)
    sick: set[tuple[str, int]] = field(default_factory=set)
    replicas: list[Replica] = field(default_factory=list)
    budgets: dict[tuple[str, str], int] = field(default_factory=dict)

    def held(self) -> set[tuple[str, int]]:
        return {(n, i) for r in self.replicas for n, idx in r.shards for i in idx}

    def free_after(self, stopped: set[str]) -> dict[str, int]:
        held = {
            (n, i)
            for r in self.replicas
            if r.replica_id not in stopped
            for n, idx in r.shards
            for i in idx
        }
        return {
            n: sum(1 for i in range(k) if (n, i) not in held and (n, i) not in self.sick)
            for n, k in self.size.items()
        }

    def used(self, tenant: str) -> int:
        return sum(r.gpus for r in self.replicas if r.tenant == tenant)


async def build(api: Api, rng: random.Random) -> Cluster:
    cluster = Cluster()
    layouts = [["ib-a"], ["ib-b"], ["ib-a", "ib-b"]]
    for n in range(rng.randint(3, 5)):
        node_id = f"n{n}"
        count = rng.choice((4, 8, 8))
        entries = gpus(H100, count)
        for entry in entries:
            if rng.random() < 0.08:
                entry.update(healthy=False, healthReasons=["ecc_uncorrected"])
                cluster.sick.add((node_id, entry["index"]))
        fabrics = rng.choice(layouts)
        report = node_input(node_id, gpus=entries, fabrics=[attachment(f) for f in fabrics])
        await api(REGISTER, {"input": report})
        cluster.size[node_id], cluster.fabrics[node_id] = count, fabrics
    for t, guaranteed in TENANTS.items():
        await set_tenant(api, t, quota(guaranteed=guaranteed, limit=64))
    await set_tenant(api, "t4")  # no quota: all it holds is borrowed
    # Replicas until the fleet is nearly full.
    for k in range(rng.randint(6, 11)):
        free = cluster.free_after(set())
        nodes = [n for n, f in free.items() if f > 0]
        if not nodes:
            break
        tenant = rng.choice([*TENANTS, "t4"])
        priority = rng.choice(PRIORITIES)
        # A deployment is one tenant's.
        deployment = rng.choice([*(f"{tenant}-{d}" for d in DEPLOYMENTS), None])
        held = cluster.held()
        shards: list[tuple[str, list[int]]] = []
        for node_id in rng.sample(nodes, k=min(len(nodes), rng.choice((1, 1, 1, 2)))):
            open_ = [
                i
                for i in range(cluster.size[node_id])
                if (node_id, i) not in held and (node_id, i) not in cluster.sick
            ]
            shards.append((node_id, sorted(rng.sample(open_, k=rng.randint(1, len(open_))))))
        replica_id = f"r{k}"
        answer = await api(
            ALLOCATE,
            {
                "input": {
                    "replicaId": replica_id,
                    "tenant": tenant,
                    "priority": priority,
                    "deployment": deployment,
                    "shards": [
                        {"shardId": f"{replica_id}-s{j}", "nodeId": n, "gpuIndices": idx}
                        for j, (n, idx) in enumerate(shards)
                    ],
                }
            },
        )
        if answer["allocate"]["__typename"] == "Allocated":
            order = len(cluster.replicas)
            cluster.replicas.append(
                Replica(replica_id, tenant, priority, deployment, shards, order)
            )
    placed = Counter((r.tenant, r.deployment) for r in cluster.replicas if r.deployment)
    for (tenant, deployment), count in sorted(placed.items()):
        if rng.random() < 0.5:
            minimum = rng.randint(1, count)
            await api(SET_BUDGET, {"input": {"deployment": deployment, "tenant": tenant,
                                             "minAvailable": minimum}})  # fmt: skip
            cluster.budgets[(tenant, deployment)] = minimum
    return cluster


def fits(cluster: Cluster, stopped: set[str], per: int, shards: int) -> bool:
    """The docs' rule for a shape without topology: one node, or one fabric, one shard per node's room."""
    free = cluster.free_after(stopped)
    if any(f >= per * shards for f in free.values()):
        return True
    if shards == 1:
        return False
    return any(
        sum(free[n] // per for n in free if fabric in cluster.fabrics[n]) >= shards
        for fabric in ("ib-a", "ib-b")
    )


def oracle(
    cluster: Cluster,
    tenant: str,
    priority: int,
    per: int,
    shards: int,
    budgets: bool = True,
    fit: Callable[[set[str]], bool] | None = None,
) -> tuple[str, ...] | None:
    """The least allowed victim set that makes the shape fit, by the docs' order; None: none.

    `budgets` false: as if no deployment had a budget (what blockingBudgets is about).
    `fit(stopped)`: whether the shape fits once these are stopped (a group's
    rule); the place's (fits) when None.
    """
    guaranteed = TENANTS.get(tenant, 0)
    asked = per * shards
    reclaiming = guaranteed > 0 and cluster.used(tenant) + asked <= guaranteed

    def beyond(t: str) -> int:
        return cluster.used(t) - TENANTS[t] if t in TENANTS else 10**9

    kinds: dict[str, str] = {}
    for r in cluster.replicas:
        if r.priority < priority:
            kinds[r.replica_id] = "LOWER_PRIORITY"
        elif reclaiming and r.tenant != tenant and beyond(r.tenant) > 0:
            kinds[r.replica_id] = "RECLAIM"
    candidates = [r for r in cluster.replicas if r.replica_id in kinds]
    placed = Counter((r.tenant, r.deployment) for r in cluster.replicas if r.deployment)

    def allowed(chosen: tuple[Replica, ...]) -> bool:
        taken = Counter((r.tenant, r.deployment) for r in chosen if r.deployment)
        for key, n in taken.items():
            if budgets and key in cluster.budgets and placed[key] - n < cluster.budgets[key]:
                return False
        reclaimed: Counter[str] = Counter()
        for r in chosen:
            if kinds[r.replica_id] == "RECLAIM":
                reclaimed[r.tenant] += r.gpus
        return all(n <= beyond(t) for t, n in reclaimed.items())

    def key(chosen: tuple[Replica, ...]) -> Any:
        return (
            len(chosen),
            sorted((r.priority for r in chosen), reverse=True),
            sum(r.gpus for r in chosen),
            # Youngest: the oldest victim latest first.
            [-o for o in sorted(r.order for r in chosen)],
            sorted(r.replica_id for r in chosen),
        )

    best: tuple[Replica, ...] | None = None
    for size in range(1, len(candidates) + 1):
        for chosen in itertools.combinations(candidates, size):
            if not allowed(chosen):
                continue
            stopped = {r.replica_id for r in chosen}
            if not (fit(stopped) if fit is not None else fits(cluster, stopped, per, shards)):
                continue
            if best is None or key(chosen) < key(best):
                best = chosen
    return None if best is None else tuple(sorted(r.replica_id for r in best))


@pytest.mark.seeds(range(14))
async def test_place_stops_the_least_set_explain_shows(api: Api, seed: int) -> None:
    rng = random.Random(seed)
    cluster = await build(api, rng)
    compared = 0
    for attempt in range(8):
        tenant = rng.choice([*TENANTS, "t4"])
        priority = rng.choice((10, 20, 30, 40))
        per, shards = rng.choice(((1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (1, 3)))
        if fits(cluster, set(), per, shards):
            continue
        # Within the tenant's limit (64): preemption is asked for room, not quota.
        expected = oracle(cluster, tenant, priority, per, shards)
        replica_id = f"p{attempt}"
        fields = {"tenant": tenant, "priority": priority, "shards": shards,
                  "preemption": "LOWER_PRIORITY"}  # fmt: skip
        said = await explain(api, replica_id, per, **fields)
        got = await place(api, replica_id, per, **fields)
        where = f"seed {seed}, {replica_id}: {shards} x {per} by {tenant} at {priority}"
        if expected is None:
            assert said["placeable"] is False, (where, said)
            assert got["__typename"] == "Unplaceable", (where, got)
            # The budgets named are those the least set would break were there none.
            ignoring = oracle(cluster, tenant, priority, per, shards, budgets=False)
            broken: set[tuple[str, str]] = set()
            if ignoring is not None:
                taken = Counter(
                    (r.tenant, r.deployment)
                    for r in cluster.replicas
                    if r.replica_id in ignoring and r.deployment
                )
                placed = Counter((r.tenant, r.deployment) for r in cluster.replicas)
                broken = {
                    k for k, n in taken.items()
                    if k in cluster.budgets and placed[k] - n < cluster.budgets[k]
                }  # fmt: skip
            named = {(b["tenant"], b["deployment"]) for b in got["blockingBudgets"]}
            assert named == broken, (where, got)
            continue
        assert tuple(victims(said)) == expected, (where, said)
        assert got["__typename"] == "Allocated", (where, got)
        assert tuple(victims(got)) == expected, (where, got)
        compared += 1
        # The cluster as it is now: the victims gone, the new replica held.
        cluster.replicas = [r for r in cluster.replicas if r.replica_id not in expected]
        shards_held: dict[str, list[int]] = defaultdict(list)
        for a in got["allocations"]:
            shards_held[a["nodeId"]] += a["gpuIndices"]
        cluster.replicas.append(
            Replica(replica_id, tenant, priority, None, sorted(shards_held.items()), 1000 + attempt)
        )


def members_of(answer: dict[str, Any], tenant: str, priority: int, order: int) -> list[Replica]:
    """A GroupPlaced's members as the oracle's replicas; a group's members share one creation time."""
    return [
        Replica(m["replicaId"], tenant, priority, None,
                [(a["nodeId"], a["gpuIndices"]) for a in m["allocations"]], order)
        for m in answer["members"]
    ]  # fmt: skip


@pytest.mark.parametrize("seed", range(10))
async def test_place_group_and_scale_group_stop_the_least_set(api: Api, seed: int) -> None:
    rng = random.Random(1000 + seed)
    cluster = await build(api, rng)
    for attempt in range(4):
        tenant = rng.choice([*TENANTS, "t4"])
        priority = rng.choice((10, 20, 30, 40))
        per, replicas = rng.choice(((1, 2), (2, 2), (1, 3), (2, 3), (4, 2)))

        def room_for(count: int, per: int = per) -> Callable[[set[str]], bool]:
            return lambda stopped: (
                sum(f // per for f in cluster.free_after(stopped).values()) >= count
            )

        if room_for(replicas)(set()):
            continue
        expected = oracle(cluster, tenant, priority, per, replicas, fit=room_for(replicas))
        group_id = f"g{attempt}"
        shape = {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": per}
        group = {"groupId": group_id, "roles": [{"role": "w", "replicas": replicas,
                 "shape": shape}], "tenant": tenant, "priority": priority,
                 "preemption": "LOWER_PRIORITY"}  # fmt: skip
        got = (await api(PLACE_GROUP, {"input": group}))["placeGroup"]
        where = f"seed {seed}, {group_id}: {replicas} x {per} by {tenant} at {priority}"
        if expected is None:
            assert got["__typename"] == "Unplaceable", (where, got)
            continue
        assert got["__typename"] == "GroupPlaced", (where, got)
        assert tuple(victims(got)) == expected, (where, got)
        cluster.replicas = [r for r in cluster.replicas if r.replica_id not in expected]
        cluster.replicas += members_of(got, tenant, priority, 1000 + 10 * attempt)

        # Scaled up by replicas that find no free room: the least set for them.
        more = rng.choice((1, 2))
        if room_for(more)(set()):
            continue
        expected = oracle(cluster, tenant, priority, per, more, fit=room_for(more))
        scaled = (await api(SCALE_GROUP, {"id": group_id, "role": "w", "n": more}))["scaleGroup"]
        where = f"{where}, scaled by {more}"
        if expected is None:
            assert scaled["__typename"] == "Unplaceable", (where, scaled)
            continue
        assert scaled["__typename"] == "GroupPlaced", (where, scaled)
        assert tuple(victims(scaled)) == expected, (where, scaled)
        cluster.replicas = [r for r in cluster.replicas if r.replica_id not in expected]
        known = {r.replica_id for r in cluster.replicas}
        added = [r for r in members_of(scaled, tenant, priority, 1005 + 10 * attempt)
                 if r.replica_id not in known]  # fmt: skip
        assert len(added) == more, (where, scaled)
        cluster.replicas += added
