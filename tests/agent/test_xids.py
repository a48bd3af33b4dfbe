"""XIDs: heard from (fake) NVML in their own thread, sent at once, never lost to an outage."""

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from fake_inventory_service import FakeService
from fake_nvml import FakeNvml, NVMLError_DriverNotLoaded, NVMLError_NotSupported, h100
from test_agent_loop import CONFIG, FakeTime, Node, ScenarioOver, node_report

from agent.client import InventoryClient
from agent.discovery.gpu_file import GpuFileError, parse_gpus, read_gpu_file
from agent.discovery.xids import XidInbox, XidListener, with_xids
from agent.loop import Agent, run_until_stopped

# Short waits on the event set, so a stopped listener ends at once.
WAIT_MS = 20
PATIENCE = 10


def listen(nvml: FakeNvml, inbox: XidInbox) -> tuple[XidListener, list[str]]:
    warnings: list[str] = []
    listener = XidListener(nvml, inbox, wait_ms=WAIT_MS, warn=warnings.append)
    listener.start()
    assert listener.ready.wait(PATIENCE)
    return listener, warnings


def wait_for(inbox: XidInbox) -> dict[int, list[int]]:
    for _ in range(PATIENCE * 100):
        if inbox.waiting():
            return inbox.take()
        threading.Event().wait(0.01)
    pytest.fail("no XID arrived")


def test_the_listener_hears_critical_xids_on_every_gpu_that_reports_them() -> None:
    nvml = FakeNvml([h100(0), h100(1, events_error=NVMLError_NotSupported()), h100(2)])
    inbox = XidInbox()
    listener, warnings = listen(nvml, inbox)
    try:
        assert listener.listening == (0, 2)
        assert warnings == ["GPU 1: XIDs are not heard (NVMLError_NotSupported: NotSupported)"]
        nvml.raise_xid(2, 79)
        assert wait_for(inbox) == {2: [79]}
        nvml.raise_xid(0, 48)
        nvml.raise_xid(0, 63)
        heard = wait_for(inbox)
        while heard.get(0, []) != [48, 63]:
            heard = {0: heard.get(0, []) + wait_for(inbox)[0]}
        assert heard == {0: [48, 63]}
    finally:
        listener.stop(timeout=PATIENCE)
    assert nvml.event_sets == [[]], "the event set was freed"
    assert nvml.shut_down


def test_no_driver_means_no_listener_and_a_warning() -> None:
    nvml = FakeNvml([], init_error=NVMLError_DriverNotLoaded())
    listener, warnings = listen(nvml, XidInbox())
    listener.stop(timeout=PATIENCE)
    assert warnings == [
        "XIDs are not heard: NVML did not start (NVMLError_DriverNotLoaded: DriverNotLoaded)"
    ]


def test_xids_ride_on_their_gpus_in_the_report(caplog: pytest.LogCaptureFixture) -> None:
    sent = with_xids(node_report().node_input, {1: [79, 13], 5: [79]})
    assert [g.get("xids") for g in sent["gpus"]] == [None, [79, 13]]
    assert "XIDs [79] on GPU 5, which this report does not list" in caplog.text


async def test_an_xid_is_reported_at_once_not_at_the_next_interval() -> None:
    service = FakeService()
    client = InventoryClient(
        "http://inventory.test/graphql", None, 5, transport=service.transport()
    )
    node = Node()
    inbox = XidInbox()
    nvml = FakeNvml([h100(0), h100(1)])
    listener, _ = listen(nvml, inbox)
    slept = asyncio.Event()

    async def long_sleep(seconds: float) -> None:
        # Every interval lasts for ever: only an XID can wake the loop.
        slept.set()
        await asyncio.Event().wait()

    agent = Agent(CONFIG, client, node.survey, sleep=long_sleep, xids=inbox)
    stop = asyncio.Event()
    running = asyncio.ensure_future(run_until_stopped(agent.run(), stop))
    try:
        await asyncio.wait_for(slept.wait(), PATIENCE)
        assert service.kinds() == ["register"]
        nvml.raise_xid(1, 79)
        for _ in range(PATIENCE * 100):
            if service.kinds() == ["register", "register"]:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail(f"no report after the XID: {service.kinds()}")
        assert [g.get("xids") for g in service.nodes["gpu-07"]["gpus"]] == [None, [79]]
        assert not inbox.waiting()
    finally:
        stop.set()
        await asyncio.wait_for(running, PATIENCE)
        listener.stop(timeout=PATIENCE)
        await client.aclose()


async def test_xids_wait_out_an_outage_and_are_sent_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="llmgw.agent")
    time = FakeTime(until=700)
    service = FakeService(clock=time)
    sent_xids: list[tuple[float, Any]] = []
    inbox = XidInbox()
    inbox.put(1, 79)
    service.down = True
    time.at(25, lambda: setattr(service, "down", False))
    handle = service.handle

    async def record(request: Any) -> Any:
        response = await handle(request)
        if not service.down and b"registerNode" in request.content:
            gpus = service.nodes["gpu-07"]["gpus"]
            sent_xids.append((time.now, [g.get("xids") for g in gpus]))
        return response

    service.handle = record  # type: ignore[method-assign]
    client = InventoryClient(
        "http://inventory.test/graphql", None, 5, transport=service.transport()
    )
    agent = Agent(
        CONFIG, client, Node().survey, sleep=time.sleep, clock=time, rand=lambda: 1.0, xids=inbox
    )
    with pytest.raises(ScenarioOver):
        await agent.run()
    await client.aclose()

    # Down until 25: the first report that got through carried the XID, the
    # full reports after it (every 300 s) did not.
    assert [at for at, _ in sent_xids] == [31, 331, 631]
    assert [xids for _, xids in sent_xids] == [[None, [79]], [None, None], [None, None]]


def test_a_gpu_file_may_list_xids(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(
        '[{"index": 0, "name": "NVIDIA H100 80GB HBM3", "xids": [79, 13]},'
        ' {"index": 1, "name": "NVIDIA H100 80GB HBM3", "xids": []}]'
    )
    listed = read_gpu_file(str(path))
    assert listed.xids == {0: (79, 13)}
    assert [g.healthy for g in listed.gpus] == [True, True]


@pytest.mark.parametrize(
    ("xids", "where"),
    [("[0]", "[0].xids[0] = 0"), ("[79, -1]", "[0].xids[1] = -1"), ('"79"', "[0].xids = '79'")],
)
def test_a_gpu_file_with_a_bad_xid_is_refused(xids: str, where: str) -> None:
    with pytest.raises(GpuFileError, match=r"^" + where.replace("[", r"\[").replace("]", r"\]")):
        parse_gpus(f'[{{"index": 0, "name": "NVIDIA H100 80GB HBM3", "xids": {xids}}}]')
