"""maxAge: a node whose GPU facts are older is not offered, and explainPlacement says FACTS_STALE.

One definition (service/scheduling/freshness.py) behind freeGpus, nodes,
place and explainPlacement; checked here on one cluster with a fresh node
and a stale one, and the SQL and Python forms against each other.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.scheduling.freshness import gpu_facts_age, gpu_facts_fresh, is_fresh
from tests.support.api import Api
from tests.support.reports import EXPLAIN, PLACE, REGISTER, node_input

ROOT = Path(__file__).resolve().parents[2]

FREE = """
query Free($maxAge: Int) { freeGpus(gpuClass: "H100-80GB", maxAge: $maxAge) { node { id } } }
"""
NODES = "query Nodes($maxAge: Int) { nodes(maxAge: $maxAge) { id } }"


def ago(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat()


@pytest.fixture
async def cluster(api: Api) -> None:
    """fresh: GPUs seen 10 s ago; stale: 10 minutes ago (its discovery stopped, its beats did not)."""
    await api(REGISTER, {"input": node_input("fresh", gpusObservedAt=ago(10))})
    await api(REGISTER, {"input": node_input("stale", gpusObservedAt=ago(600))})


def place(replica: str, **extra: Any) -> dict[str, Any]:
    return {"input": {"replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": 8, **extra}}


async def test_free_gpus_and_nodes_offer_only_fresh_facts(api: Api, cluster: None) -> None:
    async def ids(query: str, field: str, max_age: int | None) -> list[str]:
        rows = (await api(query, {"maxAge": max_age}))[field]
        return [r["node"]["id"] if "node" in r else r["id"] for r in rows]

    assert await ids(FREE, "freeGpus", None) == ["fresh", "stale"]
    assert await ids(FREE, "freeGpus", 60) == ["fresh"]
    assert await ids(FREE, "freeGpus", 3600) == ["fresh", "stale"]
    assert await ids(NODES, "nodes", None) == ["fresh", "stale"]
    assert await ids(NODES, "nodes", 60) == ["fresh"]
    assert await ids(NODES, "nodes", 0) == []


async def test_place_skips_stale_nodes_and_explain_says_why(api: Api, cluster: None) -> None:
    first = (await api(PLACE, place("r1", maxAge=60)))["place"]
    assert first["__typename"] == "Allocated"
    assert {a["nodeId"] for a in first["allocations"]} == {"fresh"}

    second = (await api(PLACE, place("r2", maxAge=60)))["place"]
    assert second["__typename"] == "Unplaceable"
    verdicts = {v["nodeId"]: v for v in second["verdicts"]}
    assert verdicts["stale"]["code"] == "FACTS_STALE"
    assert "older than maxAge 60 s" in verdicts["stale"]["detail"]
    assert verdicts["fresh"]["code"] == "NOT_ENOUGH_GPUS"

    explained = (await api(EXPLAIN, place("r2", maxAge=60)))["explainPlacement"]
    assert not explained["placeable"]
    assert {v["nodeId"]: v["code"] for v in explained["verdicts"]}["stale"] == "FACTS_STALE"

    # Without maxAge the stale node is as good as any.
    third = (await api(PLACE, place("r2")))["place"]
    assert {a["nodeId"] for a in third["allocations"]} == {"stale"}


async def test_a_report_makes_a_stale_node_fresh_again(api: Api, cluster: None) -> None:
    await api(REGISTER, {"input": node_input("stale", gpusObservedAt=ago(1))})
    assert len((await api(FREE, {"maxAge": 60}))["freeGpus"]) == 2


async def test_a_negative_max_age_is_refused_naming_it(api: Api, cluster: None) -> None:
    for query, field in ((FREE, "freeGpus"), (NODES, "nodes")):
        error = await api.fails(query, {"maxAge": -1})
        assert error["extensions"]["code"] == "BAD_INPUT", field
        assert error["extensions"]["field"] == "maxAge"
        assert error["extensions"]["value"] == -1
    refused = (await api(PLACE, place("r1", maxAge=-5)))["place"]
    assert refused["__typename"] == "AllocationRejected" and refused["code"] == "INVALID"
    assert "maxAge=-5" in refused["message"]
    error = await api.fails(EXPLAIN, place("r1", maxAge=-5))
    assert error["extensions"]["code"] == "BAD_INPUT" and "maxAge=-5" in error["message"]
    assert (await api("{ allocations { shardId } }"))["allocations"] == []


async def test_the_sql_and_python_forms_agree(api: Api, cluster: None, engine: AsyncEngine) -> None:
    await api(REGISTER, {"input": node_input("edge", gpusObservedAt=ago(60))})
    for max_age in (0, 9, 59, 60, 61, 599, 601, 10**6):
        # Age and verdict in one statement: one now() for both.
        sql = text(
            f"SELECT n.id, {gpu_facts_age('n')} AS age, {gpu_facts_fresh('n', ':m')} AS fresh"
            " FROM nodes n"
        )
        async with engine.connect() as conn:
            rows = list(await conn.execute(sql, {"m": max_age}))
        assert len(rows) == 3
        for row in rows:
            assert row.fresh == is_fresh(float(row.age), max_age), (row, max_age)


# The column compared with a time, or subtracted from the clock: a second rule.
SECOND_DEFINITION = re.compile(
    r"gpus_observed_at\s*(>=|<=|>|<)|now\(\)\s*-\s*(\w+\.)?gpus_observed_at|gpus_facts_age\s*(>|<)"
)


def test_the_staleness_rule_has_one_home() -> None:
    home = ROOT / "service" / "scheduling" / "freshness.py"
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "service").rglob("*.py"))
        if path != home
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SECOND_DEFINITION.search(line)
    ]
    assert not found


FIT = """
query Fit($shape: PlaceInput!) { fit(shape: $shape) { replicas limitedBy { code nodes } } }
"""


async def test_fit_counts_only_fresh_nodes_and_says_the_rest_are_stale(
    api: Api, cluster: None
) -> None:
    shape = place("any", maxAge=60)["input"]
    counted = (await api(FIT, {"shape": shape}))["fit"]
    assert counted["replicas"] == 1
    assert {"code": "FACTS_STALE", "nodes": 1} in counted["limitedBy"]
    anyway = (await api(FIT, {"shape": place("any")["input"]}))["fit"]
    assert anyway["replicas"] == 2
