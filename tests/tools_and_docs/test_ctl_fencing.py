"""`ctl nodes` shows each node's incarnation; `ctl allocations --stale` lists the shards held for a LOST node."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.ctl import ctl, register
from tests.support.fencing import BEAT, lose
from tests.support.live_service import LiveService
from tests.support.reports import ALLOCATE, allocation, node_input, shard


def call(service: LiveService, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = httpx.post(
        service.url, json={"query": query, "variables": variables}
    ).json()
    assert not body.get("errors"), body
    return body


async def test_an_operator_sees_incarnations_and_held_shards(
    live_service: LiveService, engine: AsyncEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    register(live_service, node_input("gpu-01"))
    call(live_service, ALLOCATE, allocation("r", shard("r/a", "gpu-01", 0, 1)))
    url = ("--url", live_service.url)

    code, out, _ = ctl(capsys, *url, "nodes")
    header, row = out.splitlines()[:2]
    column = header.index("INCARNATION")
    assert row[column:].split()[0] == "1"
    code, out, _ = ctl(capsys, *url, "allocations", "--stale")
    assert (code, out.strip()) == (0, "no stale allocations")

    await lose(engine, "gpu-01", policy="hold")
    code, out, _ = ctl(capsys, *url, "allocations", "--stale")
    header, row = out.splitlines()[:2]
    assert header.split()[-1] == "STALE"
    assert row.split()[:4] == ["r/a", "r", "gpu-01", "0,1"]
    assert "held for the lost node since" in row

    # The node comes back running nothing: the held replica is freed, the
    # node is in its second life.
    call(live_service, BEAT, {"id": "gpu-01", "incarnation": 1, "running": []})
    code, out, _ = ctl(capsys, *url, "allocations", "--stale")
    assert out.strip() == "no stale allocations"
    code, out, _ = ctl(capsys, *url, "nodes")
    assert out.splitlines()[1][column:].split()[0] == "2"
    code, out, _ = ctl(capsys, *url, "node", "gpu-01")
    assert "incarnation: 2" in out
