"""The agent's real loop against the real service, in its own process, over HTTP.

Only the hardware is faked (there is no GPU here): a fake pynvml, a fake node
root and its disks. Everything between the agent's discovery and the
service's database is the code that ships.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_nvml import FakeNvml, h100
from fake_root import GIB, TIB, FakeDisks, add_model, add_process, make_node

from agent.client import InventoryClient
from agent.config import AgentConfig, FabricConfig
from agent.discovery.weights import WeightsScanner
from agent.discovery.xids import XidInbox, XidListener
from agent.loop import Agent, run_until_stopped
from agent.report import Host, build_report
from tests.support.dcgmi import Dcgmi
from tests.support.waiting import until

ENGINE_PID, FOREIGN_PID = 4100, 5200

NODE_QUERY = """
query Node($id: ID!) {
  node(id: $id) {
    id hostname mgmtAddr state memoryTotalMb agentVersion knowsItsWeights
    labels { key value }
    gpus { index uuid name gpuClass memoryMb healthy healthReasons }
    fabrics { fabric hcas rateGbps }
    storage { id mountPoint fsType shared freeBytes totalBytes directories }
    localDisk { freeBytes totalBytes }
    sharedDisk { freeBytes totalBytes }
    weights { path sizeBytes }
  }
}
"""


# Generous: waiting for a condition, not measuring how fast it comes.
PATIENCE = 30


async def eventually(
    url: str, check: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """The node as the service shows it, once `check` holds; fails after a generous wait."""
    node: dict[str, Any] | None = None
    variables = {"id": "gpu-07"}
    try:
        async with httpx.AsyncClient(timeout=5) as http, asyncio.timeout(PATIENCE):
            while True:
                try:
                    answer = await http.post(
                        url, json={"query": NODE_QUERY, "variables": variables}
                    )
                    node = answer.json()["data"]["node"]
                except (httpx.HTTPError, KeyError, TypeError, ValueError):
                    node = None  # the service is restarting
                if node is not None and check(node):
                    return node
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"never saw {what}; last seen: {node}")


@asynccontextmanager
async def agent_hearing_xids(
    url: str, root: Path, nvml: FakeNvml, **settings: Any
) -> AsyncIterator[None]:
    """The agent's loop for node gpu-07 on `root`, with its XID listener, running against
    the service at `url` until the block ends; `settings` (intervals, validations) go to its AgentConfig."""
    config = AgentConfig(
        node_id="gpu-07",
        hostname="gpu-07.dc1",
        mgmt_addr="10.0.0.7",
        service_url=url,
        root=str(root),
        **settings,
    )
    disks = FakeDisks(root)
    host = Host(nvml=nvml, statvfs=disks.statvfs, stat=disks.stat)
    scanner = WeightsScanner(config.root)
    client = InventoryClient(config.service_url, None, config.request_timeout)
    inbox = XidInbox()
    listener = XidListener(nvml, inbox, wait_ms=20, warn=logging.getLogger("test").warning)
    listener.start()
    agent = Agent(
        config,
        client,
        lambda: build_report(config, host, scanner),
        xids=inbox,
        resets=host.resets,
    )
    stop = asyncio.Event()
    running = asyncio.ensure_future(run_until_stopped(agent.run(), stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=10)
        listener.stop(timeout=10)
        await client.aclose()


PLACE_WITH_WEIGHTS = """
mutation {
  place(input: {replicaId: "chat", gpuClass: "H100-80GB", gpusPerShard: 2,
                weights: "/data/models/llama-8b"}) { __typename }
}
"""


async def scheduler(url: str, document: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5) as http:
        answer = (await http.post(url, json={"query": document})).json()
    assert not answer.get("errors"), answer
    data: dict[str, Any] = answer["data"]
    return data


async def pinned(agent: Agent, expected: dict[str, tuple[str, ...]]) -> None:
    """Wait until the agent's view of its pins is `expected`."""

    async def seen() -> bool:
        return agent.pinned == expected

    await until(seen, f"the agent to see the pins {expected}")


class OutageWatch(logging.Handler):
    """Sets an event when the agent logs that the service is failing, as an operator would see."""

    def __init__(self, seen: asyncio.Event) -> None:
        super().__init__(logging.WARNING)
        self.seen = seen

    def emit(self, record: logging.LogRecord) -> None:
        if "inventory service is failing" in record.getMessage():
            self.seen.set()


