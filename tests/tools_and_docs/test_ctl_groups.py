"""`ctl fit --group FILE` and `ctl groups`: an operator sizes and inspects disaggregated deployments."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support.ctl import ctl, register
from tests.support.live_service import LiveService
from tests.support.reports import node_input
from tests.support.topology import IB_A, hgx_h100

GROUP = {
    "roles": [
        {
            "role": "prefill",
            "replicas": 2,
            "shape": {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": 4},
        },
        {
            "role": "decode",
            "replicas": 4,
            "shape": {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": 2},
        },
    ],
    "locality": {"level": "NODE"},
    "kvFrom": "prefill",
    "kvTo": "decode",
}
PLACE_GROUP = "mutation P($g: PlaceGroupInput!) { placeGroup(input: $g) { __typename } }"


def test_an_operator_sizes_a_group_from_a_file_then_reads_the_placed_one(
    live_service: LiveService, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for i in range(5):
        register(live_service, node_input(f"gpu-{i}", gpus=hgx_h100(near=False), fabrics=[IB_A]))
    spec = tmp_path / "pd.json"
    spec.write_text(json.dumps(GROUP))
    url = ("--url", live_service.url)

    code, out, _ = ctl(capsys, *url, "fit", "--group", str(spec))
    assert code == 0
    assert out.splitlines()[0] == "2 more groups fit now"
    assert "role prefill" in out or "role decode" in out

    code, out, _ = ctl(capsys, *url, "groups")
    assert (code, out.strip()) == (0, "no placement groups")
    placed = httpx.post(
        live_service.url,
        json={"query": PLACE_GROUP, "variables": {"g": {**GROUP, "groupId": "pd"}}},
    )
    assert placed.json()["data"]["placeGroup"]["__typename"] == "GroupPlaced"

    code, out, _ = ctl(capsys, *url, "groups")
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [r[:4] for r in rows] == [
        ["pd", "1", "prefill", "pd-prefill-0"],
        ["pd", "1", "prefill", "pd-prefill-1"],
        ["pd", "1", "decode", "pd-decode-0"],
        ["pd", "1", "decode", "pd-decode-1"],
        ["pd", "1", "decode", "pd-decode-2"],
        ["pd", "1", "decode", "pd-decode-3"],
    ]
    code, out, _ = ctl(capsys, *url, "groups", "pd")
    assert "KV paths (kvFrom -> kvTo):" in out
    assert any(
        line.split() == ["pd-prefill-0", "pd-decode-0", "SAME_NVLINK_GROUP"]
        for line in out.splitlines()
    )
    code, out, _ = ctl(capsys, *url, "fit", "--group", str(spec), "--output", "json")
    assert json.loads(out)["groups"] == 1

    code, _, err = ctl(capsys, *url, "groups", "nope")
    assert code == 1 and "no placement group 'nope'" in err
    spec.write_text("{not json")
    code, _, err = ctl(capsys, *url, "fit", "--group", str(spec))
    assert code == 1 and "not JSON" in err
    code, _, err = ctl(capsys, *url, "fit", "--shards", "2")
    assert code == 1 and "--class and --gpus-per-shard required" in err
