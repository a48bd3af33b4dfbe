"""place with 100 maintenance windows in force, against place with none, in the same rounds (issue 47).

Issue 47's target: at 10,000 nodes, with 100 maintenance windows draining
(each on its own node), a place costs at most 1.1x a place with none: the
candidate windows probe each pool's node for a window in force
(service/scheduling/maintenance_rule.py, ix_maintenance_nodes_node_id). The
100 windows are booked through the API (start in an hour, drainLead two
hours: in force now); between rounds their state is flipped to CANCELLED
and back (untimed), so both kinds read the same tables and indexes and only
"in force" differs. Each round times one place of 1x H100-80GB of each kind,
in alternating order, each released untimed; the figures are the medians
and their ratio, measured in the same run.

    python -m benchmarks.maintenance [--nodes 10000] [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import text

from benchmarks.fit import run
from service.config import Settings
from service.database.db import create_engine, dispose
from service.event_log.event_announcements import drain_announcements
from service.web.app import create_app

WINDOWS = 100
PLACE = """
mutation Place($input: PlaceInput!) {
  place(input: $input) { __typename ... on Allocated { allocations { nodeId } } }
}
"""
RELEASE = "mutation R($id: ID!) { releaseReplica(replicaId: $id) }"
SCHEDULE = "mutation S($input: MaintenanceInput!) { scheduleMaintenance(input: $input) { id } }"
FLIP = text("UPDATE maintenance_windows SET state = :state WHERE id LIKE 'bench-%'")


async def _post(client: httpx.AsyncClient, query: str, variables: dict[str, Any]) -> Any:
    response = await client.post("/graphql", json={"query": query, "variables": variables})
    body = response.json()
    assert not body.get("errors"), body
    return body["data"]


async def book_windows(client: httpx.AsyncClient, nodes: list[str]) -> tuple[list[str], datetime]:
    """WINDOWS one-node windows an hour from now, draining already, spread over the fleet as racks
    are: the nodes chosen and the windows' start."""
    chosen = nodes[:: max(1, len(nodes) // WINDOWS)][:WINDOWS]
    start = datetime.now(UTC) + timedelta(hours=1)
    for i, node_id in enumerate(chosen):
        spec = {"id": f"bench-{i}", "nodeIds": [node_id], "start": start.isoformat(),
                "end": (start + timedelta(hours=2)).isoformat(),
                "reason": "benchmark", "drainLead": 7200}  # fmt: skip
        await _post(client, SCHEDULE, {"input": spec})
    return chosen, start


async def measure(url: str, rounds: int) -> dict[str, list[float]]:
    settings = Settings(database_url=url)
    engine = create_engine(url, settings)
    app = create_app(settings, engine=engine)
    times: dict[str, list[float]] = {"none": [], "windows": []}
    try:
        async with engine.connect() as conn:
            nodes = [r.id for r in await conn.execute(text("SELECT id FROM nodes ORDER BY id"))]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            chosen, _ = await book_windows(client, nodes)
            for i in range(rounds + 3):
                kinds = ("none", "windows") if i % 2 == 0 else ("windows", "none")
                for kind in kinds:
                    async with engine.begin() as conn:
                        state = "DRAINING" if kind == "windows" else "CANCELLED"
                        await conn.execute(FLIP, {"state": state})
                    replica = f"bench-maintenance-{kind}-{i}"
                    shape = {"replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": 1}
                    started = time.perf_counter()
                    placed = await _post(client, PLACE, {"input": shape})
                    took = time.perf_counter() - started
                    assert placed["place"]["__typename"] == "Allocated", placed
                    if kind == "windows":
                        assert placed["place"]["allocations"][0]["nodeId"] not in chosen
                    await _post(client, RELEASE, {"id": replica})
                    await drain_announcements(engine)
                    if i >= 3:  # warm-up rounds left out
                        times[kind].append(took * 1000)
        async with engine.begin() as conn:
            # Later sections find the cluster as loaded: no window left in force.
            await conn.execute(text("DELETE FROM maintenance_windows WHERE id LIKE 'bench-%'"))
    finally:
        await dispose(engine)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    times = asyncio.run(run(args.nodes, args.rounds, measure))
    none, windows = (statistics.median(times[k]) for k in ("none", "windows"))
    print(
        f"{args.nodes} nodes, median of {args.rounds}: place 1x H100-80GB {none:.2f} ms with no "
        f"maintenance window, {windows:.2f} ms with {WINDOWS} in force "
        f"({windows / none:.2f}x, target <= 1.1x)"
    )


if __name__ == "__main__":
    main()