def healthy(node: dict[str, Any]) -> list[int]:
    return [g["index"] for g in node["gpus"] if g["healthy"]]


async def test_the_agent_keeps_the_services_view_of_its_node_true(
    live_service: Any, tmp_path: Path
) -> None:
    root = make_node(tmp_path / "node")
    add_model(root, "/data/models/llama-8b", {"config.json": 100, "model.safetensors": 16 * GIB})
    add_model(
        root, "/mnt/filer/models/qwen-72b", {"config.json": 100, "model.safetensors": 140 * GIB}
    )
    add_process(root, ENGINE_PID, "VLLM::Worker_TP", ["VLLM::Worker_TP0"])
    add_process(root, FOREIGN_PID, "python3", ["python3", "train.py"])
    nvml = FakeNvml([h100(i, processes=[ENGINE_PID]) for i in range(8)])
    nvml.gpus[3].ecc_uncorrected = 2
    nvml.gpus[5].processes = [ENGINE_PID, FOREIGN_PID]

    config = AgentConfig(
        node_id="gpu-07",
        hostname="gpu-07.dc1",
        mgmt_addr="10.0.0.7",
        service_url=live_service.url,
        labels={"zone": "z1"},
        model_dirs=("/data/models", "/mnt/filer/models"),
        fabrics=(FabricConfig("ib-a", ("mlx5_0", "mlx5_1")),),
        # Fast, so the story takes seconds; the schedule itself is tested with a fake clock.
        heartbeat_interval=0.05,
        scan_interval=0.1,
        full_report_interval=60,
        max_backoff=0.2,
        request_timeout=2,
        root=str(root),
    )
    disks = FakeDisks(root)
    host = Host(nvml=nvml, statvfs=disks.statvfs, stat=disks.stat)
    scanner = WeightsScanner(config.root)
    client = InventoryClient(config.service_url, None, config.request_timeout)
    agent = Agent(config, client, lambda: build_report(config, host, scanner))
    outage_logged = asyncio.Event()
    watch = OutageWatch(outage_logged)
    logging.getLogger("llmgw.agent").addHandler(watch)
    stop = asyncio.Event()
    running = asyncio.ensure_future(run_until_stopped(agent.run(), stop))
    try:
        # The node appears with its GPUs, filesystems and weights.
        node = await eventually(live_service.url, lambda n: True, "the node registered")
        assert (node["hostname"], node["mgmtAddr"], node["state"]) == (
            "gpu-07.dc1",
            "10.0.0.7",
            "READY",
        )
        assert node["labels"] == [{"key": "zone", "value": "z1"}]
        assert len(node["gpus"]) == 8 and healthy(node) == [0, 1, 2, 4, 6, 7]
        assert node["gpus"][3]["healthReasons"] == ["ecc_uncorrected"]
        assert node["gpus"][5]["healthReasons"] == ["foreign_process"]
        assert {(g["name"], g["memoryMb"], g["gpuClass"]) for g in node["gpus"]} == {
            ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB")
        }
        assert node["fabrics"] == [
            {"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}
        ]
        assert [(fs["mountPoint"], fs["fsType"], fs["shared"]) for fs in node["storage"]] == [
            ("/data", "xfs", False),
            ("/mnt/filer", "nfs4", True),
        ]
        # The filer's space is everyone's: it is kept out of the node's own disk.
        assert node["localDisk"] == {"freeBytes": 20 * TIB, "totalBytes": 28 * TIB}
        assert node["sharedDisk"] == {"freeBytes": 100 * TIB, "totalBytes": 500 * TIB}
        assert node["knowsItsWeights"] is True
        assert node["weights"] == [
            {"path": "/data/models/llama-8b", "sizeBytes": 16 * GIB + 100},
            {"path": "/mnt/filer/models/qwen-72b", "sizeBytes": 140 * GIB + 100},
        ]

        # A scheduler places a replica with the 8B weights: the node, which
        # sends no report meanwhile, learns the pin from its heartbeats'
        # answers, and that it is gone once the replica is released.
        placed = await scheduler(live_service.url, PLACE_WITH_WEIGHTS)
        assert placed == {"place": {"__typename": "Allocated"}}
        await pinned(agent, {"/data/models/llama-8b": ("chat",)})
        assert await scheduler(live_service.url, 'mutation { releaseReplica(replicaId: "chat") }')
        await pinned(agent, {})

        # A GPU faults and a model is downloaded: the changed report is re-sent.
        nvml.gpus[2].remapped_rows = (0, 1, 1, 0)
        add_model(
            root, "/data/models/mistral-7b", {"config.json": 1, "model.safetensors": 14 * GIB}
        )
        node = await eventually(
            live_service.url,
            lambda n: 2 not in healthy(n) and len(n["weights"]) == 3,
            "the fault and the new model",
        )
        assert node["gpus"][2]["healthReasons"] == ["row_remap_pending"]

        # The service goes down; while it is down the training job ends.
        await asyncio.to_thread(live_service.stop)
        await asyncio.wait_for(outage_logged.wait(), PATIENCE)
        nvml.gpus[5].processes = [ENGINE_PID]
        await asyncio.to_thread(live_service.start)

        # It comes back having lost nothing, and the agent catches up.
        node = await eventually(live_service.url, lambda n: 5 in healthy(n), "GPU 5 freed")
        assert healthy(node) == [0, 1, 4, 5, 6, 7]
        assert len(node["weights"]) == 3 and len(node["storage"]) == 2
        assert node["state"] == "READY"
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=10)
        await client.aclose()
        logging.getLogger("llmgw.agent").removeHandler(watch)


