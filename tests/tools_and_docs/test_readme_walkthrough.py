"""The README's walkthrough, run top to bottom on a fresh database, as a newcomer would.

Every ```sh line runs in a shell (against the test's service: its address
replaces http://127.0.0.1:8080, and INVENTORY_URL names it), every ```graphql
block is posted to the service, and each must succeed. A ```text block right
after a step is the output the README shows for it, and must be what the step
printed (ages aside). A block that cannot run here says so on the line before
it (`<!-- walkthrough: not run (why) -->`); there is exactly one: the two
commands, `serve` (which runs until stopped; the test starts the service
itself) and `test` (this suite).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.dev_venv import needs_dev_venv
from tests.support.readme import Block, blocks

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
SHOWN_URL = "http://127.0.0.1:8080"


def commands(block: Block) -> list[str]:
    """The block's command lines, without comments."""
    lines = (re.sub(r"\s+#\s.*$", "", line).strip() for line in block.body.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_the_readme_is_at_most_300_lines_and_marks_one_block_not_run() -> None:
    assert len(README.splitlines()) <= 300
    skipped = [b for b in blocks(README) if b.not_run]
    assert [commands(b) for b in skipped] == [["python3 dev.py serve", "python3 dev.py test"]]


def test_the_walkthrough_covers_what_a_newcomer_needs() -> None:
    runs = [b for b in blocks(README) if not b.not_run]
    shell = [line for b in runs if b.lang == "sh" for line in commands(b)]
    graphql = [b.body for b in runs if b.lang == "graphql"]
    assert "python3 dev.py demo" in shell and "python3 dev.py ctl nodes" in shell
    assert any(line.startswith("curl ") for line in shell)
    for operation in ("freeGpus(", "explainPlacement(", "place(", "releaseReplica("):
        assert any(operation in document for document in graphql), operation


def _normalized(text: str) -> list[str]:
    """Lines with runs of spaces as one, and ages ('3s ago') as one age."""
    return [
        re.sub(r"\d+s ago", "Ns ago", " ".join(line.split()))
        for line in text.strip().splitlines()
        if line.strip()
    ]


def _shown(step: str, printed: Any) -> list[str] | Any:
    """What a step printed, in the form the README's text block shows it."""
    if isinstance(printed, dict) and "explainPlacement" in printed:
        return [
            f"{v['nodeId']} {v['code']} {v['detail']}"
            for v in printed["explainPlacement"]["verdicts"]
        ]
    if step.startswith("curl "):
        return json.loads(printed)
    return _normalized(printed)


@needs_dev_venv
@pytest.mark.skipif(shutil.which("curl") is None, reason="the README's curl example needs curl")
def test_the_readme_walkthrough_runs_on_a_fresh_database(live_service: Any) -> None:
    base = live_service.url.removesuffix("/graphql")
    env = {**os.environ, "INVENTORY_URL": live_service.url}
    env.pop("INVENTORY_TOKEN", None)
    last: tuple[str, Any] | None = None
    ran: list[str] = []
    for block in blocks(README):
        if block.not_run:
            continue
        if block.lang == "sh":
            for line in commands(block):
                command = line.replace(SHOWN_URL, base)
                if command == "python3 dev.py demo":
                    # It heartbeats until Ctrl-C; the test needs it registered, then back.
                    command += " --once"
                done = subprocess.run(
                    ["bash", "-c", command], cwd=REPO, env=env, capture_output=True,
                    text=True, timeout=120,
                )  # fmt: skip
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                last = (line, done.stdout)
                ran.append(line)
        elif block.lang == "graphql":
            body = httpx.post(live_service.url, json={"query": block.body}, timeout=30).json()
            assert not body.get("errors"), f"{block.body}\n{body}"
            data = body["data"]
            if "place" in data:
                assert data["place"]["__typename"] == "Allocated", data
                nodes = sorted(a["nodeId"] for a in data["place"]["allocations"])
                assert nodes == ["hgx-01", "hgx-02"], data
            if "releaseReplica" in data:
                assert data["releaseReplica"] == 16, data
            last = (block.body, data)
            ran.append(block.body.split("(")[0].split("{")[-1].strip() or block.body)
        elif block.lang == "text" and last is not None:
            step, printed = last
            expected = (
                json.loads(block.body) if step.startswith("curl ") else _normalized(block.body)
            )
            assert _shown(step, printed) == expected, f"{step}: README shows\n{block.body}"
            last = None
    # The walkthrough really went through its steps, in order.
    assert ran[0] == "python3 dev.py demo" and ran[1] == "python3 dev.py ctl nodes"
    assert ran[-1].startswith("curl ")
