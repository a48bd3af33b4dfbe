"""`llmgw-inventory demo`: the cluster a new user's walkthrough runs on, registered through the API."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from service.cli import main
from service.ctl.client import Client
from service.demo_cluster import NODES, keep_alive

NODES_QUERY = """
{ nodes { id state stateReason nvlinkGroups
          fabrics { fabric hcas rateGbps }
          weights { path state sizeBytes totalBytes }
          gpus { index gpuClass healthy stickyReasons nearHcas } } }
"""


def query(url: str, document: str) -> dict[str, Any]:
    body = httpx.post(url, json={"query": document}, timeout=10).json()
    assert not body.get("errors"), body
    data: dict[str, Any] = body["data"]
    return data


def test_demo_once_registers_the_cluster_the_walkthrough_needs(
    live_service: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--once", "--url", live_service.url]) == 0
    # Run twice, as a user who re-runs it would: the same cluster, cordon and XID kept.
    assert main(["demo", "--once", "--url", live_service.url]) == 0
    out = capsys.readouterr().out
    assert "hgx-03   ready     8x H100 80GB HBM3         ib-b           GPU 5: XID 79" in out
    assert "turn UNREACHABLE after" in out  # --once says what it does not do

    nodes = {n["id"]: n for n in query(live_service.url, NODES_QUERY)["nodes"]}
    assert sorted(nodes) == ["hgx-01", "hgx-02", "hgx-03", "hgx-04", "l40s-01"]
    assert {i: n["state"] for i, n in nodes.items()} == {
        "hgx-01": "READY",
        "hgx-02": "READY",
        "hgx-03": "READY",
        "hgx-04": "CORDONED",
        "l40s-01": "READY",
    }
    assert nodes["hgx-04"]["stateReason"] == "PSU swap"
    # Two fabrics with one rail adapter per GPU, near it; the L40S node has none.
    assert [(i, [f["fabric"] for f in n["fabrics"]]) for i, n in nodes.items()] == [
        ("hgx-01", ["ib-a"]),
        ("hgx-02", ["ib-a"]),
        ("hgx-03", ["ib-b"]),
        ("hgx-04", ["ib-b"]),
        ("l40s-01", []),
    ]
    assert nodes["hgx-01"]["fabrics"][0]["hcas"] == [f"mlx5_{i}" for i in range(8)]
    assert [g["nearHcas"] for g in nodes["hgx-01"]["gpus"]] == [[f"mlx5_{i}"] for i in range(8)]
    assert (nodes["hgx-01"]["nvlinkGroups"], nodes["l40s-01"]["nvlinkGroups"]) == (
        "NVLink 8",
        "none",
    )
    assert {g["gpuClass"] for g in nodes["l40s-01"]["gpus"]} == {"L40S-48GB"}
    # The XID's reason is sticky: the GPU is unhealthy until a reset.
    marked = [(g["index"], g["stickyReasons"]) for g in nodes["hgx-03"]["gpus"] if not g["healthy"]]
    assert marked == [(5, ["xid_79"])]
    # The 70B model is READY on both ib-a nodes and still downloading on hgx-03.
    copies = {
        i: (w["state"], w["sizeBytes"], w["totalBytes"])
        for i, n in nodes.items()
        for w in n["weights"]
        if w["path"] == "/models/llama-3-70b"
    }
    assert copies == {
        "hgx-01": ("READY", 141_000_000_000, 141_000_000_000),
        "hgx-02": ("READY", 141_000_000_000, 141_000_000_000),
        "hgx-03": ("DOWNLOADING", 58_000_000_000, 141_000_000_000),
    }


def test_the_demo_keeps_its_nodes_alive_and_brings_back_a_removed_one(live_service: Any) -> None:
    assert main(["demo", "--once", "--url", live_service.url]) == 0
    query(live_service.url, 'mutation { removeNode(id: "hgx-02") }')
    said: list[str] = []
    beats = 0

    def sleep(seconds: float) -> None:
        nonlocal beats
        assert seconds == 7.0
        beats += 1
        if beats == 3:
            raise KeyboardInterrupt

    client = Client(live_service.url)
    with pytest.raises(KeyboardInterrupt):
        keep_alive(client, 7.0, sleep=sleep, say=said.append)
    client.close()
    # The first beat found hgx-02 gone, said so once; the next registered it again.
    assert len(said) == 2, said
    assert "hgx-02" in said[0] and "registering again" in said[0]
    assert said[1].endswith("every node registered")
    ids = [n["id"] for n in query(live_service.url, "{ nodes { id } }")["nodes"]]
    assert ids == [node.id for node in NODES]


def test_demo_against_no_service_is_one_line_and_status_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--once", "--url", "http://127.0.0.1:9/graphql", "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("llmgw-inventory demo: cannot reach the service at http://127.0.0.1:9")
    assert len(err.splitlines()) == 1


def test_a_bad_interval_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--interval", "0"])
    assert exited.value.code == 2
    assert "--interval: '0' is not a positive number of seconds" in capsys.readouterr().err
