"""`llmgw-agent` as an operator runs it: the dry run, --once, bad configuration, stopping."""

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from fake_inventory_service import FakeService
from fake_nvml import FakeNvml, h100
from fake_root import GIB, FakeDisks, add_model, make_node

from agent.cli import main
from agent.report import Host

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path: Path) -> Path:
    node = make_node(tmp_path / "node")
    add_model(node, "/data/models/llama-8b", {"config.json": 100, "model.safetensors": 16 * GIB})
    return node


def config_file(tmp_path: Path, node: Path, **extra: object) -> str:
    lines = [
        'service_url = "http://inventory.test/graphql"',
        'node_id = "gpu-07"',
        f'root = "{node}"',
        'model_dirs = ["/data/models", "/mnt/filer/models"]',
        *(f"{key} = {json.dumps(value)}" for key, value in extra.items()),
        "[labels]",
        'zone = "z1"',
        "[[fabrics]]",
        'name = "ib-a"',
        'hcas = ["mlx5_0", "mlx5_1"]',
    ]
    path = tmp_path / "agent.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def fake_host(node: Path) -> Host:
    disks = FakeDisks(node)
    return Host(nvml=FakeNvml([h100(i) for i in range(8)]), statvfs=disks.statvfs, stat=disks.stat)


def refuse_to_send(request: httpx.Request) -> httpx.Response:
    raise AssertionError("a dry run sent a request")


@pytest.mark.parametrize("flags", [["--once", "--dry-run"], ["--dry-run"]])
def test_the_dry_run_prints_the_registration_as_json_and_sends_nothing(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    argv = ["--config", config_file(tmp_path, node), *flags]
    code = main(argv, env={}, host=fake_host(node), transport=httpx.MockTransport(refuse_to_send))
    out, err = capsys.readouterr()

    assert code == 0
    sent = json.loads(out)
    assert (sent["id"], sent["labels"]) == ("gpu-07", [{"key": "zone", "value": "z1"}])
    assert [g["name"] for g in sent["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 8
    assert sent["fabrics"] == [{"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}]
    assert [fs["mountPoint"] for fs in sent["storage"]] == ["/data"]
    # When the agent saw them, by its clock in UTC: compared apart.
    assert all(w.pop("observedAt").endswith("+00:00") for w in sent["weights"])
    assert sent["weights"] == [{"path": "/data/models/llama-8b", "sizeBytes": 16 * GIB + 100}]
    # What it could not see goes to stderr, keeping stdout pure JSON.
    assert err.splitlines() == [
        "warning: model directory /mnt/filer/models does not exist (an unmounted filer?): skipped"
    ]


def test_the_dry_run_needs_no_token(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The packaged unit's token file, not there yet on a node being tried out.
    missing = str(tmp_path / "agent.token")
    argv = ["--config", config_file(tmp_path, node, token_file=missing), "--dry-run"]
    code = main(argv, env={}, host=fake_host(node), transport=httpx.MockTransport(refuse_to_send))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["id"] == "gpu-07"
    # Registering for real still needs it, and says so.
    code = main(["--config", config_file(tmp_path, node, token_file=missing), "--once"], env={})
    assert code == 2
    assert "cannot read the token file" in capsys.readouterr().err


def test_once_registers_the_node_and_exits(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service = FakeService()
    argv = ["--config", config_file(tmp_path, node), "--once"]
    assert main(argv, env={}, host=fake_host(node), transport=service.transport()) == 0
    assert service.kinds() == ["register"]
    assert len(service.nodes["gpu-07"]["gpus"]) == 8
    assert capsys.readouterr().out == "registered node gpu-07: READY\n"


def test_once_against_a_service_that_is_down_fails_with_the_reason(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service = FakeService()
    service.down = True
    argv = ["--config", config_file(tmp_path, node), "--once"]
    assert main(argv, env={}, host=fake_host(node), transport=service.transport()) == 1
    assert "registration failed: cannot reach http://inventory.test/graphql" in (
        capsys.readouterr().err
    )


def test_a_bad_configuration_stops_it_naming_the_key(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--config", config_file(tmp_path, node, heartbeat_interval=-5), "--dry-run"]
    assert main(argv, env={}, host=fake_host(node)) == 2
    assert "heartbeat_interval = -5" in capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.process
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_running_agent_logs_an_outage_once_and_stops_on_a_signal(
    tmp_path: Path, node: Path, signum: signal.Signals
) -> None:
    # The real process against a port nobody listens on, retrying fast.
    path = config_file(tmp_path, node, max_backoff=0.05)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LLMGW_AGENT_")},
        "LLMGW_AGENT_SERVICE_URL": f"http://127.0.0.1:{free_port()}/graphql",
        "PYTHONPATH": str(REPO),
    }
    agent = subprocess.Popen(
        [sys.executable, "-m", "agent", "--config", path, "--log-level", "debug"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    lines: queue.Queue[str] = queue.Queue()
    log: list[str] = []

    def read() -> None:
        assert agent.stderr is not None
        for line in agent.stderr:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        retries = 0
        while retries < 5:
            line = lines.get(timeout=60)
            log.append(line)
            retries += "still failing" in line
        agent.send_signal(signum)
        # Generous: the requirement is a second; a hang is what this catches.
        assert agent.wait(timeout=10) == 0
    finally:
        agent.kill()
        agent.wait()
    reader.join(timeout=10)  # the pipe closed with the process: this drains, not waits
    while not lines.empty():
        log.append(lines.get())

    assert sum("WARNING the inventory service is failing" in line for line in log) == 1, log
    assert log[-1] == "INFO llmgw-agent stopped\n"
