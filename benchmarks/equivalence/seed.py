"""The cluster both apps answer about: small, but with one of everything a rule looks at.

Nodes of four GPU classes on two fabrics; unhealthy GPUs; a cordoned, a
draining, an unreachable and a lost node; taints of each effect on GPUs and
on a node; XIDs with remediations in three states, and drift; a node that knows no disk and no
weights; local and shared disk; weights; allocations made by `allocate` and
by `place`; events; tokens of every role, one revoked. Registered through
the GraphQL API as agents and schedulers do, so the rows are the ones the
service writes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import tokens
from service.database.transactions import in_transaction
from service.fleet.liveness import sweep

GB = 10**9
H100 = {"name": "NVIDIA H100 80GB HBM3", "memoryMb": 81559}
H200 = {"name": "NVIDIA H200", "memoryMb": 143771}
A100 = {"name": "NVIDIA A100-SXM4-40GB", "memoryMb": 40960}
L40S = {"name": "NVIDIA L40S", "memoryMb": 46068}
WEIGHTS = "/data/models/llama-3-70b"


@dataclass(frozen=True)
class Vocabulary:
    """Values a generated argument draws from, besides random text."""

    ids: tuple[str, ...]
    strings: tuple[str, ...]


VOCABULARY = Vocabulary(
    ids=(
        "gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05", "gpu-06", "gpu-07", "gpu-99",
        "r-1", "r-1-s0", "r-1-s1", "r-2", "r-2-s0", "r-3", "r-3-s0", "1", "3", "",
    ),
    strings=(
        "H100-80GB", "H200-141GB", "A100-40GB", "L40S-45GB", "ib-a", "ib-b", "mlx5_0",
        WEIGHTS, "/data", "zone", "a", "b", "kernel upgrade", "registered", "allocated",
        "released", "cordoned", "NVIDIA H100 80GB HBM3", "xid-79", "dedicated", "infer",
        "burn-in", "",
    ),
)  # fmt: skip


def _gpus(model: dict[str, Any], count: int, unhealthy: tuple[int, ...] = ()) -> list[Any]:
    return [
        {
            "index": i,
            "uuid": f"GPU-{model['memoryMb']}-{i:02d}",
            "pciBusId": f"00000000:{0x18 + i:02x}:00.0",
            "healthy": i not in unhealthy,
            **({"healthReasons": ["ecc_uncorrected"]} if i in unhealthy else {}),
            **model,
        }
        for i in range(count)
    ]


def _node(node_id: str, gpus: list[Any], **fields: Any) -> dict[str, Any]:
    return {"id": node_id, "hostname": f"{node_id}.cluster.local", "mgmtAddr": "10.0.0.7",
            "gpus": gpus, **fields}  # fmt: skip


def _disk(free_gb: int, shared: bool = False) -> list[dict[str, Any]]:
    local = {"id": "dev:259:1", "mountPoint": "/data", "fsType": "xfs", "shared": False,
             "freeBytes": free_gb * GB, "totalBytes": 2000 * GB, "directories": ["/data/models"]}  # fmt: skip
    nfs = {"id": "nfs:1", "mountPoint": "/mnt/models", "fsType": "nfs4", "shared": True,
           "freeBytes": 9000 * GB, "totalBytes": 10000 * GB, "directories": []}  # fmt: skip
    return [local, nfs] if shared else [local]


def _fabric(name: str, hcas: int = 2) -> list[dict[str, Any]]:
    return [{"fabric": name, "hcas": [f"mlx5_{i}" for i in range(hcas)], "rateGbps": 400}]


def _linked(gpus: list[Any], groups: list[list[int]]) -> list[Any]:
    """The GPUs with their NVLink peers: the other members of their group ([] alone)."""
    for gpu in gpus:
        group = next((g for g in groups if gpu["index"] in g), [gpu["index"]])
        gpu["nvlinkPeers"] = [i for i in group if i != gpu["index"]]
    return gpus


# Topologies of each kind (Node.nvlinkGroups): one NVSwitch board (gpu-01),
# bridged pairs (gpu-02), none (gpu-04, L40S), a board and pairs (gpu-05);
# the others unknown.
NODES = (
    _node("gpu-01", _linked(_gpus(H100, 8), [list(range(8))]), fabrics=_fabric("ib-a", 4),
          storage=_disk(500, shared=True),
          weights=[{"path": WEIGHTS, "sizeBytes": 140 * GB}], labels=[{"key": "zone", "value": "a"}],
          memoryTotalMb=2_000_000, agentVersion="1.4.0",
          engineVersions=[{"key": "vllm", "value": "0.6.3"}]),
    _node("gpu-02", _linked(_gpus(H100, 8, unhealthy=(3, 6)), [[0, 1], [2, 3], [4, 5], [6, 7]]),
          fabrics=_fabric("ib-a"),
          storage=_disk(20), weights=[{"path": "/data/models/other"}],
          labels=[{"key": "zone", "value": "b"}]),
    _node("gpu-03", _gpus(A100, 4), fabrics=_fabric("ib-b"), storage=_disk(900)),
    _node("gpu-04", _linked(_gpus(L40S, 4, unhealthy=(0,)), []), storage=_disk(100, shared=True)),
    _node("gpu-05", _linked(_gpus(H200, 8), [[0, 1, 2, 3], [4, 5], [6, 7]]),
          fabrics=_fabric("ib-a") + _fabric("ib-b")),
    _node("gpu-06", _gpus(H100, 2)),
    _node("gpu-07", _gpus(A100, 2), fabrics=_fabric("ib-b"),
          labels=[{"key": "profile", "value": "a100-4"}]),
)  # fmt: skip

REGISTER = "mutation($input: NodeInput!) { registerNode(input: $input) { id } }"
CORDON = "mutation($id: ID!, $r: String!) { cordonNode(id: $id, reason: $r) { id } }"
DRAIN = "mutation($id: ID!, $r: String!) { drainNode(id: $id, reason: $r) { id } }"
ALLOCATE = "mutation($input: AllocateInput!) { allocate(input: $input) { __typename } }"
PLACE = "mutation($input: PlaceInput!) { place(input: $input) { __typename } }"
TAINT_GPUS = (
    "mutation($node: ID!, $indices: [Int!]!, $taint: TaintInput!)"
    " { taintGpus(nodeId: $node, indices: $indices, taint: $taint) { index } }"
)
TAINT_NODE = (
    "mutation($node: ID!, $taint: TaintInput!) { taintNode(nodeId: $node, taint: $taint) { id } }"
)
# Taints of each effect, on GPUs and on a node, with keys in the vocabulary:
# generated tolerations match some of them (issue 38).
TAINTS = (
    (TAINT_GPUS, {"node": "gpu-01", "indices": [7],
                  "taint": {"key": "xid-79", "effect": "NO_SCHEDULE", "reason": "fell off the bus"}}),
    (TAINT_GPUS, {"node": "gpu-02", "indices": [4, 5],
                  "taint": {"key": "burn-in", "effect": "PREFER_NO_SCHEDULE", "reason": "new"}}),
    (TAINT_NODE, {"node": "gpu-06",
                  "taint": {"key": "dedicated", "value": "infer", "effect": "NO_EXECUTE",
                            "reason": "inference only"}}),
)  # fmt: skip


def _faults(boot: str, faults: dict[int, dict[str, Any]]) -> dict[str, Any]:
    gpu_05 = NODES[4]
    listed = [{**g, **faults.get(g["index"], {})} for g in gpu_05["gpus"]]
    return {"input": {**gpu_05, "gpus": listed, "bootId": boot}}


PROFILE = "mutation($p: HardwareProfileInput!) { setHardwareProfile(input: $p) { name } }"
START = "mutation($id: ID!) { startRemediation(id: $id) { id } }"
# Fleet health (issue 38), on nodes no place the tests count can use: on gpu-05
# (UNREACHABLE) XIDs 79 and 95 carried out by a reboot (AWAITING_VALIDATION),
# then XID 48 (PENDING) and XID 64 (started: IN_PROGRESS), the driver asking
# GPU 0 for a reset; gpu-07 (LOST) short of its profile's four GPUs
# (GPU_MISSING, a remediation of its own), set once its shard is allocated.
HEALTH = (
    (REGISTER, _faults("boot-a", {6: {"xids": [79]}, 7: {"xids": [95]}})),
    (REGISTER, _faults("boot-b", {})),
    (REGISTER, _faults("boot-b", {5: {"xids": [48]}, 4: {"xids": [64]},
                                  0: {"recoveryAction": "GPU_RESET"}})),
)  # fmt: skip

# (role, bound node, description, revoked)
TOKENS = (
    ("operator", None, "ops console", False),
    ("scheduler", None, "scheduler-a", False),
    ("reader", None, "dashboard", False),
    ("agent", "gpu-01", "agent gpu-01", False),
    ("reader", None, "old dashboard", True),
)

Send = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


async def create_tokens(engine: AsyncEngine) -> dict[str, str]:
    """Tokens of every role; returns each live role's secret."""
    secrets: dict[str, str] = {}
    async with engine.begin() as conn:
        for role, node_id, description, revoked in TOKENS:
            created = await tokens.create_token(conn, role, node_id, description=description)
            if revoked:
                await tokens.revoke_token(conn, created.token.id)
            else:
                secrets[role] = created.secret
    return secrets


