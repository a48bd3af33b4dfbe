"""GPU topologies as agents report them, for tests to register: the four the issue names."""

from __future__ import annotations

from typing import Any

from tests.support.reports import H100, gpus

GB200 = {"name": "NVIDIA GB200", "memoryMb": 189471, "gpuClass": "GB200"}
L40S = {"name": "NVIDIA L40S", "memoryMb": 46068}


def with_peers(entries: list[dict[str, Any]], groups: list[list[int]]) -> list[dict[str, Any]]:
    """Each GPU's nvlinkPeers: the other members of its group; GPUs in no group get []."""
    for entry in entries:
        group = next((g for g in groups if entry["index"] in g), [entry["index"]])
        entry["nvlinkPeers"] = [i for i in group if i != entry["index"]]
    return entries


def hgx_h100(near: bool = True) -> list[dict[str, Any]]:
    """8 GPUs on one NVSwitch board; PCIe switch k holds GPUs 2k, 2k+1 and HCAs mlx5_2k, mlx5_2k+1."""
    entries = with_peers(gpus(H100), [list(range(8))])
    for entry in entries:
        switch = entry["index"] // 2
        entry["numaNode"] = 0 if switch < 2 else 1
        if near:
            entry["nearHcas"] = [f"mlx5_{2 * switch}", f"mlx5_{2 * switch + 1}"]
    return entries


def bridged_pairs(count: int = 8) -> list[dict[str, Any]]:
    """H100 NVL style: GPUs bridged in pairs (0-1, 2-3, ...)."""
    return with_peers(gpus(H100, count), [[i, i + 1] for i in range(0, count, 2)])


def no_nvlink(model: dict[str, Any] = H100, count: int = 8) -> list[dict[str, Any]]:
    """L40S style: no two GPUs share NVLink."""
    return with_peers(gpus(model, count), [])


def gb200_tray(domain: str | None) -> list[dict[str, Any]]:
    """4 GPUs on NVLink, in one clique of a multi-node NVLink domain."""
    entries = with_peers(gpus(GB200, 4), [[0, 1, 2, 3]])
    if domain is not None:
        for entry in entries:
            entry["nvlinkDomain"] = domain
    return entries


IB_A = {"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"], "rateGbps": 400}
IB_B = {"fabric": "ib-b", "hcas": ["mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"], "rateGbps": 400}
