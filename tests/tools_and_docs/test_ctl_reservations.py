"""`ctl reservations`: an operator reads the reservations and ends one."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.ctl import ctl, register
from tests.support.live_service import LiveService
from tests.support.reports import node_input
from tests.support.reservations import RESERVE, iso, shape, soon
from tests.support.tenancy import SET_TENANT


def call(service: LiveService, query: str, variables: dict[str, Any]) -> Any:
    body = httpx.post(service.url, json={"query": query, "variables": variables}).json()
    assert not body.get("errors"), body
    return body["data"]


def test_an_operator_lists_reservations_and_releases_one(
    live_service: LiveService, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(2):
        register(live_service, node_input(f"hgx-{i}"))
    call(live_service, SET_TENANT, {"input": {"id": "rollout", "quotas": []}})
    start, end = iso(soon(600)), iso(soon(1200))
    spec = {"id": "v2", "tenant": "rollout", "shape": shape(), "count": 1, "start": start,
            "end": end, "reason": "v2 rollout"}  # fmt: skip
    assert call(live_service, RESERVE, {"input": spec})["reserve"]["__typename"] == "Reservation"
    url = ("--url", live_service.url)

    code, out, _ = ctl(capsys, *url, "reservations")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "ID", "TENANT", "STATE", "START", "END", "GPUS", "USED", "MISSING", "REASON"
    ]  # fmt: skip
    assert lines[1].split()[:3] == ["v2", "rollout", "SCHEDULED"]
    assert lines[1].split()[5:9] == ["8", "0/1", "0", "v2"]

    code, out, _ = ctl(capsys, *url, "reservations", "--state", "active")
    assert code == 0 and out.strip() == "no reservations"

    code, out, _ = ctl(capsys, *url, "reservations", "--release", "v2", "--output", "json")
    assert code == 0
    (ended,) = json.loads(out)
    assert (ended["state"], ended["gpus"]) == ("ENDED", [])
