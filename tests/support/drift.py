"""Drift stories' pieces: an HGX node's report, its profile, what its drift findings read."""

from __future__ import annotations

from typing import Any

from tests.support.api import Api
from tests.support.reports import H100, gpus, node_input

SET = """
mutation S($p: HardwareProfileInput!) {
  setHardwareProfile(input: $p) { name selector { key value } gpuCount hcaRateGbps }
}
"""


NODE = """
query N($id: ID!) {
  node(id: $id) {
    drift { kind expected observed gpuIndices since }
    taints { key effect source reason }
    gpus { index taints { key effect source } }
  }
}
"""


EVENTS = "query E($k: [String!]) { events(kinds: $k) { kind nodeId reason detail } }"


HGX = {"key": "profile", "value": "hgx-h100"}


LABELS = [{"key": "profile", "value": "hgx-h100"}]


# Two rails: mlx5_0 near GPUs 0-3, mlx5_1 near GPUs 4-7.
RAILS = [{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400},
         {"fabric": "ib-b", "hcas": ["mlx5_1"], "rateGbps": 400}]  # fmt: skip


def hgx(count: int = 8, rate_b: int = 400, **more: Any) -> dict[str, Any]:
    listed = [
        {**g, "nearHcas": ["mlx5_0" if g["index"] < 4 else "mlx5_1"]} for g in gpus(H100, count)
    ]
    fabrics = [RAILS[0], {**RAILS[1], "rateGbps": rate_b}]
    return {"input": node_input("hgx-1", gpus=listed, labels=LABELS, fabrics=fabrics, **more)}


async def node(api: Api) -> dict[str, Any]:
    found: dict[str, Any] = (await api(NODE, {"id": "hgx-1"}))["node"]
    return found
