"""weights_lifecycle's rules say the same in SQL and in Python, on every state a row can hold."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.scheduling.weights_lifecycle import is_ready, rank, weights_rank, weights_ready
from tests.support.api import Api
from tests.support.reports import REGISTER, node_input

STATES = [None, "DOWNLOADING", "READY", "EVICTING", "FAILED"]


async def test_python_rules_agree_with_the_sql(api: Api, engine: AsyncEngine) -> None:
    entries = []
    for i, state in enumerate(STATES):
        entry = {"path": f"/models/m{i}"}
        if state is not None:
            entry["state"] = state
        entries.append(entry)
    await api(REGISTER, {"input": node_input("gpu-01", weights=entries)})
    async with engine.connect() as conn:
        rows = list(
            await conn.execute(
                text(
                    f"SELECT p.path, w.state, w.path IS NOT NULL AS present,"
                    f" {weights_rank('w')} AS rank, coalesce({weights_ready('w')}, false) AS ready"
                    " FROM unnest(CAST(:paths AS text[])) AS p(path)"
                    " LEFT JOIN weights w ON w.node_id = 'gpu-01' AND w.path = p.path"
                ),
                {"paths": [e["path"] for e in entries] + ["/models/absent"]},
            )
        )
    assert len(rows) == len(STATES) + 1
    for r in rows:
        assert r.rank == rank(r.present, r.state), r
        assert r.ready == is_ready(r.state), r
    assert sorted(r.rank for r in rows) == [0, 1, 2, 3, 3, 3]
