"""`llmgw-inventory ctl`: the operator's view of a running service, and one clear line when it fails."""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest

from tests.support.ctl import ctl, register
from tests.support.live_service import LiveService, free_port
from tests.support.reports import ALLOCATE, GB, REGISTER, TB, allocation, node_input, shard
from tests.support.topology import hgx_h100

DISK = [
    {"id": "dev:259:1", "mountPoint": "/data", "fsType": "xfs", "shared": False,
     "freeBytes": 1200 * GB, "totalBytes": 3 * TB, "directories": ["/data/models"]},
]  # fmt: skip
IB_A = [{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}]


class Follower:
    """`ctl events --follow` in its own process, its lines read as they come."""

    def __init__(self, url: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "ctl", "--url", url, "events", "--follow", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    # A wait for a line, not a speed bound: across a service restart on a
    # loaded 2-core CI machine (interpreter start-up, the follower's resume
    # back-off of up to 5 s) ten seconds proved too short.
    def until(self, text: str, within: float = 60) -> list[str]:
        seen: list[str] = []
        deadline = time.monotonic() + within
        while not any(text in line for line in seen):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no line with {text!r}; saw {seen}"
            with contextlib.suppress(queue.Empty):
                seen.append(self.lines.get(timeout=remaining))
        return seen

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def test_an_operator_cordons_one_gpu_and_clears_another_after_a_reset(
    live_service: LiveService, capsys: pytest.CaptureFixture[str]
) -> None:
    report = node_input("gpu-01")
    # XID 48 (double-bit ECC): RESET_GPU, which an operator's reset carries out.
    report["gpus"][2]["xids"] = [48]
    register(live_service, report)
    url = ("--url", live_service.url)

    code, out, _ = ctl(capsys, *url, "gpus", "cordon", "gpu-01", "5", "--reason", "ECC bursts")
    assert (code, out.strip()) == (
        0,
        "GPU 5 on node gpu-01 cordoned: now healthy; cordoned (ECC bursts)",
    )
    code, out, _ = ctl(capsys, *url, "nodes")
    assert "H100-80GB 6/8" in out and "2:xid_48 5:cordoned" in out
    code, out, _ = ctl(capsys, *url, "node", "gpu-01")
    (gpu_2,) = [line for line in out.splitlines() if line.startswith("2 ")]
    assert gpu_2.split()[2:4] == ["xid_48", "xid_48"]
    (gpu_5,) = [line for line in out.splitlines() if line.startswith("5 ")]
    assert "ECC bursts" in gpu_5

    code, out, _ = ctl(capsys, *url, "gpus", "clear-health", "gpu-01", "2")
    assert (code, out.strip()) == (0, "GPU 2 on node gpu-01 cleared: now healthy")
    code, out, _ = ctl(capsys, *url, "gpus", "uncordon", "gpu-01", "5")
    assert (code, out.strip()) == (0, "GPU 5 on node gpu-01 uncordoned: now healthy")
    # GPU 2's XID taint stays until the validation its remediation waits for passes.
    code, out, _ = ctl(capsys, *url, "nodes")
    assert "H100-80GB 7/8" in out and "cordoned" not in out
    passed = {"nodeId": "gpu-01", "gpuIndices": [2], "test": "dcgm_diag", "passed": True}
    answer = httpx.post(
        live_service.url,
        json={
            "query": "mutation V($v: ValidationInput!) { recordValidation(input: $v) { state } }",
            "variables": {"v": passed},
        },
    ).json()
    assert answer["data"]["recordValidation"] == {"state": "DONE"}
    code, out, _ = ctl(capsys, *url, "nodes")
    assert "H100-80GB 8/8" in out

    code, out, err = ctl(capsys, *url, "gpus", "cordon", "gpu-01", "9", "--reason", "x")
    assert code != 0 and "has no GPU 9" in err
    code, out, _ = ctl(capsys, *url, "gpus")
    assert out.splitlines()[1].split() == ["H100-80GB", "8", "8", "0", "0", "0"]


def test_the_nodes_table_shows_a_dash_where_disk_is_unknown(
    live_service: LiveService, capsys: pytest.CaptureFixture[str]
) -> None:
    register(live_service, node_input("gpu-01", storage=DISK, fabrics=IB_A, gpus=hgx_h100(False)))
    # An agent too old to report storage: its disk is unknown, not full.
    register(live_service, node_input("gpu-02"))
    url = ("--url", live_service.url)
    follower = Follower(live_service.url, "--node", "gpu-02")
    # Its history printed: what it prints from now on came through the live stream
    # (a follower still starting when the service restarts below has never
    # connected, and rightly gives up).
    followed = follower.until("registered")

    code, out, _ = ctl(capsys, *url, "nodes")
    assert code == 0
    header, first, second = out.strip().splitlines()
    assert header.split() == [
        "NODE",
        "STATE",
        "GPUS",
        "FREE/TOTAL",
        "GPUS",
        "MARKED",
        "FABRICS",
        "LOCAL",
        "DISK",
        "LAST",
        "SEEN",
        "INCARNATION",
        "NVLINK",
    ]
    # The node's NVLink groups and the widest shard it can take; unknown says so.
    assert first.endswith("NVLink 8, largest free 8")
    assert second.endswith("unknown")
    assert first.startswith("gpu-01") and "1.2 TB / 3.0 TB" in first and "ib-a" in first
    assert "H100-80GB 8/8" in first and "s ago" in first
    assert second.startswith("gpu-02")
    disk_column = header.index("LOCAL DISK")
    assert second[disk_column:].split()[0] == "-"
    assert "0 B" not in second

    code, out, _ = ctl(capsys, *url, "nodes", "--output", "json")
    nodes = {n["id"]: n for n in json.loads(out)}
    assert nodes["gpu-02"]["localDisk"] is None
    assert nodes["gpu-01"]["localDisk"] == {"freeBytes": 1200 * GB, "totalBytes": 3 * TB}

    code, out, _ = ctl(capsys, *url, "cordon", "gpu-02", "--reason", "PSU swap")
    assert (code, out.strip()) == (0, "node gpu-02 cordoned: now cordoned (PSU swap)")
    code, out, _ = ctl(capsys, *url, "nodes")
    assert "cordoned (PSU swap)" in out

    code, out, _ = ctl(capsys, *url, "node", "gpu-02")
    assert code == 0
    assert "local disk:  -" in out and "storage: not reported" in out
    assert "cordoned (PSU swap)" in out

    code, out, _ = ctl(capsys, *url, "gpus")
    assert out.splitlines()[1].split() == ["H100-80GB", "16", "8", "0", "0", "8"]

    code, out, _ = ctl(capsys, *url, "uncordon", "gpu-02")
    assert out.strip() == "node gpu-02 uncordoned: now ready"
    code, out, _ = ctl(capsys, *url, "allocations")
    assert out.strip() == "no allocations"

    code, out, _ = ctl(capsys, *url, "events", "--node", "gpu-02")
    kinds = [line.split()[2] for line in out.strip().splitlines()[1:]]
    assert kinds == ["registered", "cordoned", "uncordoned"]

    code, out, _ = ctl(capsys, *url, "remove", "gpu-02")
    assert code == 0
    code, out, _ = ctl(capsys, *url, "nodes")
    assert "gpu-02" not in out

    # The follower printed the history, then each change as it was made;
    # a restart of the service (a rolling deploy) is a pause, not an exit.
    try:
        followed += follower.until("removed")
        live_service.restart()
        register(live_service, node_input("gpu-02"))
        followed += follower.until("registered")
    finally:
        follower.stop()
    assert [line.split()[2] for line in followed[1:]] == [
        "registered",
        "cordoned",
        "uncordoned",
        "removed",
        "registered",
    ]
    # The live rows sit in the header's columns, as the history's rows do.
    header = followed[0]
    assert header.split() == ["TIME", "KIND", "NODE", "REPLICA", "SHARD", "BY", "REASON"]
    for column in ("KIND", "NODE", "REPLICA", "SHARD", "BY"):
        start = header.index(column)
        for line in followed[1:]:
            assert line[start - 2 : start] == "  " and line[start] != " ", (column, line)
    assert follower.process.stderr is not None
    complaints = follower.process.stderr.read().splitlines()
    assert complaints and all("resuming" in line for line in complaints)


OPERATOR_TOKEN = "ctl-test-operator-token-0123456789abcdef"


def test_failures_are_one_line_and_a_non_zero_exit(
    live_service_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    live_service = live_service_factory({"INVENTORY_BOOTSTRAP_TOKEN": OPERATOR_TOKEN})
    down = f"http://127.0.0.1:{free_port()}/graphql"
    code, out, err = ctl(capsys, "--url", down, "nodes")
    assert code == 1 and out == ""
    assert err.strip() == err.strip().splitlines()[0]
    assert f"cannot reach the service at {down}" in err

    url = ("--url", live_service.url, "--token", OPERATOR_TOKEN)
    code, _, err = ctl(capsys, *url, "cordon", "nope", "--reason", "x")
    assert code == 1
    assert err.strip() == "llmgw-inventory ctl: node 'nope' is not registered"
    code, _, err = ctl(capsys, *url, "node", "nope")
    assert (code, err.strip()) == (1, "llmgw-inventory ctl: node 'nope' is not registered")
    code, _, err = ctl(capsys, *url, "remove", "nope")
    assert code == 1

    code, out, err = ctl(capsys, "--url", live_service.url, "--token", "not-a-token", "nodes")
    assert (code, out) == (1, "")
    assert err.strip() == (
        "llmgw-inventory ctl: the service refused the request: the token is unknown or revoked"
        " (pass --token or set INVENTORY_TOKEN)"
    )
    code, _, err = ctl(capsys, "--url", live_service.url, "nodes")
    assert code == 1 and len(err.strip().splitlines()) == 1
    # Said to a CLI user: the flag and the variable, not GraphiQL's Headers pane.
    assert "requires a token and none was sent: pass --token TOKEN or set INVENTORY_TOKEN" in err
    assert "Headers" not in err
    assert ctl(capsys, *url, "nodes")[0] == 0

    # The service's address without its endpoint: the dashboard's route says 405.
    base = live_service.url.removesuffix("/graphql")
    code, _, err = ctl(capsys, "--url", base, "--token", OPERATOR_TOKEN, "nodes")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.strip().endswith(
        f"answered HTTP 405 without GraphQL (the GraphQL endpoint is /graphql: --url {base}/graphql)"
    )

    # Following needs the token too, on the websocket.
    code, _, err = ctl(
        capsys, "--url", live_service.url, "--token", "not-a-token", "events", "--follow"
    )
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "token" in err
    code, _, err = ctl(capsys, "--url", live_service.url, "events", "--follow")
    assert code == 1 and "requires a token and none was sent" in err


def test_ctl_options_go_before_or_after_the_command_and_events_show_the_shard(
    live_service_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    service = live_service_factory({"INVENTORY_BOOTSTRAP_TOKEN": OPERATOR_TOKEN})
    register_as = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    for query, variables in (
        (REGISTER, {"input": node_input("gpu-01")}),
        (ALLOCATE, allocation("llama-r1", shard("llama-r1-s0", "gpu-01", 0, 1))),
    ):
        reply = httpx.post(service.url, json={"query": query, "variables": variables},
                           headers=register_as)  # fmt: skip
        assert not reply.json().get("errors"), reply.text

    # After the command, after a nested command, and split around it.
    for argv in (
        ["events", "--url", service.url, "--token", OPERATOR_TOKEN],
        ["--url", service.url, "events", "--token", OPERATOR_TOKEN],
        ["tokens", "list", "--token", OPERATOR_TOKEN, "--url", service.url],
    ):
        code, out, err = ctl(capsys, *argv)
        assert code == 0, (argv, err)
    code, out, _ = ctl(capsys, "events", "--kind", "allocated", "--url", service.url,
                       "--token", OPERATOR_TOKEN)  # fmt: skip
    header, row = out.strip().splitlines()
    shard_column = header.index("SHARD")
    assert row[shard_column:].split()[0] == "llama-r1-s0"
    assert row[header.index("REPLICA") :].split()[0] == "llama-r1"
