"""Seeded random clusters over two fabrics, with holes, sick and tainted GPUs."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from tests.support.api import Api
from tests.support.reports import (
    ALLOCATE,
    H100,
    REGISTER,
    allocation,
    gpus,
    node_input,
    shard,
)


def attachment(fabric: str, rate: int = 400) -> dict[str, Any]:
    hcas = ["mlx5_0", "mlx5_1"] if fabric == "ib-a" else ["mlx5_2", "mlx5_3"]
    return {"fabric": fabric, "hcas": hcas, "rateGbps": rate}


TAINT_GPUS = (
    "mutation T($node: ID!, $indices: [Int!]!, $taint: TaintInput!)"
    " { taintGpus(nodeId: $node, indices: $indices, taint: $taint) { index } }"
)


TAINT_NODE = (
    "mutation T($node: ID!, $taint: TaintInput!) { taintNode(nodeId: $node, taint: $taint) { id } }"
)


# Issue 38: taints of each effect on some GPUs and nodes, and the tolerations
# a shape is tried with: none, one that opens the NO_SCHEDULE ones, one that
# opens the NO_EXECUTE ones and lifts the PREFER_NO_SCHEDULE penalty.
TAINT_KEYS = {"xid-79": "NO_SCHEDULE", "dedicated": "NO_EXECUTE", "burn-in": "PREFER_NO_SCHEDULE"}


async def taint_some(api: Api, rng: random.Random, node_id: str, count: int) -> None:
    """Taints as an operator or the policy would set them, on a node's GPUs or on the node."""
    for key, effect in TAINT_KEYS.items():
        taint = {"key": key, "effect": effect, "reason": "drawn"}
        draw = rng.random()
        if draw < 0.05:
            await api(TAINT_NODE, {"node": node_id, "taint": taint})
        elif draw < 0.3:
            indices = sorted(rng.sample(range(count), k=rng.randint(1, 2)))
            await api(TAINT_GPUS, {"node": node_id, "indices": indices, "taint": taint})


FABRIC_LAYOUTS: list[list[str]] = [["ib-a"], ["ib-b"], ["ib-a", "ib-b"], []]


def plain_gpus(rng: random.Random) -> list[dict[str, Any]]:
    return gpus(H100, rng.choice([8, 8, 4]))


async def random_cluster(
    api: Api,
    rng: random.Random,
    *,
    nodes: tuple[int, int] = (5, 9),
    layouts: list[list[str]] = FABRIC_LAYOUTS,
    gpus_of: Callable[[random.Random], list[dict[str, Any]]] = plain_gpus,
) -> None:
    """Nodes on ib-a, ib-b or both (at least two on both), some GPUs sick, some held, some tainted."""
    count = rng.randint(*nodes)
    chosen = [["ib-a", "ib-b"], ["ib-a", "ib-b"]] + [rng.choice(layouts) for _ in range(count - 2)]
    for i, fabrics in enumerate(chosen):
        entries = gpus_of(rng)
        for entry in entries:
            if rng.random() < 0.08:
                entry.update(healthy=False, healthReasons=["ecc_uncorrected"])
        rates = {f: rng.choice([200, 400, 400]) for f in fabrics}
        report = node_input(
            f"n{i}", gpus=entries, fabrics=[attachment(f, rates[f]) for f in fabrics]
        )
        await api(REGISTER, {"input": report})
        if rng.random() < 0.4:
            healthy = [e["index"] for e in entries if e["healthy"]]
            hole = rng.sample(healthy, k=min(len(healthy), rng.randint(1, 3)))
            held = await api(
                ALLOCATE, allocation(f"hole-{i}", shard(f"hole-{i}-s0", f"n{i}", *hole))
            )
            assert held["allocate"]["__typename"] == "Allocated", held
        await taint_some(api, rng, f"n{i}", len(entries))
