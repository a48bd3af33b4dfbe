"""RAM, disks and fabrics, discovered from a fake node's files."""

import os
from pathlib import Path

import pytest
from fake_root import TIB, FakeDisks, add_hca, make_node, write

from agent.config import FabricConfig
from agent.discovery.fabrics import discover_fabrics, hca_discovery
from agent.discovery.memory import read_meminfo
from agent.discovery.mountinfo import read_mountinfo
from agent.discovery.storage import Filesystem, discover_storage, present_model_dirs


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return make_node(tmp_path)


def storage_of(node: Path, dirs: list[str], extra_shared: tuple[str, ...] = ()) -> list[Filesystem]:
    disks = FakeDisks(node)
    warnings: list[str] = []
    for d in dirs:
        (node / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
    found = discover_storage(
        str(node), dirs, extra_shared, warnings.append, statvfs=disks.statvfs, stat=disks.stat
    )
    assert warnings == []
    return found


# RAM


def test_ram_is_memtotal_in_mib(node: Path) -> None:
    assert read_meminfo(str(node)) == 2113612800 // 1024


def test_ram_is_unknown_when_meminfo_cannot_be_read(tmp_path: Path) -> None:
    assert read_meminfo(str(tmp_path)) is None
    write(tmp_path, "/proc/meminfo", "MemFree: 12 kB\n")
    assert read_meminfo(str(tmp_path)) is None


# Disk


def test_two_model_directories_on_one_disk_are_one_filesystem_listing_both(node: Path) -> None:
    filesystems = storage_of(node, ["/data/models", "/data/hf-cache"])
    assert filesystems == [
        Filesystem(
            id="dev:9:127",
            mount_point="/data",
            fs_type="xfs",
            shared=False,
            free_bytes=20 * TIB,
            total_bytes=28 * TIB,
            directories=("/data/models", "/data/hf-cache"),
        )
    ]


def test_each_filesystem_is_reported_once_with_its_type_and_whether_it_is_shared(
    node: Path,
) -> None:
    filesystems = storage_of(
        node, ["/data/models", "/scratch/models", "/mnt/filer/models", "/lustre/models", "/opt/m"]
    )
    assert [(fs.mount_point, fs.fs_type, fs.shared) for fs in filesystems] == [
        ("/", "ext4", False),
        ("/data", "xfs", False),
        ("/lustre", "lustre", True),
        ("/mnt/filer", "nfs4", True),
        ("/scratch", "ext4", False),
    ]
    filer = next(fs for fs in filesystems if fs.fs_type == "nfs4")
    assert (filer.id, filer.free_bytes, filer.directories) == (
        "dev:0:53",
        100 * TIB,
        ("/mnt/filer/models",),
    )


def test_an_operator_can_name_more_shared_filesystem_types(node: Path) -> None:
    # The mount point has a space in it, which mountinfo writes as \040.
    (only,) = storage_of(node, ["/mnt/my models/llm"])
    assert (only.mount_point, only.fs_type, only.shared) == ("/mnt/my models", "fuse.weka", False)
    (only,) = storage_of(node, ["/mnt/my models/llm"], extra_shared=("weka",))
    assert only.shared


def test_a_symlinked_model_directory_is_on_the_disk_it_points_to(node: Path) -> None:
    (node / "data/models").mkdir()
    (node / "srv").mkdir()
    os.symlink(node / "data/models", node / "srv/models")
    (only,) = storage_of(node, ["/srv/models"])
    assert (only.mount_point, only.directories) == ("/data", ("/srv/models",))


def test_a_missing_model_directory_is_skipped_with_a_warning_not_reported_as_empty(
    node: Path,
) -> None:
    # An unmounted filer: /mnt/filer exists, the models directory inside it does not.
    (node / "data/models").mkdir()
    warnings: list[str] = []
    present = present_model_dirs(str(node), ["/data/models", "/mnt/filer/models"], warnings.append)
    assert present == ["/data/models"]
    assert warnings == [
        "model directory /mnt/filer/models does not exist (an unmounted filer?): skipped"
    ]
    disks = FakeDisks(node)
    filesystems = discover_storage(
        str(node), present, (), warnings.append, statvfs=disks.statvfs, stat=disks.stat
    )
    assert [fs.mount_point for fs in filesystems] == ["/data"]


def test_free_space_is_what_an_unprivileged_engine_can_use(node: Path) -> None:
    (fs,) = storage_of(node, ["/data/models"])
    # f_bfree would include the blocks reserved for root, which a model download never gets.
    assert fs.free_bytes == FakeDisks(node).statvfs(str(node / "data")).f_bavail * 4096


def test_mount_points_under_a_containers_root_are_given_in_the_hosts_terms(
    tmp_path: Path,
) -> None:
    host = tmp_path / "host"
    write(
        host,
        "/proc/self/mountinfo",
        "1 0 0:30 / / rw - overlay overlay rw\n"
        f"2 1 259:2 / {host} ro - ext4 /dev/nvme0n1p2 ro\n"
        f"3 2 9:127 / {host}/data ro - xfs /dev/md127 ro\n",
    )
    points = {m.mount_point: m.fs_type for m in read_mountinfo(str(host))}
    assert points["/"] == "ext4" and points["/data"] == "xfs"


# Fabrics


def test_a_fabric_runs_at_its_slowest_active_port(node: Path) -> None:
    add_hca(node, "mlx5_2", {1: ("4: ACTIVE", "200 Gb/sec (4X HDR)"), 2: ("1: DOWN", "10 Gb/sec")})
    warnings: list[str] = []
    fabrics = discover_fabrics(
        str(node),
        [FabricConfig("ib-b", ("mlx5_2",)), FabricConfig("ib-a", ("mlx5_0", "mlx5_1", "mlx5_2"))],
        warnings.append,
    )
    assert [(f.fabric, f.hcas, f.rate_gbps) for f in fabrics] == [
        ("ib-a", ("mlx5_0", "mlx5_1", "mlx5_2"), 200),
        ("ib-b", ("mlx5_2",), 200),
    ]
    assert warnings == []


def test_an_adapter_with_no_active_port_is_left_out_with_a_warning(node: Path) -> None:
    add_hca(node, "mlx5_1", {1: ("1: DOWN", "400 Gb/sec (4X NDR)")})
    add_hca(node, "mlx5_3", {1: ("2: INIT", "400 Gb/sec (4X NDR)")})
    warnings: list[str] = []
    fabrics = discover_fabrics(
        str(node),
        [FabricConfig("ib-a", ("mlx5_0", "mlx5_1")), FabricConfig("ib-b", ("mlx5_3", "mlx5_9"))],
        warnings.append,
    )
    assert [(f.fabric, f.hcas, f.rate_gbps) for f in fabrics] == [("ib-a", ("mlx5_0",), 400)]
    assert warnings == [
        "fabric ib-a: adapter mlx5_1 has no active port: left out",
        "fabric ib-b: adapter mlx5_3 has no active port: left out",
        "fabric ib-b: adapter mlx5_9 not found under /sys/class/infiniband",
        "fabric ib-b: no adapter with an active port: not reported",
    ]


def test_the_fabric_name_is_the_operators_whatever_the_ports_gid(node: Path) -> None:
    write(
        node,
        "/sys/class/infiniband/mlx5_0/ports/1/gids/0",
        "fe80:0000:0000:0000:0000:0000:0000:0001",
    )
    (fabric,) = discover_fabrics(str(node), [FabricConfig("rail-3", ("mlx5_0",))], print)
    assert fabric.fabric == "rail-3"


def test_slow_legacy_rates_are_whole_gigabits(node: Path) -> None:
    add_hca(node, "mlx4_0", {1: ("4: ACTIVE", "2.5 Gb/sec (1X SDR)")})
    (fabric,) = discover_fabrics(str(node), [FabricConfig("old", ("mlx4_0",))], print)
    assert fabric.rate_gbps == 2


def test_the_agent_says_whether_it_looked_for_hcas(node: Path, tmp_path: Path) -> None:
    # Fabrics configured and the kernel shows InfiniBand: it looked.
    assert hca_discovery(str(node), [FabricConfig("ib-a", ("mlx5_0",))]) == "LOOKED"
    # No fabrics configured: not asked, whatever the node has (its HCAs are unknown).
    assert hca_discovery(str(node), []) == "NOT_ASKED"
    # Configured, and no /sys/class/infiniband at all (no driver, no adapter):
    # every configured adapter is missing.
    bare = tmp_path / "bare"
    bare.mkdir()
    assert hca_discovery(str(bare), [FabricConfig("ib-a", ("mlx5_0",))]) == "NO_INFINIBAND"
