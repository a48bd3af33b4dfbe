"""`llmgw-inventory ctl` as an operator runs it, against a service."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from service.cli import build_parser
from service.config import Settings
from tests.support.live_service import LiveService
from tests.support.reports import REGISTER


def ctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `llmgw-inventory ctl ...` as an operator would; its exit code and what it printed."""
    args = build_parser().parse_args(["ctl", *argv])
    code: int = args.run(args, Settings())
    out, err = capsys.readouterr()
    return code, out, err


def register(service: LiveService, report: dict[str, Any]) -> None:
    response = httpx.post(service.url, json={"query": REGISTER, "variables": {"input": report}})
    assert not response.json().get("errors"), response.text
