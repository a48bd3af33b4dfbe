"""An agent registers its node; the service keeps the report whole and the operator's decisions."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.reports import GB, H100, H200, REGISTER, TB, gpus, node_input

NODE = """
query Node($id: ID!) {
  node(id: $id) {
    id hostname mgmtAddr memoryTotalMb state stateReason schedulable lastSeen
    agentVersion labels { key value } engineVersions { key value }
    gpus { index uuid pciBusId name gpuClass memoryMb healthy healthReasons allocation { shardId } }
    fabrics { fabric hcas rateGbps }
    storage { id mountPoint fsType shared freeBytes totalBytes directories }
    localDisk { freeBytes totalBytes }
    sharedDisk { freeBytes totalBytes }
    weights { path sizeBytes }
    knowsItsWeights
  }
}
"""


async def node(api: Api, node_id: str) -> dict[str, Any]:
    data = await api(NODE, {"id": node_id})
    found: dict[str, Any] = data["node"]
    return found


async def test_a_registered_node_reads_back_as_reported(api: Api) -> None:
    report_gpus = gpus(H100, 8)
    report_gpus[0] = {**report_gpus[0], "pciBusId": "00000000:18:00.0"}
    report = node_input(
        "gpu-07",
        gpus=report_gpus,
        memoryTotalMb=2_063_000,
        labels=[{"key": "zone", "value": "z1"}, {"key": "rack", "value": "r4"}],
        fabrics=[{"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}],
        storage=[
            {"id": "dev:259:1", "mountPoint": "/data", "fsType": "xfs", "shared": False,
             "freeBytes": 2 * TB, "totalBytes": 3 * TB, "directories": ["/data/models"]},
        ],
        weights=[{"path": "/data/models/llama-70b", "sizeBytes": 140 * GB}],
        agentVersion="0.1.0",
        engineVersions=[{"key": "vllm", "value": "0.11.0"}],
    )  # fmt: skip
    await api(REGISTER, {"input": report})

    got = await node(api, "gpu-07")
    assert got["state"] == "READY" and got["schedulable"] is True
    assert got["memoryTotalMb"] == 2_063_000
    assert got["labels"] == [{"key": "rack", "value": "r4"}, {"key": "zone", "value": "z1"}]
    assert [g["gpuClass"] for g in got["gpus"]] == ["H100-80GB"] * 8
    assert [g["index"] for g in got["gpus"]] == list(range(8))
    assert [g["pciBusId"] for g in got["gpus"][:2]] == ["00000000:18:00.0", None]
    assert got["fabrics"] == [{"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}]
    assert got["localDisk"] == {"freeBytes": 2 * TB, "totalBytes": 3 * TB}
    assert got["sharedDisk"] is None
    assert got["weights"] == [{"path": "/data/models/llama-70b", "sizeBytes": 140 * GB}]
    assert got["knowsItsWeights"] is True
    assert got["engineVersions"] == [{"key": "vllm", "value": "0.11.0"}]
    assert got["lastSeen"].endswith("+00:00")


async def test_a_cordon_and_its_reason_survive_re_registration(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    await api('mutation { cordonNode(id: "gpu-07", reason: "kernel upgrade") { id } }')

    await api(REGISTER, {"input": node_input("gpu-07", gpus=gpus(H200, 8))})

    got = await node(api, "gpu-07")
    assert got["state"] == "CORDONED"
    assert got["stateReason"] == "kernel upgrade"
    assert got["schedulable"] is False
    assert {g["gpuClass"] for g in got["gpus"]} == {"H200-141GB"}


async def test_a_drain_survives_re_registration(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    await api('mutation { drainNode(id: "gpu-07", reason: "moving racks") { id } }')
    await api(REGISTER, {"input": node_input("gpu-07")})
    got = await node(api, "gpu-07")
    assert (got["state"], got["stateReason"]) == ("DRAINING", "moving racks")


async def test_re_registration_replaces_the_hardware_report(api: Api) -> None:
    await api(
        REGISTER,
        {
            "input": node_input(
                "gpu-07",
                fabrics=[{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}],
                weights=[{"path": "/data/models/a"}],
            )
        },
    )
    await api(
        REGISTER,
        {
            "input": node_input(
                "gpu-07",
                gpus=gpus(H100, 4),
                fabrics=[{"fabric": "ib-b", "hcas": ["mlx5_2"], "rateGbps": 200}],
            )
        },
    )
    got = await node(api, "gpu-07")
    assert [g["index"] for g in got["gpus"]] == [0, 1, 2, 3]
    assert [f["fabric"] for f in got["fabrics"]] == ["ib-b"]
    assert got["weights"] == [] and got["knowsItsWeights"] is False


async def test_gpu_class_given_by_the_agent_overrides_the_derived_one(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-07", gpus=gpus(H100, 1, gpuClass="H100-SXM"))})
    got = await node(api, "gpu-07")
    assert got["gpus"][0]["gpuClass"] == "H100-SXM"


async def test_unknown_memory_is_null_not_zero(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    assert (await node(api, "gpu-07"))["memoryTotalMb"] is None


async def test_local_disk_leaves_shared_filesystems_out(api: Api) -> None:
    storage = [
        {"id": "dev:8:1", "mountPoint": "/", "fsType": "ext4", "shared": False,
         "freeBytes": 20 * GB, "totalBytes": 100 * GB},
        {"id": "dev:259:1", "mountPoint": "/data", "fsType": "xfs", "shared": False,
         "freeBytes": 1 * TB, "totalBytes": 2 * TB,
         "directories": ["/data/models", "/data/cache"]},
        {"id": "nfs:filer1:/models", "mountPoint": "/mnt/filer", "fsType": "nfs4", "shared": True,
         "freeBytes": 50 * TB, "totalBytes": 100 * TB, "directories": ["/mnt/filer/models"]},
    ]  # fmt: skip
    await api(REGISTER, {"input": node_input("gpu-07", storage=storage)})
    got = await node(api, "gpu-07")
    assert got["localDisk"] == {"freeBytes": 20 * GB + 1 * TB, "totalBytes": 100 * GB + 2 * TB}
    assert got["sharedDisk"] == {"freeBytes": 50 * TB, "totalBytes": 100 * TB}
    data_fs = next(fs for fs in got["storage"] if fs["id"] == "dev:259:1")
    assert data_fs["directories"] == ["/data/cache", "/data/models"]


async def test_a_node_whose_weights_are_all_on_a_filer_has_no_local_disk(api: Api) -> None:
    storage = [
        {"id": "lustre:fs1", "mountPoint": "/lustre", "fsType": "lustre", "shared": True,
         "freeBytes": 5 * TB, "totalBytes": 10 * TB},
    ]  # fmt: skip
    await api(REGISTER, {"input": node_input("gpu-07", storage=storage)})
    got = await node(api, "gpu-07")
    assert got["localDisk"] is None
    assert got["sharedDisk"] == {"freeBytes": 5 * TB, "totalBytes": 10 * TB}


async def test_nothing_reported_about_disk_reads_as_unknown(api: Api) -> None:
    await api(REGISTER, {"input": node_input("old-agent")})
    await api(REGISTER, {"input": node_input("no-dirs", storage=[])})
    for node_id in ("old-agent", "no-dirs"):
        got = await node(api, node_id)
        assert got["localDisk"] is None and got["sharedDisk"] is None and got["storage"] == []


async def test_hcas_for_gives_only_that_fabrics_adapters(api: Api) -> None:
    fabrics = [
        {"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400},
        {"fabric": "ib-b", "hcas": ["mlx5_2"], "rateGbps": 200},
    ]
    await api(REGISTER, {"input": node_input("gpu-07", fabrics=fabrics)})
    data = await api(
        'query { node(id: "gpu-07") { a: hcasFor(fabric: "ib-a") b: hcasFor(fabric: "ib-b")'
        ' none: hcasFor(fabric: "ib-z") } }'
    )
    assert data["node"] == {"a": ["mlx5_0", "mlx5_1"], "b": ["mlx5_2"], "none": []}


async def test_has_weights_is_an_exact_path_match(api: Api) -> None:
    weights = [{"path": "/data/models/llama-70b"}]
    await api(REGISTER, {"input": node_input("gpu-07", weights=weights)})
    data = await api(
        'query { node(id: "gpu-07") { exact: hasWeights(source: "/data/models/llama-70b")'
        ' prefix: hasWeights(source: "/data/models/llama")'
        ' modelId: hasWeights(source: "meta-llama/Llama-3-70B") } }'
    )
    assert data["node"] == {"exact": True, "prefix": False, "modelId": False}


async def test_unhealthy_gpus_keep_their_reasons(api: Api) -> None:
    report_gpus = gpus(H100, 2)
    report_gpus[1] = {**report_gpus[1], "healthy": False, "healthReasons": ["ecc_uncorrected"]}
    await api(REGISTER, {"input": node_input("gpu-07", gpus=report_gpus)})
    got = await node(api, "gpu-07")
    assert [(g["healthy"], g["healthReasons"]) for g in got["gpus"]] == [
        (True, []),
        (False, ["ecc_uncorrected"]),
    ]


async def test_a_changed_report_rewrites_only_the_rows_that_changed(
    api: Api, engine: AsyncEngine
) -> None:
    # Rewriting identical rows leaves dead tuples that slow every scheduler
    # scan until vacuum: a report with one GPU gone bad must touch that row only.
    storage = [
        {"id": "d", "mountPoint": "/data", "shared": False, "freeBytes": TB, "totalBytes": 2 * TB}
    ]
    fabrics = [{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}]
    await api(REGISTER, {"input": node_input("gpu-07", storage=storage, fabrics=fabrics)})
    before = await row_versions(engine)

    changed = gpus(H100, 8)
    changed[3] = {**changed[3], "healthy": False, "healthReasons": ["ecc_uncorrected"]}
    await api(
        REGISTER, {"input": node_input("gpu-07", gpus=changed, storage=storage, fabrics=fabrics)}
    )
    after = await row_versions(engine)

    rewritten = sorted(key for key in before if before[key] != after[key])
    assert rewritten == [("gpu_pools", "H100-80GB"), ("gpus", "3")]


async def row_versions(engine: AsyncEngine) -> dict[tuple[str, str], str]:
    """Each child row's xmin: it changes exactly when the row is rewritten."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT 'gpus', idx::text, xmin::text FROM gpus"
                " UNION ALL SELECT 'fabric_attachments', fabric, xmin::text FROM fabric_attachments"
                " UNION ALL SELECT 'filesystems', fs_id, xmin::text FROM filesystems"
                " UNION ALL SELECT 'gpu_pools', gpu_class, xmin::text FROM gpu_pools"
            )
        )
        return {(r[0], r[1]): r[2] for r in rows}
