"""InfiniBand fabric attachments: names from the operator, rates from /sys/class/infiniband.

The fabric name comes from the configuration and is never derived from the
port GID: OpenSM's default subnet prefix is fe80:: on every fabric, so two
fabrics that share no cable would look like one and a replica would be split
across them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.discovery.rootfs import host_path

if TYPE_CHECKING:  # agent.config reads the GPU file, which holds FabricAttachments
    from agent.config import FabricConfig


INFINIBAND = "/sys/class/infiniband"


@dataclass(frozen=True)
class FabricAttachment:
    fabric: str
    # Adapters with at least one active port.
    hcas: tuple[str, ...]
    # The slowest active port's rate: a collective runs at the speed of its slowest link.
    rate_gbps: int


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def active_port_rates(root: str, hca: str) -> list[float] | None:
    """Rates in Gb/s of the adapter's ACTIVE ports; None when the adapter is absent."""
    ports = host_path(root, f"{INFINIBAND}/{hca}/ports")
    if not ports.is_dir():
        return None
    rates = []
    for port in sorted(ports.iterdir()):
        state = _read(port / "state") or ""  # "4: ACTIVE"
        rate = re.match(
            r"\s*([0-9.]+)\s*Gb/sec", _read(port / "rate") or ""
        )  # "400 Gb/sec (4X NDR)"
        if "ACTIVE" in state.upper() and rate:
            rates.append(float(rate.group(1)))
    return rates


def hca_discovery(root: str, fabrics: Iterable[FabricConfig]) -> str:
    """Whether this agent looked for InfiniBand adapters (NodeInput.hcaDiscovery).

    The operator turns discovery on by naming fabrics ([[fabrics]]): with
    none, the agent was not asked and its node's adapters are unknown
    (NOT_ASKED), which the inventory's drift must not read as all missing.
    Asked, it reads /sys/class/infiniband: absent (no driver loaded, no
    adapter), every configured adapter is missing (NO_INFINIBAND); present,
    the fabrics it reports are what it found (LOOKED).
    """
    if not any(True for _ in fabrics):
        return "NOT_ASKED"
    return "LOOKED" if host_path(root, INFINIBAND).is_dir() else "NO_INFINIBAND"


def discover_fabrics(
    root: str, fabrics: Iterable[FabricConfig], warn: Callable[[str], None]
) -> list[FabricAttachment]:
    """Each configured fabric with its usable adapters and rate, sorted by name.

    An adapter with no active port is left out with a warning: handed to a
    shard, NCCL could pick it and hang rather than fail. A fabric with none
    left is not reported, since the node cannot reach it.
    """
    attachments = []
    for fabric in fabrics:
        usable: list[str] = []
        slowest: float | None = None
        for hca in fabric.hcas:
            rates = active_port_rates(root, hca)
            if rates is None:
                warn(f"fabric {fabric.name}: adapter {hca} not found under /sys/class/infiniband")
                continue
            if not rates:
                warn(f"fabric {fabric.name}: adapter {hca} has no active port: left out")
                continue
            usable.append(hca)
            slowest = min(rates) if slowest is None else min(slowest, *rates)
        if slowest is None:
            warn(f"fabric {fabric.name}: no adapter with an active port: not reported")
            continue
        attachments.append(FabricAttachment(fabric.name, tuple(usable), int(slowest)))
    return sorted(attachments, key=lambda a: a.fabric)
