"""allocate and place choose a replica's fabric by one rule (service/scheduling/fabric_choice.py).

Speed first (the fastest slowest link on the replica's nodes), then the
name. Each story runs through both allocate (the caller names the nodes) and
place and explainPlacement (the service picks them), on nodes that share
fabrics of different speeds; and a source scan fails on a second rule.
"""

from __future__ import annotations

import re
from typing import Any

from tests.support.api import Api
from tests.support.one_definition import ROOT, second_definitions
from tests.support.reports import (
    ALLOCATE,
    EXPLAIN,
    PLACE,
    REGISTER,
    allocation,
    node_input,
    placement,
    shard,
)

HOME = ROOT / "service" / "scheduling" / "fabric_choice.py"

# What a second rule looks like: a choice by link speed, or a fabric picked
# by its name alone (the form place() once had: its plans tied on the name).
SECOND_RULES = {
    "a choice by link speed": re.compile(
        r"\b(min|max|sorted)\(.*\brates?(_gbps)?\b|ORDER BY[^\"']*rate_gbps", re.I
    ),
    "a fabric picked by name": re.compile(
        r"\bmin\(\s*(common|shared|fabrics)\s*\)|\bleftover\s*,\s*fabric\s*,"
    ),
}


def test_the_fabric_rule_is_defined_in_one_place() -> None:
    found = second_definitions(HOME, SECOND_RULES)
    assert not found, "choose with service/scheduling/fabric_choice.py instead:\n" + "\n".join(
        found
    )


def test_the_scan_would_see_the_rules_it_forbids() -> None:
    old_forms = {
        "a choice by link speed": [
            "key=lambda f: (-min(attachments[n][f].rate_gbps for n in node_ids), f),",
            "ORDER BY fa.rate_gbps DESC, fa.fabric",
        ],
        "a fabric picked by name": [
            'key = (-on_holders, len(taken), leftover, fabric, domain or "")',
            "return min(common)",
        ],
    }
    for what, lines in old_forms.items():
        for line in lines:
            assert SECOND_RULES[what].search(line), (what, line)
    assert SECOND_RULES["a choice by link speed"].search(HOME.read_text())


async def register(api: Api, node_id: str, *fabrics: tuple[str, int]) -> None:
    attached = [
        {"fabric": name, "hcas": [f"mlx5_{i}"], "rateGbps": rate}
        for i, (name, rate) in enumerate(fabrics)
    ]
    await api(REGISTER, {"input": node_input(node_id, fabrics=attached)})


async def fabric_of_each(api: Api, replica_id: str) -> dict[str, Any]:
    """The fabric allocate, explainPlacement and place give a 2-shard replica, one shard a node."""
    allocated = (
        await api(
            ALLOCATE,
            allocation(
                f"{replica_id}-allocated",
                shard(f"{replica_id}-a0", "n1", 0, 1, 2, 3, 4, 5, 6, 7),
                shard(f"{replica_id}-a1", "n2", 0, 1, 2, 3, 4, 5, 6, 7),
            ),
        )
    )["allocate"]
    fabrics = {a["fabric"] for a in allocated["allocations"]}
    assert len(fabrics) == 1
    # Release it, so that place has the same nodes to choose from.
    released = await api(
        "mutation($r: ID!) { releaseReplica(replicaId: $r) }", {"r": f"{replica_id}-allocated"}
    )
    assert released["releaseReplica"] == 16  # GPUs
    asked = placement(f"{replica_id}-placed", shards=2, gpusPerShard=8)
    explained = (await api(EXPLAIN, asked))["explainPlacement"]
    placed = (await api(PLACE, asked))["place"]
    assert placed["__typename"] == "Allocated", placed
    assert sorted(a["nodeId"] for a in placed["allocations"]) == ["n1", "n2"]
    return {
        "allocate": fabrics.pop(),
        "explain": explained["fabric"],
        "place": {a["fabric"] for a in placed["allocations"]},
    }


async def test_the_faster_fabric_wins_over_the_name_in_allocate_and_place(api: Api) -> None:
    # ib-a sorts first but runs at 100 Gb/s on n2: a collective on it runs at 100.
    await register(api, "n1", ("ib-a", 400), ("ib-b", 400))
    await register(api, "n2", ("ib-a", 100), ("ib-b", 400))

    assert await fabric_of_each(api, "r") == {
        "allocate": "ib-b",
        "explain": "ib-b",
        "place": {"ib-b"},
    }


async def test_fabrics_of_one_speed_are_chosen_by_name_in_allocate_and_place(api: Api) -> None:
    await register(api, "n1", ("ib-b", 200), ("ib-a", 200))
    await register(api, "n2", ("ib-b", 200), ("ib-a", 200))

    assert await fabric_of_each(api, "r") == {
        "allocate": "ib-a",
        "explain": "ib-a",
        "place": {"ib-a"},
    }