async def test_an_xid_reaches_the_service_within_seconds_and_stays(
    live_service: Any, tmp_path: Path
) -> None:
    root = make_node(tmp_path / "node")
    nvml = FakeNvml([h100(i) for i in range(4)])
    async with agent_hearing_xids(
        live_service.url,
        root,
        nvml,
        # Every interval longer than the test's patience: only the XID itself
        # can make the agent report it.
        heartbeat_interval=PATIENCE * 4,
        scan_interval=PATIENCE * 4,
        full_report_interval=PATIENCE * 8,
    ):
        await eventually(live_service.url, lambda n: len(n["gpus"]) == 4, "the node registered")
        nvml.raise_xid(2, 79)
        node = await eventually(live_service.url, lambda n: 2 not in healthy(n), "the XID")
        assert node["gpus"][2]["healthReasons"] == ["xid_79"]
        # NVML says the GPU is fine again; the service remembers until a reset.
        nvml.raise_xid(1, 13)
        async with httpx.AsyncClient(timeout=5) as http:
            events = """{ events(kinds: ["gpu_xid"]) { detail } }"""
            for _ in range(PATIENCE * 20):
                answer = (await http.post(live_service.url, json={"query": events})).json()
                if len(answer["data"]["events"]) == 2:
                    break
                await asyncio.sleep(0.05)
        assert [e["detail"]["xid"] for e in answer["data"]["events"]] == [79, 13]
        node = await eventually(live_service.url, lambda n: True, "the node")
        assert healthy(node) == [0, 1, 3]


REMEDIATIONS = "{ remediations { gpuIndices action state trigger } }"
GPU_1 = """
query { node(id: "gpu-07") {
  gpus { index healthy recoveryAction recommendedAction taints { key source } } freeGpus { index }
} }
"""


