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
from tests.support import REPO
from tests.support.live_service import free_port
from tests.support.reports import REGISTER, node_input

pytestmark = pytest.mark.process


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
    from service.cli import Census, next_steps
    from service.config import Settings

    empty = Census(tokens=0, nodes=0, bootstrap=False)
    fresh = "\n".join(next_steps(Settings(), empty, assets_missing=True))
    assert "`llmgw-inventory fetch-assets`" in fresh and "makes the first token" in fresh
    assert "no nodes yet?" in fresh
    running = "\n".join(
        next_steps(Settings(), Census(tokens=2, nodes=5, bootstrap=False), assets_missing=False)
    )
    assert "fetch-assets" not in running and "first token" not in running
    assert "no nodes yet" not in running and "5 nodes stored" in running
    assert "tokens are required: 2 tokens exist" in running
    assert "http://127.0.0.1:8080/graphql" in running
    bootstrap = "\n".join(
        next_steps(Settings(), Census(tokens=0, nodes=1, bootstrap=True), assets_missing=False)
    )
    assert "tokens are required: INVENTORY_BOOTSTRAP_TOKEN is set" in bootstrap
    assert "1 node stored" in bootstrap


def serve_log(data_dir: Path, port: int, log: Path, until: str) -> subprocess.Popen[bytes]:
    """`serve` on data_dir, its log in `log`, once the log says `until`."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "INVENTORY_TOKEN"}}
    env["INVENTORY_SHUTDOWN_DRAIN"] = "0"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(port),
             "--data-dir", str(data_dir)],
            env=env, cwd=REPO, stderr=out,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        if until in log.read_text():
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    return process
        time.sleep(0.1)


def inventory(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "INVENTORY_TOKEN"}}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *argv],
        env=env, cwd=REPO, capture_output=True, text=True, input=stdin, timeout=120,
    )  # fmt: skip


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)


def test_the_tutorial_repeats_after_reset_and_serve_says_when_tokens_are_required(
    data_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    process = serve_log(data_dir, port, log, "no tokens yet")
    try:
        said = log.read_text()
        assert f"the embedded PostgreSQL keeps its data in {data_dir}" in said
        assert "no nodes yet?" in said
        assert graphql(port, REGISTER, {"input": node_input("gpu-07")}).get("errors") is None
        url = f"http://127.0.0.1:{port}/graphql"
        made = inventory("ctl", "--url", url, "tokens", "create", "--role", "operator")
        assert made.returncode == 0, made.stderr
        # While serve holds the data, reset refuses and deletes nothing.
        refused = inventory("reset", "--data-dir", str(data_dir), "--yes")
        assert refused.returncode == 1 and "stop it first; nothing deleted" in refused.stderr
    finally:
        stop(process)

    # The restart the tutorial met: the tokens lock it, and the log says so.
    process = serve_log(data_dir, port, log, "tokens are required")
    try:
        said = log.read_text()
        assert "tokens are required: 1 token exists" in said
        assert "1 node stored" in said and "no nodes yet" not in said
        assert "python3 dev.py reset" in said
    finally:
        stop(process)

    # Without --yes and without a terminal to ask on, reset says what it would delete.
    asked = inventory("reset", "--data-dir", str(data_dir), stdin="")
    assert asked.returncode == 2 and "pass --yes" in asked.stderr and data_dir.exists()
    done = inventory("reset", "--data-dir", str(data_dir), "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"deleted {data_dir}: the embedded PostgreSQL's data")
    assert not data_dir.exists()
    assert inventory("reset", "--data-dir", str(data_dir), "--yes").stdout.startswith(
        "nothing to delete"
    )

    process = serve_log(data_dir, port, log, "no tokens yet")
    try:
        assert "no nodes yet?" in log.read_text()
        assert graphql(port, "{ nodes { id } }") == {"data": {"nodes": []}}
    finally:
        stop(process)
    assert not postmaster_running(data_dir)


def test_reset_deletes_only_an_embedded_data_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    # A mistyped --data-dir: a folder that is not PostgreSQL's is kept whole.
    done = inventory("reset", "--data-dir", str(home), "--yes")
    assert done.returncode == 1 and "no PG_VERSION" in done.stderr
    assert (home / "notes.txt").read_text() == "mine"

    env = {**os.environ, "DATABASE_URL": "postgresql://db.internal/llmgw"}
    outside = subprocess.run(
        [sys.executable, "-m", "service.cli", "reset", "--yes"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert outside.returncode == 2 and "DATABASE_URL is set" in outside.stderr


def test_the_default_data_directory_is_the_users_own_and_roots_stays_out_of_root_home(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import platformdirs

    from service import config

    # A user's tutorial is theirs: their own data directory.
    monkeypatch.setattr(config.os, "geteuid", lambda: 1000)
    assert config.default_data_dir() == Path(platformdirs.user_data_dir("llmgw-inventory"))
    # Root's is not under /root: the embedded server runs as another user and
    # would make every folder above its data directory traversable to all.
    monkeypatch.setattr(config.os, "geteuid", lambda: 0)
    assert config.default_data_dir() == Path("/var/lib/llmgw-inventory")
