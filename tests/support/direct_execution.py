"""The operations both paths answer (the fast path and Strawberry's view), and how to compare their answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from service.metrics import COUNTERS
from tests.support.reports import (
    A100,
    GB,
    gpus,
    node_input,
)

OPERATIONS = Path(__file__).resolve().parents[2] / "agent" / "operations"


AGENT_HEARTBEAT = (OPERATIONS / "heartbeat.graphql").read_text()


FULL_REPORT = node_input(
    "gpu-01",
    labels=[{"key": "zone", "value": "a"}],
    memoryTotalMb=2_000_000,
    gpus=[*gpus(A100, 3), {"index": 3, "name": "NVIDIA A100-SXM4-40GB", "healthy": False,
                          "healthReasons": ["ecc_uncorrected"]}],
    fabrics=[{"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}],
    storage=[
        {"id": "dev:259:1", "mountPoint": "/data", "fsType": "xfs", "shared": False,
         "freeBytes": 500 * GB, "totalBytes": 2000 * GB, "directories": ["/data/models"]},
        {"id": "nfs:1", "mountPoint": "/mnt/models", "fsType": "nfs4", "shared": True,
         "freeBytes": 9000 * GB, "totalBytes": 10000 * GB},
    ],
    weights=[{"path": "/data/models/llama-3-70b", "sizeBytes": 140 * GB}],
    agentVersion="1.4.0",
    engineVersions=[{"key": "vllm", "value": "0.6.3"}],
)  # fmt: skip


PAGE = """
query Page($first: Int, $withGpus: Boolean!) {
  nodes(first: $first) {
    __typename id hostname mgmtAddr state stateReason schedulable knowsItsWeights
    labels { key value } engineVersions { key value } memoryTotalMb agentVersion
    localDisk { freeBytes totalBytes } sharedDisk { ...DiskFields }
    gpus @include(if: $withGpus) { index name gpuClass healthy healthReasons
      allocation { shardId replicaId gpuIndices } }
    free: freeGpus(gpuClass: "A100-40GB") { index }
    storage { id mountPoint fsType shared freeBytes totalBytes directories }
    weights { path sizeBytes } hasWeights(source: "/data/models/llama-3-70b")
    allocations { shardId nodeId gpuIndices }
  }
}
fragment DiskFields on Disk { freeBytes totalBytes }
"""


def _comparable(body: Any) -> Any:
    # A masked error's request id is the one thing that differs by design.
    if isinstance(body, dict):
        return {k: _comparable(v) for k, v in body.items() if k != "requestId"}
    if isinstance(body, list):
        return [_comparable(v) for v in body]
    return body


async def same_answer(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    body: Any,
    headers: dict[str, str] | None = None,
) -> Any:
    """Send to the direct app, then to Strawberry's; the answers must be equal."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"content-type": "application/json", **(headers or {})}
    direct, strawberry = [
        await client.post("/graphql", content=content, headers=sent) for client in both
    ]
    assert direct.status_code == strawberry.status_code, (direct.text, strawberry.text)
    assert direct.headers["content-type"] == strawberry.headers["content-type"]
    if strawberry.headers["content-type"].startswith("application/json"):
        assert _comparable(direct.json()) == _comparable(strawberry.json())
        return direct.json()
    assert direct.text == strawberry.text
    return direct.text


def route_counts() -> dict[tuple[str, str, str], int]:
    """inventory_fast_path_requests_total's counts: (route, outcome, reason) -> count."""
    return COUNTERS.snapshot()[2]


def answered(before: dict[tuple[str, str, str], int], route: str) -> int:
    """How many requests `route` answered since `before`."""
    now = route_counts()
    return sum(
        count - before.get(key, 0)
        for key, count in now.items()
        if key[0] == route and key[1] == "answered"
    )