async def test_xid_154_takes_the_drivers_verdict_and_the_agent_validates_the_gpu_back(
    live_service: Any, tmp_path: Path, dcgmi: Dcgmi
) -> None:
    """XID 154 with the driver's recovery action NODE_REBOOT: a REBOOT_NODE remediation and
    a taint on that GPU; the node reboots, the agent runs the DCGM diagnostic the policy
    asks for (a fake dcgmi that passes), and the GPU takes work again."""
    root = make_node(tmp_path / "node")
    nvml = FakeNvml([h100(i) for i in range(4)])
    async with agent_hearing_xids(
        live_service.url,
        root,
        nvml,
        heartbeat_interval=0.05,
        scan_interval=0.1,
        # Full reports (after which the agent asks what to validate) often.
        full_report_interval=0.3,
        validations={"dcgm_diag": dcgmi("pass", log=tmp_path / "dcgmi.log")},
    ):
        await eventually(live_service.url, lambda n: len(n["gpus"]) == 4, "the node registered")
        # The driver decides GPU 1 needs a reboot, and says so with XID 154.
        nvml.gpus[1].recovery_action = 2
        nvml.raise_xid(1, 154)
        await eventually(live_service.url, lambda n: 1 not in healthy(n), "the XID 154")
        gpu = (await scheduler(live_service.url, GPU_1))["node"]["gpus"][1]
        assert gpu["recoveryAction"] == "NODE_REBOOT"
        assert gpu["recommendedAction"] == "REBOOT_NODE"
        assert gpu["taints"] == [{"key": "xid-154", "source": "XID"}]
        assert (await scheduler(live_service.url, REMEDIATIONS))["remediations"] == [
            {"gpuIndices": [1], "action": "REBOOT_NODE", "state": "PENDING", "trigger": "xid-154"}
        ]

        # The node reboots: a new boot id, and the driver has nothing left to ask.
        nvml.gpus[1].recovery_action = 0
        (root / "proc/sys/kernel/random/boot_id").write_text(
            "9e0c7d1a-4b2f-4f55-8d7e-1a2b3c4d5e6f\n"
        )
        await eventually(live_service.url, lambda n: 1 in healthy(n), "the GPU validated back")
        remediation = (await scheduler(live_service.url, REMEDIATIONS))["remediations"][0]
        assert remediation["state"] == "DONE"
        assert (tmp_path / "dcgmi.log").read_text().split("\n")[0] == "diag -r 3 -j -i 1"
        node = (await scheduler(live_service.url, GPU_1))["node"]
        assert node["gpus"][1]["taints"] == [] and {"index": 1} in node["freeGpus"]


async def test_a_gpu_reset_the_agent_sees_carries_out_the_reset_and_validates_the_gpu_back(
    live_service: Any, tmp_path: Path, dcgmi: Dcgmi
) -> None:
    """XID 154 with the driver's recovery action GPU_RESET: a RESET_GPU remediation; the GPU
    is reset (no reboot: the same boot id), which the agent sees in NVML (the driver no
    longer asks for a reset), the service carries the remediation out, the agent runs the
    DCGM diagnostic, and the GPU takes work again."""
    root = make_node(tmp_path / "node")
    nvml = FakeNvml([h100(i) for i in range(4)])
    async with agent_hearing_xids(
        live_service.url,
        root,
        nvml,
        heartbeat_interval=0.05,
        scan_interval=0.1,
        # Full reports (after which the agent asks what to validate) often.
        full_report_interval=0.3,
        validations={"dcgm_diag": dcgmi("pass", log=tmp_path / "dcgmi.log")},
    ):
        await eventually(live_service.url, lambda n: len(n["gpus"]) == 4, "the node registered")
        nvml.gpus[1].recovery_action = 1  # GPU_RESET
        nvml.raise_xid(1, 154)
        await eventually(live_service.url, lambda n: 1 not in healthy(n), "the XID 154")
        assert (await scheduler(live_service.url, REMEDIATIONS))["remediations"] == [
            {"gpuIndices": [1], "action": "RESET_GPU", "state": "PENDING", "trigger": "xid-154"}
        ]

        # nvidia-smi -r -i 1: the driver has nothing left to ask; the boot id stays.
        nvml.gpus[1].recovery_action = 0
        await eventually(live_service.url, lambda n: 1 in healthy(n), "the GPU validated back")
        remediation = (await scheduler(live_service.url, REMEDIATIONS))["remediations"][0]
        assert remediation["state"] == "DONE"
        events = '{ events(kinds: ["remediation_finished"]) { reason } }'
        [finished] = (await scheduler(live_service.url, events))["events"]
        assert finished["reason"] == (
            "GPU 1 was reset (the agent saw it: the driver's recovery action went from "
            "GPU_RESET to NONE)"
        )
        assert (tmp_path / "dcgmi.log").read_text().split("\n")[0] == "diag -r 3 -j -i 1"
        node = (await scheduler(live_service.url, GPU_1))["node"]
        assert node["gpus"][1]["taints"] == [] and {"index": 1} in node["freeGpus"]
