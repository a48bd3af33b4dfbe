"""ctl allocations --stale (shardsToMove) costs its page on a fleet's taints table, in every statistics state.

shardsToMove starts from the nodes a NO_EXECUTE taint is on. A fleet's
taints table is mostly other taints (XIDs, burn-in, drift: NO_SCHEDULE and
PREFER_NO_SCHEDULE), and NO_EXECUTE ones are rare; read as a pass over every
taint, the page cost the table (migration 0020's ix_taints_no_execute is the
way in). test_page_costs loads a taints table of a few pages, which the
planner rightly reads whole once analyzed; here it is made many pages
(every GPU of the cluster carries a PREFER_NO_SCHEDULE taint, through
taintGpus), and the page must still cost its entries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import asyncpg  # type: ignore[import-untyped]
import pytest

from service.ctl.capacity import SHARDS_TO_MOVE
from tests.support.page_costs import (
    PAGE,
    REGISTER_BATCH,
    Cluster,
    Read,
    Template,
    Templates,
    api_on,
    as_built,
    no_autovacuum,
    node_id,
    over_bound,
)

NODES = 1500
# One node in 100 carries a NO_EXECUTE taint; which nodes hold a shard (on GPUs 4-7,
# healthy and untainted on every node) is the layout.
NO_EXECUTE = range(5, NODES, 100)
LAYOUTS = {
    "every fifth node holds a shard": range(0, NODES, 5),
    "the first third hold a shard": range(NODES // 3),
}
STATES = {
    "before ANALYZE": "",
    "after ANALYZE": "ANALYZE",
    "after VACUUM ANALYZE": "VACUUM ANALYZE",
}


# Both layouts share one cluster as registered (page_cost_templates): one worker
# builds it and runs them (pytest-xdist's --dist loadgroup).
pytestmark = pytest.mark.xdist_group("page_costs_moves")


async def registered(url: str) -> None:
    """What both layouts start from, built once: autovacuum off, the nodes registered and
    every GPU tainted PREFER_NO_SCHEDULE (which allocate's explicit GPUs do not refuse:
    such GPUs are offered to everyone, used last), through the API."""
    async with api_on(url, Cluster, PAGE) as (api, dsn):
        raw = await asyncpg.connect(dsn)
        try:
            await no_autovacuum(raw, ("taints", "shards", "nodes", "gpus"))
        finally:
            await raw.close()
        ids = list(range(NODES))
        for k in range(0, NODES, REGISTER_BATCH):
            await api.register(ids[k : k + REGISTER_BATCH])
        await mutate(
            api,
            [
                f'g{i}: taintGpus(nodeId: "{node_id(i)}", indices: [0, 1, 2, 3, 4, 5, 6, 7],'
                ' taint: {key: "burn-in", effect: PREFER_NO_SCHEDULE, reason: "new"}) { index }'
                for i in ids
            ],
        )


@pytest.fixture
def case_database(page_cost_templates: Templates) -> Iterator[tuple[str, Template]]:
    with page_cost_templates.clone("moves", registered) as both:
        yield both


@pytest.fixture
async def cluster(
    case_database: tuple[str, Template],
) -> AsyncIterator[tuple[Cluster, str, Template]]:
    url, template = case_database
    async with api_on(url, Cluster, PAGE) as (api, dsn):
        yield api, dsn, template


async def mutate(api: Cluster, fields: list[str]) -> None:
    for k in range(0, len(fields), REGISTER_BATCH):
        body = await api.send("mutation { " + " ".join(fields[k : k + REGISTER_BATCH]) + " }", {})
        assert not body.get("errors"), body


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_the_stale_list_costs_its_page_however_many_other_taints_there_are(
    cluster: tuple[Cluster, str, Template], layout: str
) -> None:
    api, dsn, template = cluster
    raw = await asyncpg.connect(dsn)
    try:
        await as_built(raw, template)
        holding = list(LAYOUTS[layout])
        for k in range(0, len(holding), REGISTER_BATCH):
            await api.allocate([(i, [4, 5, 6, 7]) for i in holding[k : k + REGISTER_BATCH]])
        await mutate(
            api,
            [
                f'n{i}: taintNode(nodeId: "{node_id(i)}", taint: {{key: "maintenance",'
                ' effect: NO_EXECUTE, reason: "firmware"}) { id }'
                for i in NO_EXECUTE
            ],
        )
        taints = await raw.fetchval("SELECT count(*) FROM taints")
        pages = await raw.fetchval("SELECT pg_relation_size('taints') / 8192")
        assert taints > 8 * NODES and pages > 50, (taints, pages)

        read = Read("ctl stale allocations: shards to move", SHARDS_TO_MOVE, {"first": PAGE})
        expected = sorted(f"s-{i}" for i in NO_EXECUTE if i in holding)
        assert expected, "no shard on a NO_EXECUTE node: the list would be empty"
        found: list[str] = []
        for state, statement in STATES.items():
            if statement:
                await raw.execute(statement)
            page = (await api.send(SHARDS_TO_MOVE, {"first": PAGE}))["data"]["shardsToMove"]
            assert [s["shardId"] for s in page] == expected[:PAGE], state
            assert {s["taint"]["key"] for s in page} == {"maintenance"}
            costs = await api.costs(raw, read)
            found.extend(f"{state}: {o}" for o in await over_bound(raw, read, costs))
        assert not found, "\n".join(found)
    finally:
        await raw.close()
