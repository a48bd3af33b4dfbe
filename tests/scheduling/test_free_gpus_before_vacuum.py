"""freeGpus' whole answer, paged, costs what its pages hold on a table nothing has vacuumed or analyzed yet.

Issue 39: on a cluster just registered through the API (10,000 nodes in the
real-cluster benchmark), before autovacuum has visited gpu_pools, the planner
knows neither its rows nor which of its pages are all-visible. For a page of
freeGpus by class it then chose a bitmap scan of every pool of the class
and a sort, for every page, over the walk of ix_gpu_pools_free that stops
at the page: the whole answer cost the class times the pages, and more
than the plain tables' naive SQL. Here gpu_pools is made as large as that
(four classes on every node) through registerNode alone, and every
statement of every page of the whole answer is explained, before any VACUUM
or ANALYZE: the rows its scans visit and the buffers it touches per page,
which do not depend on the machine's speed, must stay within a constant
times the page (a heap fetch per entry is allowed: the visibility map is
empty until the first VACUUM).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from tests.support.page_costs import (
    Cluster,
    Read,
    Template,
    Templates,
    api_on,
    as_built,
    no_autovacuum,
    node_id,
)
from tests.support.reports import A100, H100, H200, L40S, gpus, node_input

# Four pools per node: 10,000 rows in gpu_pools, as at the benchmark's 10,000
# nodes, where the planner without statistics took the bitmap scan and sort.
NODES = 2500
PAGE = 250
# Per entry: the index entry and its heap row (no page is all-visible yet);
# per statement: descents, the cursor's row, the page's JSON.
PER_ENTRY = (2, 2)
FIXED = 100
WHOLE = (
    'query($after: ID, $first: Int!) { freeGpus(gpuClass: "H100-80GB", minFree: 2,'
    " first: $first, after: $after) { node { id } gpuIndices } }"
)
# The same answer from the GPUs themselves: what freeGpus must equal.
NAIVE = """
SELECT g.node_id, array_agg(g.idx ORDER BY g.idx) AS indices
FROM gpus g JOIN nodes n ON n.id = g.node_id
WHERE n.state = 'ready' AND g.gpu_class = 'H100-80GB' AND g.healthy
  AND NOT EXISTS (SELECT 1 FROM allocated_gpus a WHERE a.node_id = g.node_id AND a.gpu_index = g.idx)
GROUP BY g.node_id HAVING count(*) >= 2
ORDER BY g.node_id
"""


class FourClasses(Cluster):
    @staticmethod
    def report(i: int) -> dict[str, Any]:
        entries = [
            {**entry, "index": 2 * k + j, "uuid": f"GPU-{2 * k + j:04d}"}
            for k, model in enumerate((H100, A100, L40S, H200))
            for j, entry in enumerate(gpus(model, 2))
        ]
        return node_input(node_id(i), gpus=entries)


async def registered(url: str) -> None:
    """The cluster, built once (page_cost_templates): autovacuum off, the nodes registered through the API."""
    async with api_on(url, FourClasses, PAGE) as (api, dsn):
        raw = await asyncpg.connect(dsn)
        try:
            tables = ("nodes", "gpus", "gpu_pools", "allocated_gpus", "fabric_attachments")
            await no_autovacuum(raw, tables)
        finally:
            await raw.close()
        ids = list(range(NODES))
        batches = [ids[k : k + 50] for k in range(0, NODES, 50)]
        for k in range(0, len(batches), 4):
            await asyncio.gather(*(api.register(b) for b in batches[k : k + 4]))


@pytest.fixture
def case_database(page_cost_templates: Templates) -> Iterator[tuple[str, Template]]:
    with page_cost_templates.clone("unvacuumed", registered) as both:
        yield both


@pytest.fixture
async def cluster(
    case_database: tuple[str, Template],
) -> AsyncIterator[tuple[FourClasses, str, Template]]:
    url, template = case_database
    async with api_on(url, FourClasses, PAGE) as (api, dsn):
        yield api, dsn, template


async def test_every_page_of_the_whole_answer_costs_the_page_before_any_vacuum(
    cluster: tuple[FourClasses, str, Template],
) -> None:
    api, dsn, template = cluster
    raw = await asyncpg.connect(dsn)
    try:
        # The clone holds the cluster as registered, unanalyzed, and its visibility
        # map as empty as the template's: no page of gpu_pools is all-visible.
        await as_built(raw, template)
        relallvisible = await raw.fetchval(
            "SELECT relallvisible FROM pg_class WHERE relname = 'gpu_pools'"
        )
        assert relallvisible == 0
        assert await raw.fetchval("SELECT count(*) FROM gpu_pools") == 4 * NODES
        # Nothing has vacuumed or analyzed the tables: the planner's state on a new cluster.
        never = await raw.fetchval(
            "SELECT count(*) FROM pg_stat_user_tables WHERE relname = 'gpu_pools'"
            " AND coalesce(vacuum_count + autovacuum_count + analyze_count + autoanalyze_count, 0)"
            " = 0"
        )
        assert never == 1

        answer: list[tuple[str, list[int]]] = []
        over: list[str] = []
        after = None
        while True:
            read = {"after": after, "first": PAGE}
            page = (await api.send(WHOLE, read))["data"]["freeGpus"]
            answer += [(e["node"]["id"], e["gpuIndices"]) for e in page]
            costs = await api.costs(raw, Read("freeGpus", WHOLE, read, entries=PAGE))
            for c in costs:
                rows_bound = PER_ENTRY[0] * PAGE + FIXED
                buffers_bound = PER_ENTRY[1] * PAGE + FIXED
                if c.rows > rows_bound or c.buffers > buffers_bound:
                    over.append(
                        f"page after {after} ({c.plan} plan): {c.rows} rows, {c.buffers} buffers"
                        f" (bound {rows_bound}, {buffers_bound})"
                    )
            if len(page) < PAGE:
                break
            after = page[-1]["node"]["id"]
        assert not over, "\n".join(over)
        expected = [(r["node_id"], list(r["indices"])) for r in await raw.fetch(NAIVE)]
        assert answer == expected
        assert len(answer) == NODES
    finally:
        await raw.close()
