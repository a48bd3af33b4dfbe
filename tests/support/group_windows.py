"""Boards of GPUs and groups for placeGroup's window."""

from __future__ import annotations

import random
from typing import Any

from tests.support.groups import role
from tests.support.reports import H100, gpus
from tests.support.topology import bridged_pairs, hgx_h100

CORDON = 'mutation C($id: ID!) { cordonNode(id: $id, reason: "maintenance") { id } }'


GROUPS: list[dict[str, Any]] = [
    {
        "roles": [role("prefill", 2, 4), role("decode", 4, 2)],
        "kvFrom": "prefill",
        "kvTo": "decode",
        "locality": {"level": "NODE"},
    },
    {
        "roles": [role("prefill", 1, 4), role("decode", 2, 2)],
        "kvFrom": "prefill",
        "kvTo": "decode",
        "locality": {"level": "NVLINK_DOMAIN", "hard": True},
    },
    {
        "roles": [role("prefill", 1, 4, shards=2), role("decode", 3, 2)],
        "kvFrom": "prefill",
        "kvTo": "decode",
        "locality": {"level": "NVLINK_DOMAIN"},
    },
    {
        "roles": [role("p", 1, 2, nvlinkShards=True), role("d", 2, 1)],
        "locality": {"level": "NODE", "hard": True},
    },
    {"roles": [role("a", 3, 1), role("b", 1, 3)], "locality": {"level": "FABRIC"}},
    {
        "roles": [role("p", 2, 4, shards=2, fabric="ib-a"), role("d", 2, 8)],
        "kvFrom": "p",
        "kvTo": "d",
        "locality": {"level": "ANY"},
    },
    {
        "roles": [role("p", 1, 8), role("d", 2, 4, nvlinkShards=True)],
        "kvFrom": "p",
        "kvTo": "d",
        "locality": {"level": "FABRIC", "hard": True},
    },
]


def boards(rng: random.Random) -> list[dict[str, Any]]:
    entries = rng.choice([hgx_h100(near=False), bridged_pairs(), gpus(H100, 4)])
    if rng.random() < 0.4:
        # A GB200-style NVLink domain: a few of them across the cluster.
        domain = f"nvl/{rng.randrange(3)}"
        entries = [{**e, "nvlinkDomain": domain} for e in entries]
    return entries
