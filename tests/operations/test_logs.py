"""With INVENTORY_LOG_FORMAT=json every line a service writes is one JSON object, and a request's lines carry its id."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support import REPO
from tests.support.live_service import free_port

pytestmark = pytest.mark.process


def test_a_json_logging_service_writes_only_json_with_request_ids(
    database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "INVENTORY_LOG_FORMAT": "json",
        "INVENTORY_LOG_LEVEL": "debug",
    }
    # A file, not a pipe: nobody reads a pipe while the service starts, and
    # debug logging can fill its 64 KiB, blocking the service mid-start.
    log_path = tmp_path / "service.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
            env=env,
            cwd=REPO,
            stderr=log,
            text=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        # Generous: a loaded 2-core CI machine starts the service slowly.
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "the service exited"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.1)
        response = httpx.post(
            f"{base}/graphql",
            json={"query": "{ nodes { id } }"},
            headers={"X-Request-Id": "probe-7"},
            timeout=60,  # the first query warms the schema and the pools
        )
        assert response.headers["x-request-id"] == "probe-7"
    finally:
        process.terminate()
        process.wait(timeout=60)
    stderr = log_path.read_text()

    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert lines, "the service logged nothing"
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    probe = [line for line in lines if line.get("request_id") == "probe-7"]
    assert probe and probe[0]["logger"] == "service.access"
    assert probe[0]["status"] == 200
