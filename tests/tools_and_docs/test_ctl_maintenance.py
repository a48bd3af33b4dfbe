"""`ctl maintenance schedule|list|cancel`: an operator books, reads and cancels a window."""

from __future__ import annotations

import argparse
import json
import time

import httpx
import pytest

from service.ctl.times import seconds
from tests.support.ctl import ctl, register
from tests.support.live_service import LiveService
from tests.support.reports import PLACE, node_input


def test_durations_read_as_an_operator_types_them() -> None:
    assert [seconds(v) for v in ("90", "90s", "15m", "2h", "1d")] == [90, 90, 900, 7200, 86400]
    with pytest.raises(argparse.ArgumentTypeError):
        seconds("two hours")


def test_an_operator_schedules_lists_and_cancels_a_window(
    live_service: LiveService, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(2):
        register(live_service, node_input(f"hgx-{i}"))
    url = ("--url", live_service.url)
    book = ("maintenance", "schedule", "rack-7", "--nodes", "hgx-0,hgx-1", "--start", "2h",
            "--end", "4h", "--drain-lead", "30m", "--reason", "rack 7 firmware 1.2")  # fmt: skip
    code, out, _ = ctl(capsys, *url, *book)
    assert code == 0, out
    assert out.splitlines()[0].split()[:3] == ["WINDOW", "STATE", "START"]
    row = out.splitlines()[1].split()
    assert row[:2] == ["rack-7", "SCHEDULED"] and "hgx-0,hgx-1" in row

    # A second window overlapping it on hgx-1: the service's one line, non-zero.
    code, _, err = ctl(capsys, *url, "maintenance", "schedule", "other", "--nodes", "hgx-1",
                       "--start", "3h", "--end", "5h", "--reason", "psu swap")  # fmt: skip
    assert code != 0 and "hgx-1" in err and "rack-7" in err, err

    code, out, _ = ctl(capsys, *url, "maintenance", "list", "--output", "json")
    assert code == 0
    assert [(w["id"], w["state"]) for w in json.loads(out)] == [("rack-7", "SCHEDULED")]

    code, out, _ = ctl(capsys, *url, "maintenance", "cancel", "rack-7")
    assert code == 0 and "CANCELLED" in out
    code, out, _ = ctl(capsys, *url, "maintenance", "list", "--state", "SCHEDULED")
    assert code == 0 and out.strip() == "no maintenance windows"


def test_stale_allocations_say_which_window_asks_them_to_move(
    live_service: LiveService, capsys: pytest.CaptureFixture[str]
) -> None:
    register(live_service, node_input("hgx-0"))
    shape = {"replicaId": "r", "gpuClass": "H100-80GB", "gpusPerShard": 8}
    body = httpx.post(live_service.url, json={"query": PLACE, "variables": {"input": shape}})
    assert body.json()["data"]["place"]["__typename"] == "Allocated", body.text
    url = ("--url", live_service.url)
    # Draining from now (the service's loop moves it within a second or so).
    code, out, _ = ctl(capsys, *url, "maintenance", "schedule", "psu", "--nodes", "hgx-0",
                       "--start", "1h", "--end", "2h", "--drain-lead", "2h",
                       "--reason", "psu swap")  # fmt: skip
    assert code == 0, out
    for _ in range(100):
        code, out, _ = ctl(capsys, *url, "allocations", "--stale")
        if "maintenance psu asks it to move" in out:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(out)
    assert code == 0 and "r-s0" in out
