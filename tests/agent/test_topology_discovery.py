"""Topology discovery on the four nodes the issue names: NVLink peers, domain, NUMA, near HCAs."""

from pathlib import Path
from typing import Any

import pytest
from fake_nvml import FakeNvml, NVMLError_Unknown
from fake_topology import FakeTopologyNode, gb200_tray, h100_nvl, hgx_h100, l40s

from agent.config import DEFAULT_ENGINE_PROCESSES, AgentConfig, FabricConfig
from agent.discovery.gpus import Gpu, discover_gpus
from agent.discovery.topology import discover_topology, pci_address
from agent.discovery.weights import WeightsScanner
from agent.report import Host, build_report


def discover(root: Path, node: FakeTopologyNode) -> tuple[list[Gpu], list[str]]:
    warnings: list[str] = []
    nvml = FakeNvml(node.gpus)
    gpus = discover_gpus(nvml, str(root), DEFAULT_ENGINE_PROCESSES, warnings.append)
    return discover_topology(nvml, str(root), gpus, node.hcas, warnings.append), warnings


def test_hgx_h100_every_gpu_reaches_every_other_through_nvswitch(tmp_path: Path) -> None:
    gpus, warnings = discover(tmp_path, hgx_h100(tmp_path))

    assert warnings == []
    for gpu in gpus:
        assert gpu.nvlink_peers == tuple(i for i in range(8) if i != gpu.index)
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    # Two GPUs and two HCAs per PCIe switch.
    assert [g.near_hcas for g in gpus] == [
        (f"mlx5_{2 * (i // 2)}", f"mlx5_{2 * (i // 2) + 1}") for i in range(8)
    ]
    assert {g.nvlink_domain for g in gpus} == {None}


def test_h100_nvl_gpus_are_bridged_in_pairs(tmp_path: Path) -> None:
    gpus, warnings = discover(tmp_path, h100_nvl(tmp_path))

    assert warnings == []
    assert [g.nvlink_peers for g in gpus] == [(1,), (0,), (3,), (2,), (5,), (4,), (7,), (6,)]
    assert [g.near_hcas for g in gpus] == [("mlx5_0",)] * 4 + [("mlx5_1",)] * 4
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_l40s_has_no_nvlink_and_no_hca_under_its_switches(tmp_path: Path) -> None:
    gpus, warnings = discover(tmp_path, l40s(tmp_path))

    assert warnings == []
    # Known to be none: [] rather than unknown.
    assert [g.nvlink_peers for g in gpus] == [()] * 4
    # The adapter shares only the host bridge with them (PHB): not near.
    assert [g.near_hcas for g in gpus] == [()] * 4
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]


def test_a_gb200_tray_is_one_nvlink_group_in_one_domain(tmp_path: Path) -> None:
    gpus, warnings = discover(tmp_path, gb200_tray(tmp_path, clique=7))

    assert warnings == []
    assert [g.nvlink_peers for g in gpus] == [(1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2)]
    assert {g.nvlink_domain for g in gpus} == {"5f0d3c1a-9b2e-4c7d-8e6f-0a1b2c3d4e5f/7"}
    assert [g.near_hcas for g in gpus] == [("mlx5_0",), ("mlx5_1",), ("mlx5_2",), ("mlx5_3",)]
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]


def test_a_driver_that_cannot_tell_leaves_peers_unknown(tmp_path: Path) -> None:
    node = h100_nvl(tmp_path)
    node.gpus[3].nvlinks = NVMLError_Unknown()
    (tmp_path / "sys/bus/pci/devices/0000:18:00.0/numa_node").write_text("-1\n")

    gpus, warnings = discover(tmp_path, node)

    assert gpus[3].nvlink_peers is None
    assert any("GPU 3: NVLink 0 state unreadable" in w for w in warnings)
    # GPU 2 still sees its bridge; unknown is not "none".
    assert gpus[2].nvlink_peers == (3,)
    assert gpus[0].numa_node is None


def test_nvml_bus_ids_are_sysfs_addresses() -> None:
    assert pci_address("00000000:1A:00.0") == "0000:1a:00.0"
    assert pci_address("0008:03:00.0") == "0008:03:00.0"
    assert pci_address("GPU-1") is None


@pytest.mark.parametrize("build", [hgx_h100, h100_nvl, l40s, gb200_tray])
def test_the_report_sends_the_topology_under_the_contracts_names(
    tmp_path: Path, build: Any
) -> None:
    node = build(tmp_path)
    config = AgentConfig(
        node_id="n1",
        hostname="n1",
        mgmt_addr="10.0.0.1",
        root=str(tmp_path),
        fabrics=(FabricConfig("ib-a", tuple(node.hcas)),),
    )
    report = build_report(config, Host(nvml=FakeNvml(node.gpus)), WeightsScanner(str(tmp_path)))

    entries = report.node_input["gpus"]
    expected = {"index", "name", "uuid", "pciBusId", "memoryMb", "healthy", "healthReasons"}
    expected |= {"numaNode", "nvlinkPeers", "nearHcas", "recoveryAction"}
    if build is gb200_tray:
        expected.add("nvlinkDomain")
    assert [set(e) for e in entries] == [expected] * len(entries)
    assert all(isinstance(e["nvlinkPeers"], list) for e in entries)
    listed = set(report.node_input["fabrics"][0]["hcas"])
    assert {h for e in entries for h in e["nearHcas"]} <= listed