async def seed(engine: AsyncEngine, send: Send) -> None:
    """Fill an empty inventory through `send` (an operator's GraphQL requests)."""

    async def ok(query: str, variables: dict[str, Any]) -> None:
        body = await send(query, variables)
        assert not body.get("errors"), body

    for node in NODES:
        await ok(REGISTER, {"input": node})
    for query, variables in TAINTS:
        await ok(query, variables)
    for query, variables in HEALTH:
        await ok(query, variables)
    listed = await send("{ remediations(state: PENDING) { id gpuIndices } }", {})
    [started] = [r["id"] for r in listed["data"]["remediations"] if r["gpuIndices"] == [4]]
    await ok(START, {"id": started})
    await ok(CORDON, {"id": "gpu-03", "r": "kernel upgrade"})
    await ok(DRAIN, {"id": "gpu-04", "r": "RMA of GPU 0"})
    shards = [
        {"shardId": "r-1-s0", "nodeId": "gpu-01", "gpuIndices": [0, 1]},
        {"shardId": "r-1-s1", "nodeId": "gpu-02", "gpuIndices": [0]},
    ]
    await ok(ALLOCATE, {"input": {"replicaId": "r-1", "shards": shards}})
    await ok(ALLOCATE, {"input": {"replicaId": "r-3", "shards": [
        {"shardId": "r-3-s0", "nodeId": "gpu-07", "gpuIndices": [1]}]}})  # fmt: skip
    await ok(PLACE, {"input": {"replicaId": "r-2", "gpuClass": "H100-80GB", "gpusPerShard": 2}})
    await ok(PROFILE, {"p": {"name": "a100-4", "selector": {"key": "profile", "value": "a100-4"},
                             "gpuCount": 4}})  # fmt: skip
    # gpu-05 silent for a minute (UNREACHABLE), gpu-07 for an hour (LOST, its replica released).
    async with engine.begin() as conn:
        # Timestamps of every shape the DateTime scalar writes: whole seconds (no
        # fraction), a fraction ending in zeros, one microsecond; the others as now() left them.
        await conn.execute(
            text(
                "UPDATE nodes SET registered_at = CASE id"
                " WHEN 'gpu-01' THEN date_trunc('second', registered_at)"
                " WHEN 'gpu-02' THEN timestamptz '2026-01-02 03:04:05.12+01'"
                " ELSE timestamptz '2026-01-02 03:04:05.000001-03:30' END,"
                " last_seen = date_trunc('second', last_seen)"
                " WHERE id IN ('gpu-01', 'gpu-02', 'gpu-03')"
            )
        )
        await conn.execute(
            text(
                "UPDATE nodes SET last_seen = now() - make_interval(secs => "
                "CASE id WHEN 'gpu-05' THEN 60 ELSE 3600 END) WHERE id IN ('gpu-05', 'gpu-07')"
            )
        )

    async def swept(conn: Any) -> None:
        await sweep(conn, 30.0, 300.0)

    await in_transaction(engine, swept)
