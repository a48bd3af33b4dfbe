"""`llmgw-inventory demo`: a small, realistic cluster registered through the API.

Four HGX H100 nodes (eight H100-80GB each, one NVSwitch board: every GPU
reaches the other seven over NVLink; one rail adapter per GPU, near it on the
same PCIe switch) on two InfiniBand fabrics, ib-a and ib-b; one L40S node
(PCIe, no NVLink, no InfiniBand); model weights on some local disks (READY
on most, one copy still DOWNLOADING); one GPU
that raised XID 79 (fallen off the bus: sticky until a reset); one node
cordoned for a PSU swap. It is what a new user's first queries, placements
and dashboard need, with names the README's walkthrough uses.

Everything goes through the service's GraphQL mutations (`registerNode`,
`cordonNode`, `heartbeat`), as agents and operators send them, so it works
against any running service and needs an operator token where tokens are in
force. It then heartbeats every node until stopped, so none turns UNREACHABLE
during a walkthrough; `--once` registers and exits. This module is a client:
it never imports the database code.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from service.ctl import add_connection_options, connect
from service.ctl.client import Client, CtlError

H100 = ("NVIDIA H100 80GB HBM3", 81559)
L40S = ("NVIDIA L40S", 46068)
TB = 1_000_000_000_000
GB = 1_000_000_000

REGISTER = """
mutation DemoRegister($input: NodeInput!) {
  registerNode(input: $input) { id state }
}
"""
CORDON = """
mutation DemoCordon($id: ID!, $reason: String!) {
  cordonNode(id: $id, reason: $reason) { id state }
}
"""
HEARTBEAT = """
mutation DemoHeartbeat($nodeId: ID!) {
  heartbeat(nodeId: $nodeId) { id state }
}
"""


@dataclass(frozen=True)
class DemoWeights:
    path: str
    total_bytes: int
    state: str = "READY"
    # Bytes on disk; the whole copy unless still downloading.
    present_bytes: int | None = None

    def as_input(self) -> dict[str, Any]:
        present = self.total_bytes if self.present_bytes is None else self.present_bytes
        return {
            "path": self.path,
            "sizeBytes": present,
            "totalBytes": self.total_bytes,
            "state": self.state,
        }


LLAMA_70B = DemoWeights("/models/llama-3-70b", 141 * GB)
LLAMA_8B = DemoWeights("/models/llama-3-8b", 16 * GB)


@dataclass(frozen=True)
class DemoNode:
    id: str
    rack: str
    gpu: tuple[str, int]
    gpu_count: int
    fabric: str | None
    weights: tuple[DemoWeights, ...] = ()
    # GPU index -> XIDs it raised (reported once, at registration).
    xids: tuple[tuple[int, int], ...] = ()
    nvswitch: bool = True
    cordon: str | None = None
    memory_mb: int = 2_064_075
    disk_total: int = 30 * TB


NODES: tuple[DemoNode, ...] = (
    DemoNode(
        "hgx-01",
        "r1",
        H100,
        8,
        "ib-a",
        weights=(LLAMA_70B, LLAMA_8B),
    ),
    DemoNode("hgx-02", "r1", H100, 8, "ib-a", weights=(LLAMA_70B,)),
    DemoNode(
        "hgx-03",
        "r2",
        H100,
        8,
        "ib-b",
        # Still downloading: place prefers the READY copies, and
        # weightsReady: true refuses this one (WEIGHTS_NOT_READY).
        weights=(DemoWeights(LLAMA_70B.path, LLAMA_70B.total_bytes, "DOWNLOADING", 58 * GB),),
        xids=((5, 79),),
    ),
    DemoNode("hgx-04", "r2", H100, 8, "ib-b", cordon="PSU swap"),
    DemoNode(
        "l40s-01",
        "r3",
        L40S,
        4,
        None,
        weights=(LLAMA_8B,),
        nvswitch=False,
        memory_mb=515_626,
        disk_total=7 * TB,
    ),
)


def node_input(node: DemoNode) -> dict[str, Any]:
    """The registerNode input an agent on this node would send."""
    name, memory = node.gpu
    number = int(node.id.rsplit("-", 1)[1])
    rails = [f"mlx5_{i}" for i in range(node.gpu_count)] if node.fabric else []
    xids = dict(node.xids)
    gpus = []
    for index in range(node.gpu_count):
        gpu: dict[str, Any] = {
            "index": index,
            "name": name,
            "memoryMb": memory,
            "uuid": f"GPU-de{number:06d}-0000-4000-8000-{index:012d}",
            "pciBusId": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            "healthy": True,
            "healthReasons": [],
            "numaNode": 0 if index < node.gpu_count // 2 else 1,
            # One NVSwitch board: every GPU reaches every other; PCIe only: none.
            "nvlinkPeers": (
                [peer for peer in range(node.gpu_count) if peer != index] if node.nvswitch else []
            ),
            "nearHcas": [rails[index]] if rails else [],
        }
        if index in xids:
            gpu["xids"] = [xids[index]]
        gpus.append(gpu)
    weights_bytes = sum(w.as_input()["sizeBytes"] for w in node.weights)
    return {
        "id": node.id,
        "hostname": f"{node.id}.demo",
        "mgmtAddr": f"127.0.0.{10 + number}" if node.fabric else f"127.0.1.{number}",
        "labels": [{"key": "rack", "value": node.rack}, {"key": "zone", "value": "demo"}],
        "memoryTotalMb": node.memory_mb,
        "gpus": gpus,
        "fabrics": (
            [{"fabric": node.fabric, "hcas": rails, "rateGbps": 400}] if node.fabric else []
        ),
        "storage": [
            {
                "id": f"dev:259:{number}",
                "mountPoint": "/models",
                "fsType": "xfs",
                "shared": False,
                "freeBytes": node.disk_total - weights_bytes - 2 * TB,
                "totalBytes": node.disk_total,
                "directories": ["/models"],
            }
        ],
        "weights": [w.as_input() for w in node.weights],
        "agentVersion": "demo",
        "engineVersions": [{"key": "vllm", "value": "0.11.0"}],
        # Fixed: a new boot id would clear the XID's sticky reason, as a reboot does.
        "bootId": f"demo-boot-{node.id}",
    }


def register(client: Client, nodes: Sequence[DemoNode] = NODES) -> list[str]:
    """Register every node and set its cordon; one line per node for the operator."""
    lines = []
    for node in nodes:
        state = client.execute(REGISTER, {"input": node_input(node)})["registerNode"]["state"]
        if node.cordon is not None:
            cordoned = client.execute(CORDON, {"id": node.id, "reason": node.cordon})
            state = cordoned["cordonNode"]["state"]
        gpus = f"{node.gpu_count}x {node.gpu[0].removeprefix('NVIDIA ')}"
        marks = [f"GPU {index}: XID {xid}" for index, xid in node.xids]
        if node.cordon:
            marks.append(f"cordoned: {node.cordon}")
        where = node.fabric or "no InfiniBand"
        lines.append(
            f"{node.id:8} {state.lower():9} {gpus:25} {where:14} {'; '.join(marks) or '-'}"
        )
    return lines


def heartbeat(client: Client, nodes: Sequence[DemoNode] = NODES) -> None:
    for node in nodes:
        client.execute(HEARTBEAT, {"nodeId": node.id})


def keep_alive(
    client: Client,
    interval: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = print,
) -> None:
    """Heartbeat every node every `interval` seconds until interrupted.

    A failed round (service restarting, node removed by an operator) is said
    once and followed by a full registration, so a removed node comes back.
    """
    failing = False
    while True:
        sleep(interval)
        try:
            if failing:
                register(client)
            heartbeat(client)
        except CtlError as error:
            if not failing:
                say(f"llmgw-inventory demo: {error}; registering again at the next beat")
            failing = True
            continue
        if failing:
            say("llmgw-inventory demo: the service answers again; every node registered")
        failing = False


def run(args: argparse.Namespace, settings: object = None) -> int:
    # httpx logs every request at INFO: a beat every few seconds would bury the summary.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    client = connect(args)
    try:
        lines = register(client)
    except CtlError as error:
        print(f"llmgw-inventory demo: {error}", file=sys.stderr)
        client.close()
        return 1
    print(f"registered the demo cluster at {client.url}:")
    for line in lines:
        print(f"  {line}")
    if args.once:
        print(
            "registered once: without heartbeats the nodes turn UNREACHABLE after "
            "INVENTORY_UNREACHABLE_AFTER seconds (30 by default); run without --once to keep them"
        )
        client.close()
        return 0
    print(f"heartbeating every {args.interval:g} s; Ctrl-C stops (the nodes then age out)")
    try:
        keep_alive(client, args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def add_parser(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="register a small demo cluster through the API and keep it alive",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    demo.add_argument("--once", action="store_true", help="register, then exit (no heartbeats)")
    demo.add_argument(
        "--interval",
        type=_seconds,
        default=10.0,
        help="seconds between heartbeats (default 10; keep it under INVENTORY_UNREACHABLE_AFTER)",
    )
    add_connection_options(demo, default=None)
    demo.set_defaults(run=run)
