"""The report the agent sends: NodeInput, with "unknown" left out rather than zeroed."""

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fake_nvml import FakeNvml, NVMLError_LibraryNotFound, h100, h200
from fake_root import GIB, TIB, FakeDisks, add_model, make_node

from agent import __version__
from agent.config import AgentConfig, FabricConfig
from agent.discovery.weights import WeightsScanner
from agent.report import Host, Report, build_report, utc_now


@pytest.fixture
def node(tmp_path: Path) -> Path:
    node = make_node(tmp_path)
    add_model(node, "/data/models/llama-8b", {"config.json": 100, "model.safetensors": 16 * GIB})
    (node / "mnt/filer/models").mkdir(parents=True)
    return node


def report_of(
    node: Path, nvml: Any = None, clock: Callable[[], datetime] = utc_now, **settings: Any
) -> Report:
    config = AgentConfig(
        node_id="gpu-07", hostname="gpu-07.dc1", mgmt_addr="10.0.0.7", root=str(node), **settings
    )
    disks = FakeDisks(node)
    versions = {"vllm": "0.11.0", "sglang": "0.5.2"}

    def version_of(dist: str) -> str:
        from importlib.metadata import PackageNotFoundError

        if dist not in versions:
            raise PackageNotFoundError(dist)
        return versions[dist]

    host = Host(
        nvml=nvml or FakeNvml([h100(i) for i in range(8)]),
        statvfs=disks.statvfs,
        stat=disks.stat,
        version_of=version_of,
        clock=clock,
    )
    return build_report(config, host, WeightsScanner(str(node)))


