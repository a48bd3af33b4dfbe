"""`ctl weights`: an operator sees each node's weights, their state, size and who pins them."""

from __future__ import annotations

import httpx
import pytest

from tests.support.ctl import ctl, register
from tests.support.live_service import LiveService
from tests.support.reports import GB, PLACE, node_input, placement

LLAMA = "/models/llama-70b"


def test_ctl_weights_lists_state_size_and_pins(
    live_service: LiveService, capsys: pytest.CaptureFixture[str]
) -> None:
    register(
        live_service,
        node_input(
            "gpu-01",
            weights=[
                {"path": LLAMA, "state": "READY", "sizeBytes": 140 * GB, "totalBytes": 140 * GB},
                {"path": "/models/qwen", "state": "DOWNLOADING", "sizeBytes": 41 * GB,
                 "totalBytes": 100 * GB},
            ],
        ),
    )  # fmt: skip
    register(live_service, node_input("gpu-02", weights=[{"path": "/models/old"}]))
    placed = httpx.post(
        live_service.url,
        json={"query": PLACE, "variables": placement("chat", gpusPerShard=8, weights=LLAMA)},
    ).json()
    assert placed["data"]["place"]["__typename"] == "Allocated", placed
    url = ("--url", live_service.url)

    code, out, _ = ctl(capsys, *url, "weights")
    assert code == 0
    cells = [line.split("  ") for line in out.splitlines()]
    assert [[c.strip() for c in row if c.strip()] for row in cells] == [
        ["NODE", "PATH", "STATE", "SIZE", "PINNED BY"],
        ["gpu-01", LLAMA, "ready", "140.0 GB", "chat"],
        ["gpu-01", "/models/qwen", "downloading", "41.0 GB of 100.0 GB (41%)", "-"],
        ["gpu-02", "/models/old", "unknown", "-", "-"],
    ]
    code, out, _ = ctl(capsys, *url, "weights", "--evictable", "gpu-01")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == ["PATH", "/models/qwen"]
    code, out, _ = ctl(capsys, *url, "node", "gpu-01")
    assert "chat" in out and "downloading" in out
