"""`ctl taints`, `ctl remediations` and `ctl drift` against a running service, as an operator reads them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.ctl import ctl
from tests.support.live_service import LiveService
from tests.support.reports import H100, REGISTER, gpus, node_input

LABELS = [{"key": "profile", "value": "hgx-h100"}]
SET = """
mutation S($p: HardwareProfileInput!) { setHardwareProfile(input: $p) { name } }
"""


def post(service: LiveService, query: str, variables: dict[str, Any] | None = None) -> Any:
    body = httpx.post(service.url, json={"query": query, "variables": variables or {}}).json()
    assert not body.get("errors"), body
    return body["data"]


def report(count: int = 8, xids: dict[int, list[int]] | None = None) -> dict[str, Any]:
    listed = gpus(H100, count)
    for index, numbers in (xids or {}).items():
        listed[index]["xids"] = numbers
    return {"input": node_input("hgx-1", gpus=listed, labels=LABELS, bootId="boot-a")}


def rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()[1:]]


def test_an_operator_reads_taints_remediations_and_drift(
    live_service: LiveService, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ("--url", live_service.url)
    post(live_service, REGISTER, report(xids={3: [79]}))
    post(live_service, 'mutation { cordonGpu(nodeId: "hgx-1", index: 5, reason: "fan") { index } }')

    code, out, _ = ctl(capsys, *url, "taints")
    assert code == 0
    assert out.splitlines()[0].split() == [
        "NODE", "GPU", "KEY", "EFFECT", "SOURCE", "SINCE", "REASON"
    ]  # fmt: skip
    assert [r[:5] for r in rows(out)] == [
        ["hgx-1", "3", "xid-79", "NO_SCHEDULE", "XID"],
        ["hgx-1", "5", "cordon", "NO_SCHEDULE", "OPERATOR"],
    ]
    code, out, _ = ctl(capsys, *url, "taints", "--output", "json")
    assert [(t["gpu"], t["key"]) for t in json.loads(out)] == [(3, "xid-79"), (5, "cordon")]

    code, out, _ = ctl(capsys, *url, "remediations")
    [line] = rows(out)
    assert line[1:6] == ["hgx-1", "3", "REBOOT_NODE", "PENDING", "-"]
    assert " ".join(line[8:]).startswith("xid 79: the GPU has fallen off the bus")
    code, out, _ = ctl(capsys, *url, "remediations", "--state", "DONE")
    assert (code, out.strip()) == (0, "no remediations")

    code, out, _ = ctl(capsys, *url, "drift")
    assert out.strip() == "no drift: every node matches its hardware profile (or has none)"
    post(live_service, SET, {"p": {"name": "hgx-h100", "selector": LABELS[0], "gpuCount": 8}})
    post(live_service, REGISTER, report(count=7))
    code, out, _ = ctl(capsys, *url, "drift")
    assert [r[:7] for r in rows(out)] == [
        ["hgx-1", "GPU_MISSING", "node", "8", "GPUs", "7", "GPUs"]
    ]
    code, out, _ = ctl(capsys, *url, "taints", "--node", "hgx-1")
    assert ["hgx-1", "node", "drift-gpu-missing", "NO_SCHEDULE", "DRIFT"] in [
        r[:5] for r in rows(out)
    ]
