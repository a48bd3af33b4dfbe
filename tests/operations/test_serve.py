"""`llmgw-inventory serve` on a machine with nothing but Python: embedded PostgreSQL, kept across restarts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.database.embedded import prune_dead_handles
from tests.conftest import REPO, free_port
from tests.reports import REGISTER, node_input


@pytest.fixture
def data_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="llmgw-serve-", dir="/tmp"))
    root.chmod(0o755)
    yield root / "pgdata"
    subprocess.run(["rm", "-rf", str(root)], check=False)


def postmaster_running(data_dir: Path) -> bool:
    pid_file = data_dir / "postmaster.pid"
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text().splitlines()[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def serving(data_dir: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port),
         "--data-dir", str(data_dir)],
        env=env,
        cwd=REPO,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, "serve exited during start-up"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.2)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def graphql(port: int, query: str, variables: dict[str, object] | None = None) -> dict[str, object]:
    response = httpx.post(
        f"http://127.0.0.1:{port}/graphql",
        json={"query": query, "variables": variables or {}},
        timeout=10,
    )
    body: dict[str, object] = response.json()
    return body


def test_serve_keeps_data_across_restarts_and_stops_its_database_on_sigterm(
    data_dir: Path,
) -> None:
    port = free_port()
    with serving(data_dir, port) as process:
        registered = graphql(port, REGISTER, {"input": node_input("gpu-07")})
        assert registered.get("errors") is None, registered
        assert postmaster_running(data_dir)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert not postmaster_running(data_dir), "SIGTERM left the embedded PostgreSQL running"

    with serving(data_dir, port) as process:
        answer = graphql(port, "{ nodes { id } }")
        assert answer == {"data": {"nodes": [{"id": "gpu-07"}]}}
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    assert not postmaster_running(data_dir), "Ctrl-C left the embedded PostgreSQL running"


def test_after_a_crash_the_next_serve_still_stops_its_database(data_dir: Path) -> None:
    port = free_port()
    with serving(data_dir, port) as process:
        process.kill()  # no lifespan shutdown: PostgreSQL is left running
        process.wait()
    assert postmaster_running(data_dir)

    with serving(data_dir, port) as process:
        assert graphql(port, "{ nodes { id } }") == {"data": {"nodes": []}}
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert not postmaster_running(data_dir), "the crashed holder's pid blocked the stop"


def test_a_dead_holders_pid_does_not_block_the_next_stop(tmp_path: Path) -> None:
    handles = tmp_path / ".handle_pids.json"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    handles.write_text(json.dumps([os.getpid(), dead.pid]))
    prune_dead_handles(tmp_path)
    assert json.loads(handles.read_text()) == [os.getpid()]


def test_serve_says_what_to_do_next_on_a_fresh_deployment(
    database_url: str, engine: object, tmp_path: Path
) -> None:
    # A fresh database (the engine fixture empties it): no tokens yet.
    log = tmp_path / "serve.log"
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "INVENTORY_SHUTDOWN_DRAIN": "0"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
            env=env, cwd=REPO, stderr=out,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while "no tokens yet" not in log.read_text() and time.monotonic() < deadline:
                assert process.poll() is None, log.read_text()
                time.sleep(0.1)
        finally:
            process.kill()
            process.wait()
    said = log.read_text()
    assert f"next: the dashboard is http://127.0.0.1:{port}/ and GraphiQL" in said
    assert "`llmgw-inventory ctl tokens create --role operator` makes the first token" in said
    assert "every caller without one (running agents, ctl, the dashboard) is refused" in said


def test_next_steps_name_fetch_assets_only_when_missing_and_tokens_only_before_the_first() -> None:
    from service.cli import next_steps
    from service.config import Settings

    fresh = "\n".join(next_steps(Settings(), tokens_in_force=False, assets_missing=True))
    assert "`llmgw-inventory fetch-assets`" in fresh and "makes the first token" in fresh
    running = "\n".join(next_steps(Settings(), tokens_in_force=True, assets_missing=False))
    assert "fetch-assets" not in running and "first token" not in running
    assert "http://127.0.0.1:8080/graphql" in running
