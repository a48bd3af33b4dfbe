"""GPU topology: NVLink peers and the NVLink domain from NVML, NUMA and near HCAs from sysfs.

What placement needs to keep a tensor-parallel shard fast: which GPUs reach
each other over NVLink (an HGX board through its NVSwitches, an H100 NVL in
bridged pairs, an L40S not at all), which multi-node NVLink domain a GB200
tray is in, and which InfiniBand adapters sit under the same PCIe switch as
each GPU (GPUDirect RDMA is fast only through those).

Unknown is not zero, here as in the service: a GPU the driver says has no
NVLink (NotSupported) reports `[]`; one whose links the driver could not read
reports None, and so does a GPU whose sysfs entry is missing. A wrong "none"
would let the scheduler believe a node has no fast GPU pairs; None only says
that topology-constrained shards should go elsewhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from agent.discovery.gpus import Gpu, _describe, _error_class, _text
from agent.discovery.rootfs import host_path, node_view

_PCI = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")
# NVML's enum values (nvmlIntNvLinkDeviceType_t, nvmlGpuFabricState_t), for
# bindings that predate the names.
_REMOTE_GPU, _REMOTE_SWITCH = 0, 2
_FABRIC_COMPLETED = 3


def pci_address(bus_id: str | None) -> str | None:
    """NVML's '00000000:18:00.0' as sysfs names it, '0000:18:00.0'; None when it is not one."""
    match = _PCI.fullmatch((bus_id or "").strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def discover_topology(
    nvml: Any | None,
    root: str,
    gpus: Sequence[Gpu],
    hcas: Iterable[str],
    warn: Callable[[str], None],
) -> list[Gpu]:
    """The GPUs with their NVLink peers, NVLink domain, NUMA node and near HCAs filled in.

    `hcas` are the adapters of the fabrics this node reports: an adapter the
    report does not list could not be handed to a shard, so it is never near.
    """
    nvlink = _read_nvlink(nvml, gpus, warn) if nvml is not None and gpus else {}
    adapters = {hca: _pci_path(root, f"/sys/class/infiniband/{hca}/device") for hca in hcas}
    out = []
    for gpu in gpus:
        peers, domain = nvlink.get(gpu.index, (None, None))
        address = pci_address(gpu.pci_bus_id)
        out.append(
            replace(
                gpu,
                nvlink_peers=peers,
                nvlink_domain=domain,
                numa_node=_numa_node(root, address) if address else None,
                near_hcas=_near(root, address, adapters) if address else None,
            )
        )
    return out


def _read_nvlink(
    nvml: Any, gpus: Sequence[Gpu], warn: Callable[[str], None]
) -> dict[int, tuple[tuple[int, ...] | None, str | None]]:
    """Per GPU index: (its NVLink peers, its NVLink domain)."""
    try:
        nvml.nvmlInit()
    except Exception as e:
        warn(f"NVML did not start for NVLink topology ({_describe(e)}): topology not reported")
        return {}
    try:
        by_address = {pci_address(g.pci_bus_id): g.index for g in gpus if g.pci_bus_id}
        links: dict[int, tuple[set[int], bool] | None] = {}
        domains: dict[int, str | None] = {}
        for gpu in gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            except Exception as e:
                warn(f"GPU {gpu.index}: no handle for NVLink topology ({_describe(e)})")
                links[gpu.index] = None
                continue
            links[gpu.index] = _links(nvml, handle, gpu.index, by_address, warn)
            domains[gpu.index] = _domain(nvml, handle, gpu.index, warn)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    # A link to an NVSwitch reaches every GPU on the switch fabric.
    on_switch = {i for i, found in links.items() if found is not None and found[1]}
    peers: dict[int, set[int] | None] = {}
    for index, found in links.items():
        if found is None:
            peers[index] = None
            continue
        direct, switched = found
        peers[index] = direct | (on_switch if switched else set())
    # Both ends of a link report it; a driver that shows only one end still
    # has the link, and the service refuses one-sided peers.
    for index, listed in list(peers.items()):
        for peer in listed or ():
            other = peers.get(peer)
            if other is not None:
                other.add(index)
    return {
        index: (
            None if listed is None else tuple(sorted(listed - {index})),
            domains.get(index),
        )
        for index, listed in peers.items()
    }


def _links(
    nvml: Any,
    handle: Any,
    index: int,
    by_address: dict[str | None, int],
    warn: Callable[[str], None],
) -> tuple[set[int], bool] | None:
    """(GPUs reached directly, whether a link goes to an NVSwitch); None when the driver cannot tell."""
    unsupported = _error_class(nvml, "NVMLError_NotSupported")
    # Past the GPU's last link the driver says InvalidArgument (an A100 has
    # 12 of the 18 an H100 has); that is the end of its links, not a fault.
    no_such_link = _error_class(nvml, "NVMLError_InvalidArgument")
    remote_gpu = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_GPU", _REMOTE_GPU)
    remote_switch = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", _REMOTE_SWITCH)
    direct: set[int] = set()
    switched = False
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            active = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except unsupported:
            if link == 0:
                return set(), False  # no NVLink at all: PCIe only
            continue
        except no_such_link:
            break
        except Exception as e:
            warn(
                f"GPU {index}: NVLink {link} state unreadable ({_describe(e)}): peers not reported"
            )
            return None
        if not active:
            continue
        try:
            kind = _remote_kind(nvml, handle, link)
            if kind == remote_switch:
                switched = True
                continue
            if kind not in (remote_gpu, None):
                continue  # an IBM NPU, or a device the driver cannot name
            remote = pci_address(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except Exception as e:
            warn(
                f"GPU {index}: NVLink {link} remote unreadable ({_describe(e)}): peers not reported"
            )
            return None
        peer = by_address.get(remote)
        if peer is not None:
            direct.add(peer)
        elif kind is None:
            switched = True  # a driver without the type call: not a GPU here, so a switch
        else:
            warn(f"GPU {index}: NVLink {link} leads to {remote}, which is no GPU of this node")
    return direct, switched


def _remote_kind(nvml: Any, handle: Any, link: int) -> int | None:
    """What the link's far end is; None when the driver predates the question."""
    try:
        return int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
    except (
        _error_class(nvml, "NVMLError_NotSupported"),
        _error_class(nvml, "NVMLError_FunctionNotFound"),
    ):
        return None


def _domain(nvml: Any, handle: Any, index: int, warn: Callable[[str], None]) -> str | None:
    """'<cluster uuid>/<clique id>' when the GPU's fabric registration completed, else None.

    The versioned call first (its struct carries a version field); drivers
    before it have only the plain one. A GPU outside a multi-node NVLink
    system says NotSupported: no domain.
    """
    tried = (
        ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
        ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
    )
    skip = (
        _error_class(nvml, "NVMLError_NotSupported"),
        _error_class(nvml, "NVMLError_FunctionNotFound"),
    )
    for call, struct in tried:
        if not hasattr(nvml, call) or not hasattr(nvml, struct):
            continue
        info = getattr(nvml, struct)()
        try:
            getattr(nvml, call)(handle, ctypes.byref(info))
        except skip:
            continue
        except Exception as e:
            warn(f"GPU {index}: NVLink fabric info unreadable ({_describe(e)})")
            return None
        if info.state != getattr(nvml, "NVML_GPU_FABRIC_STATE_COMPLETED", _FABRIC_COMPLETED):
            return None
        cluster = uuid.UUID(bytes=bytes(bytearray(info.clusterUuid)[:16]).ljust(16, b"\0"))
        return f"{cluster}/{int(info.cliqueId)}"
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _numa_node(root: str, address: str) -> int | None:
    value = _read(str(host_path(root, f"/sys/bus/pci/devices/{address}/numa_node")))
    try:
        node = int(value) if value is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None  # -1: the firmware did not say


def _pci_path(root: str, link: str) -> list[str] | None:
    """The PCI devices from the root port down to the device a sysfs link names; None if absent.

    /sys/bus/pci/devices/0000:18:00.0 -> ../../../devices/pci0000:00/0000:00:01.0/
    0000:01:00.0/0000:02:00.0/0000:18:00.0: every component after pciDDDD:BB
    is a bridge on the way, the last one the device itself.
    """
    path = host_path(root, link)
    if not path.exists():
        return None
    seen = node_view(root, os.path.realpath(path))
    if seen is None:
        return None
    parts = seen.strip("/").split("/")
    for i, part in enumerate(parts):
        if part.startswith("pci"):
            return [p for p in parts[i + 1 :] if _PCI.fullmatch(p)]
    return None


def _near(root: str, address: str, adapters: dict[str, list[str] | None]) -> tuple[str, ...] | None:
    """The adapters under the same PCIe switch as the GPU (nvidia-smi's PIX or PXB).

    Sharing a switch means sharing a bridge below the root port: the common
    part of the two paths is longer than the root port alone. Sharing only
    the root port or the host bridge (PHB, SYS) is not near.
    """
    gpu = _pci_path(root, f"/sys/bus/pci/devices/{address}")
    if gpu is None:
        return None
    near = []
    for hca, path in adapters.items():
        if path is None:
            continue
        common = 0
        for a, b in zip(gpu[:-1], path[:-1], strict=False):
            if a != b:
                break
            common += 1
        if common >= 2:
            near.append(hca)
    return tuple(sorted(near))
