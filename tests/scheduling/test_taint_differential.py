"""A seeded differential: on random clusters with taints, every answer agrees with place and with the rule.

Each seed draws a cluster (nodes of 4 or 8 GPUs, some sick, some held, some
cordoned) and taints of every effect on GPUs and on whole nodes, with keys
and values from a small vocabulary so that tolerations match some and miss
others; then requests with random tolerations. For each:

- freeGpus lists exactly the GPUs the matching rule offers, computed here in
  Python from what the generator put in (service/scheduling/taints.tolerates);
- gpuClasses' free and tainted are that rule's counts for no tolerations;
- fit counts what place then places one by one, and one more is Unplaceable;
- explainPlacement says placeable exactly when place would place.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.scheduling.taints import (
    HARD_EFFECTS,
    Taint,
    TaintEffect,
    TaintSource,
    Toleration,
    TolerationOperator,
    tolerates,
)
from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.reports import (
    ALLOCATE,
    EXPLAIN,
    H100,
    PLACE,
    REGISTER,
    allocation,
    gpus,
    node_input,
    shard,
)

SEEDS = range(6)
KEYS = ("xid-79", "dedicated", "burn-in")
VALUES = (None, "a", "b")

TAINT_GPUS = """
mutation T($node: ID!, $indices: [Int!]!, $taint: TaintInput!) {
  taintGpus(nodeId: $node, indices: $indices, taint: $taint) { index }
}
"""
TAINT_NODE = (
    "mutation T($node: ID!, $taint: TaintInput!) { taintNode(nodeId: $node, taint: $taint) { id } }"
)
CORDON_GPU = 'mutation C($node: ID!, $i: Int!) { cordonGpu(nodeId: $node, index: $i, reason: "r") { index } }'
FREE = """
query F($tolerations: [TolerationInput!]) {
  freeGpus(gpuClass: "H100-80GB", tolerations: $tolerations) { node { id } gpuIndices }
}
"""
FIT = "query F($shape: PlaceInput!) { fit(shape: $shape) { replicas } }"
CLASSES = "{ gpuClasses { free tainted } }"
RELEASE = "mutation R($id: ID!) { releaseReplica(replicaId: $id) }"


@dataclass
class Cluster:
    """What the generator put in, to compute the rule's answer from."""

    gpus: dict[str, int] = field(default_factory=dict)
    # (node, index) of GPUs that are sick, cordoned or held: never offered.
    out: set[tuple[str, int]] = field(default_factory=set)
    taints: list[Taint] = field(default_factory=list)
    node_of: dict[int, str] = field(default_factory=dict)

    def offered(self, tolerations: tuple[Toleration, ...]) -> dict[str, list[int]]:
        answer: dict[str, list[int]] = {}
        for node_id, count in self.gpus.items():
            indices = []
            for i in range(count):
                if (node_id, i) in self.out:
                    continue
                on = [
                    t
                    for k, t in enumerate(self.taints)
                    if self.node_of[k] == node_id and t.gpu_index in (None, i)
                ]
                if all(tolerates(tolerations, t) for t in on if t.effect in HARD_EFFECTS):
                    indices.append(i)
            if indices:
                answer[node_id] = indices
        return answer


def effect_of(rng: random.Random) -> TaintEffect:
    return rng.choice(list(TaintEffect))


