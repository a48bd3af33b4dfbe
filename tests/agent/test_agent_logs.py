"""The agent's log: a heartbeat's HTTP request line is DEBUG, not one INFO line every few seconds."""

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_inventory_service import FakeService
from fake_root import make_node
from test_agent_cli import config_file, fake_host

from agent.cli import main


@pytest.fixture
def httpx_logger() -> Iterator[None]:
    yield
    logging.getLogger("httpx").setLevel(logging.NOTSET)  # main() set it for its process


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
def test_httpx_request_lines_show_only_at_debug(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, httpx_logger: None, level: str, shown: bool
) -> None:
    node = make_node(tmp_path / "node")
    caplog.set_level(logging.DEBUG)
    service = FakeService()
    argv = ["--config", config_file(tmp_path, node), "--once", "--log-level", level]
    assert main(argv, env={}, host=fake_host(node), transport=service.transport()) == 0
    lines = [r for r in caplog.records if r.name == "httpx" and "HTTP Request" in r.getMessage()]
    assert bool(lines) is shown
