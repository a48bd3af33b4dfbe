"""GPU resets seen through NVML (fake pynvml), and sent to the service once, through outages."""

import logging
from pathlib import Path
from typing import Any

import pytest
from fake_inventory_service import FakeService
from fake_nvml import FakeNvml, NVMLError_Unknown, h100, t4
from fake_root import make_node
from test_agent_loop import CONFIG, FakeTime, ScenarioOver

from agent.client import InventoryClient
from agent.config import DEFAULT_ENGINE_PROCESSES
from agent.discovery.gpus import discover_gpus
from agent.discovery.resets import ResetWatch, with_resets
from agent.discovery.weights import WeightsScanner
from agent.loop import Agent
from agent.report import Host, build_report


def scan(nvml: FakeNvml, watch: ResetWatch, root: Path) -> None:
    gpus = discover_gpus(nvml, str(root), DEFAULT_ENGINE_PROCESSES, lambda _: None)
    watch.observe((g.uuid, g.reset_marks) for g in gpus if g.reset_marks is not None)


def test_what_a_reset_changes_in_nvml_is_seen_as_a_reset(tmp_path: Path) -> None:
    nvml = FakeNvml([h100(i) for i in range(6)] + [t4(6)])
    before = nvml.gpus
    before[0].ecc_uncorrected = 3  # an XID 95: uncorrected errors counted
    before[1].remapped_rows = (0, 1, 1, 0)  # a remap waits for the next reset
    before[2].recovery_action = 1  # GPU_RESET: the driver asks for a reset
    before[3].ecc_uncorrected = 1  # grows below: no reset
    before[4].recovery_action = 2  # NODE_REBOOT, then NONE: not a GPU reset
    before[6].retired_pending = 1  # a T4's page retirement waits for a reset
    watch = ResetWatch()
    scan(nvml, watch, tmp_path)
    # The first scan has nothing to compare with.
    assert not watch.waiting()

    before[0].ecc_uncorrected = 0
    before[1].remapped_rows = (0, 1, 0, 0)
    before[2].recovery_action = 0
    before[3].ecc_uncorrected = 4
    before[4].recovery_action = 0
    before[6].retired_pending = 0
    scan(nvml, watch, tmp_path)
    assert watch.take() == {
        "GPU-h100-0": "volatile uncorrected ECC count went from 3 to 0",
        "GPU-h100-1": "the pending row remap was applied",
        "GPU-h100-2": "the driver's recovery action went from GPU_RESET to NONE",
        "GPU-t4-6": "the pending page retirement was applied",
    }
    # Seen once: the next scan finds the same marks.
    scan(nvml, watch, tmp_path)
    assert not watch.waiting()


def test_a_reading_nvml_could_not_give_is_not_a_reset(tmp_path: Path) -> None:
    nvml = FakeNvml([h100(0, ecc_uncorrected=2, remapped_rows=(0, 0, 1, 0))])
    watch = ResetWatch()
    scan(nvml, watch, tmp_path)
    nvml.gpus[0].ecc_uncorrected = NVMLError_Unknown()
    nvml.gpus[0].remapped_rows = NVMLError_Unknown()
    scan(nvml, watch, tmp_path)
    assert not watch.waiting()
    # Readable again and unchanged: still nothing; then the reset itself.
    nvml.gpus[0].ecc_uncorrected = 2
    nvml.gpus[0].remapped_rows = (0, 0, 1, 0)
    scan(nvml, watch, tmp_path)
    assert not watch.waiting()
    nvml.gpus[0].ecc_uncorrected = 0
    scan(nvml, watch, tmp_path)
    assert watch.take() == {"GPU-h100-0": "volatile uncorrected ECC count went from 2 to 0"}


def test_a_reset_rides_on_its_gpu_by_uuid(caplog: pytest.LogCaptureFixture) -> None:
    node_input = {"gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]}
    sent = with_resets(node_input, {"GPU-b": "the pending row remap was applied", "GPU-z": "x"})
    assert [g.get("resetSeen") for g in sent["gpus"]] == [None, "the pending row remap was applied"]
    assert "GPU GPU-z was reset (x) but this report does not list it" in caplog.text


async def test_a_reset_waits_out_an_outage_and_is_sent_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="llmgw.agent")
    root = make_node(tmp_path)
    nvml = FakeNvml([h100(0), h100(1, ecc_uncorrected=5, recovery_action=1)])
    host = Host(nvml=nvml)
    config = CONFIG.__class__(**{**CONFIG.__dict__, "root": str(root)})
    time = FakeTime(until=700)
    service = FakeService(clock=time)

    def reset() -> None:
        # nvidia-smi -r on GPU 1, while the service is down.
        nvml.gpus[1].ecc_uncorrected = 0
        nvml.gpus[1].recovery_action = 0
        service.down = True

    time.at(40, reset)
    time.at(100, lambda: setattr(service, "down", False))
    sent: list[tuple[float, Any]] = []
    handle = service.handle

    async def record(request: Any) -> Any:
        response = await handle(request)
        if not service.down and b"registerNode" in request.content:
            gpus = service.nodes["gpu-07"]["gpus"]
            sent.append((time.now, [g.get("resetSeen") for g in gpus]))
        return response

    service.handle = record  # type: ignore[method-assign]
    client = InventoryClient(
        "http://inventory.test/graphql", None, 5, transport=service.transport()
    )
    scanner = WeightsScanner(str(root))
    agent = Agent(
        config,
        client,
        lambda: build_report(config, host, scanner),
        sleep=time.sleep,
        clock=time,
        rand=lambda: 1.0,
        resets=host.resets,
    )
    with pytest.raises(ScenarioOver):
        await agent.run()
    await client.aclose()

    seen = "volatile uncorrected ECC count went from 5 to 0; the driver's recovery action went from GPU_RESET to NONE"
    with_reset = [(at, resets) for at, resets in sent if resets != [None, None]]
    # The first report after the outage carries it, once.
    assert len(with_reset) == 1 and with_reset[0][0] >= 100
    assert with_reset[0][1] == [None, seen]
    assert not host.resets.waiting()


def test_resets_piling_up_in_an_outage_stay_within_what_the_service_takes(tmp_path: Path) -> None:
    nvml = FakeNvml([h100(0, ecc_uncorrected=1)])
    watch = ResetWatch()
    scan(nvml, watch, tmp_path)
    for _ in range(50):
        nvml.gpus[0].ecc_uncorrected = 0
        scan(nvml, watch, tmp_path)
        nvml.gpus[0].ecc_uncorrected = 1
        scan(nvml, watch, tmp_path)
    [seen] = watch.take().values()
    assert seen.startswith("volatile uncorrected ECC count went from 1 to 0; volatile")
    assert len(seen) <= 500 and seen.endswith("...")