async def build(api: Api, rng: random.Random) -> Cluster:
    cluster = Cluster()
    for n in range(rng.randint(3, 6)):
        node_id = f"n{n}"
        count = rng.choice((4, 8))
        entries = gpus(H100, count)
        for i in range(count):
            if rng.random() < 0.08:
                entries[i] = {**entries[i], "healthy": False, "healthReasons": ["ecc"]}
                cluster.out.add((node_id, i))
        await api(REGISTER, {"input": node_input(node_id, gpus=entries)})
        cluster.gpus[node_id] = count
        if rng.random() < 0.2:
            i = rng.randrange(count)
            await api(CORDON_GPU, {"node": node_id, "i": i})
            cluster.out.add((node_id, i))
        if rng.random() < 0.3:
            i = rng.randrange(count)
            held = await api(ALLOCATE, allocation(f"pre-{n}", shard(f"pre-{n}-s0", node_id, i)))
            if held["allocate"]["__typename"] == "Allocated":
                cluster.out.add((node_id, i))
        for _ in range(rng.choice((0, 0, 1, 2, 3))):
            key, value, effect = rng.choice(KEYS), rng.choice(VALUES), effect_of(rng)
            taint = {"key": key, "value": value, "effect": effect.value, "reason": "drawn"}
            on_node = rng.random() < 0.25
            if on_node:
                await api(TAINT_NODE, {"node": node_id, "taint": taint})
                indices: list[int | None] = [None]
            else:
                chosen = sorted(rng.sample(range(count), rng.randint(1, 3)))
                await api(TAINT_GPUS, {"node": node_id, "indices": chosen, "taint": taint})
                indices = list(chosen)
            for index in indices:
                # A taint of the same key there replaces the earlier one.
                for k in reversed(range(len(cluster.taints))):
                    t = cluster.taints[k]
                    if cluster.node_of[k] == node_id and t.key == key and t.gpu_index == index:
                        del cluster.taints[k]
                        cluster.node_of = {
                            j - (j > k): v for j, v in cluster.node_of.items() if j != k
                        }
                cluster.node_of[len(cluster.taints)] = node_id
                cluster.taints.append(
                    Taint(
                        key,
                        value,
                        effect,
                        TaintSource.OPERATOR,
                        "drawn",
                        datetime.now(UTC),
                        gpu_index=index,
                    )
                )
    return cluster


def draw_tolerations(rng: random.Random) -> tuple[Toleration, ...]:
    drawn = []
    for _ in range(rng.choice((0, 1, 1, 2))):
        operator = rng.choice(list(TolerationOperator))
        drawn.append(
            Toleration(
                key=rng.choice(KEYS),
                operator=operator,
                value=None if operator is TolerationOperator.EXISTS else rng.choice(VALUES),
                effect=rng.choice([None, *TaintEffect]),
            )
        )
    return tuple(drawn)


def as_input(tolerations: tuple[Toleration, ...]) -> list[dict[str, Any]]:
    return [
        {
            "key": t.key,
            "operator": t.operator.value,
            "value": t.value,
            "effect": None if t.effect is None else t.effect.value,
        }
        for t in tolerations
    ]


@pytest.mark.seeds(SEEDS)
async def test_answers_agree_with_place_and_the_rule_on_random_tainted_clusters(
    api: Api, engine: AsyncEngine, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = await build(api, rng)
    offered = cluster.offered(())
    summary = (await api(CLASSES))["gpuClasses"][0]
    assert summary["free"] == sum(len(i) for i in offered.values()), seed
    every_gpu = {(n, i) for n, c in cluster.gpus.items() for i in range(c)} - cluster.out
    assert summary["tainted"] == len(every_gpu) - summary["free"], seed

    for round_ in range(4):
        tolerations = draw_tolerations(rng) if round_ else ()
        given = as_input(tolerations)
        expected = cluster.offered(tolerations)
        free = (await api(FREE, {"tolerations": given}))["freeGpus"]
        assert {e["node"]["id"]: e["gpuIndices"] for e in free} == expected, (seed, tolerations)

        per = rng.choice((1, 2, 4))
        shards = rng.choice((1, 1, 2))
        shape = {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": per,
                 "shards": shards, "tolerations": given}  # fmt: skip
        counted = (await api(FIT, {"shape": shape}))["fit"]["replicas"]
        placed: list[str] = []
        while True:
            explained = (await api(EXPLAIN, {"input": shape}))["explainPlacement"]
            replica = f"s{seed}-r{round_}-{len(placed)}"
            answer = (await api(PLACE, {"input": {**shape, "replicaId": replica}}))["place"]
            assert explained["placeable"] == (answer["__typename"] == "Allocated"), answer
            if answer["__typename"] != "Allocated":
                assert answer["__typename"] == "Unplaceable", answer
                break
            for allocation_ in answer["allocations"]:
                for i in allocation_["gpuIndices"]:
                    assert i in expected[allocation_["nodeId"]], (seed, tolerations, answer)
            placed.append(replica)
        assert len(placed) == counted, (seed, tolerations, shape)
        for replica in placed:
            await api(RELEASE, {"id": replica})
    assert await inconsistencies(engine) == []
