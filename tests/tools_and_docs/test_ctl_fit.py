"""`ctl fit`: the operator asks how many more replicas of a shape fit, and what stops one more."""

from __future__ import annotations

import json

import pytest

from tests.support.ctl import ctl, register
from tests.support.live_service import LiveService
from tests.support.reports import node_input
from tests.support.topology import IB_A, bridged_pairs, hgx_h100


def test_an_operator_asks_how_many_tp8_replicas_fit_before_and_after_a_drain(
    live_service: LiveService, capsys: pytest.CaptureFixture[str]
) -> None:
    for node_id in ("gpu-01", "gpu-02"):
        register(live_service, node_input(node_id, gpus=hgx_h100(near=False), fabrics=[IB_A]))
    register(live_service, node_input("gpu-03", gpus=bridged_pairs(), fabrics=[IB_A]))
    url = ("--url", live_service.url)
    shape = ("--class", "H100-80GB", "--gpus-per-shard", "8")

    code, out, _ = ctl(capsys, *url, "fit", *shape, "--nvlink-shards")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "2 more replicas of 1 shard of 8 H100-80GB fit now"
    assert any(line.split() == ["gpu-01", "1", "8"] for line in lines)
    assert any(line.split() == ["NVLINK_GROUP_TOO_SMALL", "1"] for line in lines)
    assert any(line.split() == ["NOT_ENOUGH_GPUS", "2"] for line in lines)

    code, out, _ = ctl(capsys, *url, "fit", *shape, "--nvlink-shards", "--exclude", "gpu-01")
    assert out.splitlines()[0] == (
        "1 more replica of 1 shard of 8 H100-80GB fit now after draining gpu-01"
    )

    code, out, _ = ctl(capsys, *url, "fit", *shape, "--shards", "2", "--output", "json")
    found = json.loads(out)
    assert found["replicas"] == 1  # 2 shards of 8 over the three nodes of ib-a: 3 shards
    assert sum(n["shards"] for n in found["nodes"]) == 2

    code, _, err = ctl(capsys, *url, "fit", "--class", "H100-80GB", "--gpus-per-shard", "0")
    assert code == 1
    assert "gpusPerShard=0" in err and len(err.strip().splitlines()) == 1


def test_fit_for_a_class_no_node_has_fails_naming_the_classes_there(
    live_service: LiveService, capsys: pytest.CaptureFixture[str]
) -> None:
    register(live_service, node_input("gpu-01", gpus=hgx_h100(near=False), fabrics=[IB_A]))
    url = ("--url", live_service.url)

    # H200 for H200-141GB: "0 more replicas fit" would read as a full cluster.
    code, out, err = ctl(capsys, *url, "fit", "--class", "H200", "--gpus-per-shard", "8")

    assert (code, out) == (1, "")
    assert err.strip() == (
        "llmgw-inventory ctl: --class H200: no node has H200 GPUs; classes here: H100-80GB"
    )
    # A known class that is full is an answer, not an error.
    code, out, _ = ctl(capsys, *url, "fit", "--class", "H100-80GB", "--gpus-per-shard", "16")
    assert code == 0 and out.startswith("0 more replicas of 1 shard of 16 H100-80GB fit now")