def test_a_full_report_uses_the_contracts_names(node: Path) -> None:
    report = report_of(
        node,
        labels={"zone": "z1", "rack": "r12"},
        model_dirs=("/data/models", "/mnt/filer/models"),
        fabrics=(FabricConfig("ib-a", ("mlx5_0", "mlx5_1")),),
    )
    sent = report.node_input
    assert sent["id"] == "gpu-07" and sent["mgmtAddr"] == "10.0.0.7"
    assert sent["labels"] == [{"key": "rack", "value": "r12"}, {"key": "zone", "value": "z1"}]
    assert sent["memoryTotalMb"] == 2113612800 // 1024
    assert len(sent["gpus"]) == 8
    assert sent["gpus"][0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-h100-0",
        "pciBusId": "00000000:18:00.0",
        "memoryMb": 81559,
        "healthy": True,
        "healthReasons": [],
        # The plain fake GPU has no NVLink (NotSupported) and no sysfs entry.
        "nvlinkPeers": [],
        # The driver's recovery action (NVML's field): nothing to do.
        "recoveryAction": "NONE",
    }
    assert sent["fabrics"] == [{"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}]
    assert sent["storage"] == [
        {
            "id": "dev:9:127",
            "mountPoint": "/data",
            "fsType": "xfs",
            "shared": False,
            "freeBytes": 20 * TIB,
            "totalBytes": 28 * TIB,
            "directories": ["/data/models"],
        },
        {
            "id": "dev:0:53",
            "mountPoint": "/mnt/filer",
            "fsType": "nfs4",
            "shared": True,
            "freeBytes": 100 * TIB,
            "totalBytes": 500 * TIB,
            "directories": ["/mnt/filer/models"],
        },
    ]
    # When the agent saw them, by its clock in UTC: compared apart.
    assert all(w.pop("observedAt").endswith("+00:00") for w in sent["weights"])
    assert sent["weights"] == [{"path": "/data/models/llama-8b", "sizeBytes": 16 * GIB + 100}]
    assert sent["bootId"] == "0f6b1e52-8d52-4a53-9e33-6f0c4a7d5b21"
    assert sent["agentVersion"] == __version__
    assert sent["engineVersions"] == [
        {"key": "sglang", "value": "0.5.2"},
        {"key": "vllm", "value": "0.11.0"},
    ]
    assert report.warnings == ()


def test_the_service_derives_the_gpu_class_unless_the_operator_overrides_it(node: Path) -> None:
    nvml = FakeNvml([h200()])
    assert "gpuClass" not in report_of(node, nvml).node_input["gpus"][0]
    overridden = report_of(node, nvml, gpu_class="H200-141GB").node_input["gpus"][0]
    assert overridden["gpuClass"] == "H200-141GB"


def test_a_node_with_no_model_directories_sends_no_storage_and_no_weights(node: Path) -> None:
    # Not asked to look: it must constrain nothing, not read as a full disk.
    sent = report_of(node).node_input
    assert "storage" not in sent and "weights" not in sent


def test_a_node_that_looked_and_found_no_models_says_so(node: Path) -> None:
    sent = report_of(node, model_dirs=("/mnt/filer/models",)).node_input
    assert sent["weights"] == []
    assert [fs["mountPoint"] for fs in sent["storage"]] == ["/mnt/filer"]


def test_a_node_whose_only_model_directory_is_missing_reports_nothing_about_disk(
    node: Path,
) -> None:
    # The filer is not mounted: its space and its models are unknown, not zero.
    report = report_of(node, model_dirs=("/lustre/models",))
    assert "storage" not in report.node_input and "weights" not in report.node_input
    assert report.warnings == (
        "model directory /lustre/models does not exist (an unmounted filer?): skipped",
    )


def test_unreadable_ram_and_no_driver_are_left_out_with_warnings(node: Path) -> None:
    (node / "proc/meminfo").unlink()
    report = report_of(node, FakeNvml([], init_error=NVMLError_LibraryNotFound()))
    assert "memoryTotalMb" not in report.node_input
    assert report.node_input["gpus"] == []
    assert len(report.warnings) == 2


def test_an_unreadable_boot_id_is_left_out_with_a_warning(node: Path) -> None:
    (node / "proc/sys/kernel/random/boot_id").unlink()
    report = report_of(node)
    assert "bootId" not in report.node_input
    assert report.warnings == (
        "cannot read /proc/sys/kernel/random/boot_id: a reboot will not clear the GPUs' XID health",
    )


def with_free_space(report: Report, free: int) -> Report:
    (fs,) = report.node_input["storage"]
    return Report({**report.node_input, "storage": [{**fs, "freeBytes": free}]})


def test_a_report_changes_with_what_matters_and_not_with_log_churn(node: Path) -> None:
    dirs = {"model_dirs": ("/data/models",)}
    sent = report_of(node, **dirs)
    assert not report_of(node, **dirs).changed_since(sent)
    free = sent.node_input["storage"][0]["freeBytes"]

    # A log file grew, then a cache was cleaned: nothing worth a report.
    assert not with_free_space(sent, free - 100 * 4096).changed_since(sent)
    assert not with_free_space(sent, free + (512 << 20)).changed_since(sent)
    # A model was downloaded.
    assert with_free_space(sent, free - 16 * GIB).changed_since(sent)

    faulted = FakeNvml([h100(i) for i in range(8)])
    faulted.gpus[6].ecc_uncorrected = 1
    assert report_of(node, faulted, **dirs).changed_since(sent)
    assert report_of(node, **dirs).changed_since(None)


def test_each_block_says_when_it_was_observed_and_a_later_look_is_no_change(node: Path) -> None:
    ticks = iter(datetime(2026, 12, 5, 9, 0, s, tzinfo=UTC) for s in range(60))
    dirs = {"model_dirs": ("/data/models",)}
    sent = report_of(node, clock=lambda: next(ticks), **dirs).node_input
    # Read before each block's discovery: never later than the facts were seen.
    assert sent["gpusObservedAt"] == sent["fabricsObservedAt"] == "2026-12-05T09:00:00+00:00"
    assert sent["storageObservedAt"] == "2026-12-05T09:00:01+00:00"

    first = report_of(node, **dirs)
    later = report_of(node, clock=lambda: utc_now() + timedelta(minutes=1), **dirs)
    assert later.node_input["gpusObservedAt"] != first.node_input["gpusObservedAt"]
    assert not later.changed_since(first), "the same hardware seen later is the same report"
