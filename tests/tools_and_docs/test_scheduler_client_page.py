"""docs/scheduler/client.md's scheduler loop runs as shown, on the demo cluster.

The page's first ```python block is the loop; the ```text block after it is
what it prints. The test registers the demo cluster on a `serve` process,
runs the loop as a scheduler would (its own process, INVENTORY_URL set) and
compares.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service import demo_cluster
from service.ctl.client import Client
from tests.support.live_service import LiveService
from tests.support.readme import blocks

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "scheduler" / "client.md"


def loop_and_output() -> tuple[str, str]:
    found = blocks(PAGE.read_text())
    first = next(i for i, b in enumerate(found) if b.lang == "python")
    loop, printed = found[first], found[first + 1]
    assert printed.lang == "text", "the loop's output follows it in a ```text block"
    return loop.body, printed.body


def test_the_loop_reads_places_handles_every_answer_and_releases() -> None:
    loop, _ = loop_and_output()
    for step in ("free_gpus(", "place(", "release_replica("):
        assert step in loop, step
    for member in ("Allocated", "Unplaceable", "AllocationRejected"):
        assert f"case {member}(" in loop, member
    body = loop[loop.index("async def main") : loop.index("asyncio.run")]
    assert len(body.strip().splitlines()) <= 30


def test_the_pages_loop_prints_what_the_page_shows(
    live_service: LiveService, tmp_path: Path
) -> None:
    loop, shown = loop_and_output()
    operator = Client(live_service.url)
    try:
        demo_cluster.register(operator)
    finally:
        operator.close()
    script = tmp_path / "scheduler.py"
    script.write_text(loop + "\n")
    env = {**os.environ, "INVENTORY_URL": live_service.url}
    env.pop("INVENTORY_TOKEN", None)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # On a difference, what it printed, whole: the page's block to compare with.
    assert done.stdout.strip().splitlines() == shown.strip().splitlines(), done.stdout
