"""The four GPU nodes the topology issue names, as NVML and sysfs show them.

Each builder writes the node's PCI tree under a fake root (devices under
/sys/devices/pciDDDD:BB/..., reached through the relative symlinks the kernel
makes in /sys/bus/pci/devices and /sys/class/infiniband/<hca>/device, with
NUMA nodes and IB ports) and returns the fake pynvml's GPUs and the HCAs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fake_nvml import NVLINK_GPU, NVLINK_SWITCH, Fabric, FakeGpu, NVMLError_NotSupported
from fake_root import add_hca, write

NDR = ("4: ACTIVE", "400 Gb/sec (4X NDR)")


@dataclass
class FakeTopologyNode:
    gpus: list[FakeGpu]
    hcas: list[str]


def nvml_bus_id(address: str) -> str:
    """sysfs '0000:18:00.0' as NVML writes it: '00000000:18:00.0'."""
    return f"0000{address.upper()}"


def add_device(root: Path, bridges: list[str], address: str, numa: int) -> str:
    """A PCI device below the given bridges (root port first); its /sys/bus/pci link."""
    host = f"pci{address[:4]}:{bridges[0].split(':')[1] if bridges else address.split(':')[1]}"
    real = "/".join(["sys/devices", host, *bridges, address])
    write(root, f"/{real}/numa_node", f"{numa}\n")
    link = root / "sys/bus/pci/devices" / address
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(root / real, link.parent), link)
    return real


def add_adapter(root: Path, name: str, bridges: list[str], address: str, numa: int) -> None:
    real = add_device(root, bridges, address, numa)
    add_hca(root, name, {1: NDR})
    link = root / "sys/class/infiniband" / name / "device"
    os.symlink(os.path.relpath(root / real, link.parent), link)


def switch(root_port: str, n: int) -> list[str]:
    """A PCIe switch below a root port: its upstream port and downstream port n."""
    bus = int(root_port.split(":")[1], 16)
    return [root_port, f"0000:{bus + 1:02x}:00.0", f"0000:{bus + 2:02x}:{n:02x}.0"]


def hgx_h100(root: Path) -> FakeTopologyNode:
    """8 H100 SXM on one NVSwitch board (18 links each, all to switches); 4 PCIe
    switches, each with 2 GPUs and 2 HCAs; switches 0-1 on NUMA node 0, 2-3 on 1."""
    gpus, hcas = [], []
    for k in range(4):
        root_port = f"0000:{0x10 + 0x20 * k:02x}:01.0"
        numa = k // 2
        for j in range(2):
            index = 2 * k + j
            address = f"0000:{0x18 + 0x20 * k + j:02x}:00.0"
            add_device(root, switch(root_port, j), address, numa)
            links = [(NVLINK_SWITCH, f"00000000:{0xE0 + link % 4:02X}:00.0") for link in range(18)]
            gpus.append(
                FakeGpu(uuid=f"GPU-hgx-{index}", bus_id=nvml_bus_id(address), nvlinks=links)
            )
        for j in range(2):
            name = f"mlx5_{2 * k + j}"
            address = f"0000:{0x1C + 0x20 * k + j:02x}:00.0"
            add_adapter(root, name, switch(root_port, 2 + j), address, numa)
            hcas.append(name)
    return FakeTopologyNode(gpus, hcas)


def h100_nvl(root: Path) -> FakeTopologyNode:
    """8 H100 NVL bridged in pairs (0-1, 2-3, ...), link 2 of each bridge inactive;
    2 PCIe switches of 4 GPUs and 1 HCA each."""
    addresses = [f"0000:{0x18 + 0x40 * (i // 4) + i % 4:02x}:00.0" for i in range(8)]
    gpus, hcas = [], []
    for i, address in enumerate(addresses):
        root_port = f"0000:{0x10 + 0x40 * (i // 4):02x}:01.0"
        add_device(root, switch(root_port, i % 4), address, i // 4)
        partner = nvml_bus_id(addresses[i ^ 1])
        links = [(NVLINK_GPU, partner), (NVLINK_GPU, partner), None, (NVLINK_GPU, partner)]
        gpus.append(
            FakeGpu(
                name="NVIDIA H100 NVL",
                memory_mib=95830,
                uuid=f"GPU-nvl-{i}",
                bus_id=nvml_bus_id(address),
                nvlinks=links,
            )
        )
    for k in range(2):
        root_port = f"0000:{0x10 + 0x40 * k:02x}:01.0"
        name = f"mlx5_{k}"
        add_adapter(root, name, switch(root_port, 4), f"0000:{0x1C + 0x40 * k:02x}:00.0", k)
        hcas.append(name)
    return FakeTopologyNode(gpus, hcas)


def l40s(root: Path) -> FakeTopologyNode:
    """4 L40S, each alone on a root port (no NVLink, no switch); one HCA on its own root port."""
    gpus = []
    for i in range(4):
        address = f"0000:{0x20 * (i + 1):02x}:00.0"
        add_device(root, [f"0000:{0x20 * (i + 1) - 1:02x}:01.0"], address, i // 2)
        gpus.append(
            FakeGpu(
                name="NVIDIA L40S",
                memory_mib=46068,
                uuid=f"GPU-l40s-{i}",
                bus_id=nvml_bus_id(address),
                nvlinks=NVMLError_NotSupported(),
            )
        )
    add_adapter(root, "mlx5_0", ["0000:a0:01.0"], "0000:a1:00.0", 1)
    return FakeTopologyNode(gpus, ["mlx5_0"])


GB200_CLUSTER = bytes.fromhex("5f0d3c1a9b2e4c7d8e6f0a1b2c3d4e5f")


def gb200_tray(root: Path, clique: int = 7) -> FakeTopologyNode:
    """One GB200 NVL72 compute tray: 4 GPUs on the rack's NVSwitch trays, all in one
    clique; each GPU shares a PCIe switch with one HCA; NUMA 0, 0, 1, 1."""
    gpus, hcas = [], []
    for i in range(4):
        root_port = f"000{i // 2 + 8}:{0x00:02x}:01.0"
        address = f"000{i // 2 + 8}:{0x03 + 4 * (i % 2):02x}:00.0"
        bridges = [root_port, f"000{i // 2 + 8}:{0x01 + 4 * (i % 2):02x}:00.0"]
        bridges.append(f"000{i // 2 + 8}:{0x02 + 4 * (i % 2):02x}:00.0")
        add_device(root, bridges, address, i // 2)
        links = [(NVLINK_SWITCH, f"00000000:{0xF0 + link % 9:02X}:00.0") for link in range(18)]
        gpus.append(
            FakeGpu(
                name="NVIDIA GB200",
                memory_mib=189471,
                uuid=f"GPU-gb200-{i}",
                bus_id=nvml_bus_id(address),
                nvlinks=links,
                fabric=Fabric(GB200_CLUSTER, clique),
            )
        )
        name = f"mlx5_{i}"
        domain = f"000{i // 2 + 8}"
        hca_address = f"{domain}:{0x04 + 4 * (i % 2):02x}:00.0"
        hca_port = f"{domain}:{0x02 + 4 * (i % 2):02x}:01.0"
        add_adapter(root, name, [*bridges[:2], hca_port], hca_address, i // 2)
        hcas.append(name)
    return FakeTopologyNode(gpus, hcas)
