"""`ctl tenants` and `ctl budgets`: an operator reads who holds how much against its quota."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from service.ctl.tenancy import usage_bar
from tests.support.ctl import ctl, register
from tests.support.live_service import LiveService
from tests.support.reports import node_input
from tests.support.tenancy import PLACE, SET_BUDGET, SET_TENANT


def call(service: LiveService, query: str, variables: dict[str, Any]) -> Any:
    body = httpx.post(service.url, json={"query": query, "variables": variables}).json()
    assert not body.get("errors"), body
    return body["data"]


def test_usage_bars_show_the_guarantee_the_borrowed_and_the_room() -> None:
    # 24 wide: a limit of 24 is a cell per GPU.
    assert usage_bar(20, 16, 24, 4) == "[################++++....] 20/24, 16 guaranteed"
    assert usage_bar(0, 0, 8, 8) == "[........................] 0/8, 0 guaranteed"
    # No limit: as wide as what it holds plus what it could get now.
    assert usage_bar(6, 0, None, 18) == "[++++++..................] 6 (no limit), 0 guaranteed"
    # Above a limit lowered below use: the excess is marked.
    assert usage_bar(24, 16, 16, 0).startswith("[################!!!!!!!!]")


def test_an_operator_reads_tenants_and_budgets(
    live_service: LiveService, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(3):
        register(live_service, node_input(f"hgx-{i}"))
    quotas = [{"gpuClass": "H100-80GB", "guaranteed": 16, "limit": 24}]
    call(live_service, SET_TENANT, {"input": {"id": "prod", "quotas": quotas}})
    for i in range(5):
        shape = {"replicaId": f"chat-{i}", "gpuClass": "H100-80GB", "gpusPerShard": 4,
                 "tenant": "prod", "deployment": "chat"}  # fmt: skip
        assert call(live_service, PLACE, {"input": shape})["place"]["__typename"] == "Allocated"
    call(live_service, SET_BUDGET, {"input": {"deployment": "chat", "tenant": "prod",
                                              "minAvailable": 6}})  # fmt: skip
    url = ("--url", live_service.url)

    code, out, _ = ctl(capsys, *url, "tenants")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["TENANT", "CLASS", "USED", "BORROWED", "LIMIT", "AVAILABLE", "USE"]
    prod = next(line for line in lines if line.startswith("prod"))
    assert prod.split()[:6] == ["prod", "H100-80GB", "20", "4", "24", "4"]
    assert "[################++++....] 20/24, 16 guaranteed" in prod
    default = next(line for line in lines if line.startswith("default"))
    assert "holds nothing" in default

    code, out, _ = ctl(capsys, *url, "tenants", "prod", "--output", "json")
    assert code == 0 and json.loads(out)["usage"][0]["used"] == 20
    code, _, err = ctl(capsys, *url, "tenants", "nobody")
    assert code == 1 and "no tenant 'nobody'" in err

    code, out, _ = ctl(capsys, *url, "budgets")
    assert code == 0
    assert out.splitlines()[1].split() == ["prod", "chat", "6", "5", "below", "its", "minimum"]
