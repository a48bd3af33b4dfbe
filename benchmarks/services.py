"""`llmgw-inventory serve` processes on the benchmark's database, as an operator runs them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent

# Sent on every request: harmless while the service has no tokens, and the
# operator's bootstrap token once it does.
TOKEN = "llmgw-bench-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Service:
    def __init__(self, database_url: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.database_url = database_url
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/graphql"

    @property
    def pid(self) -> int:
        return self.process.pid if self.process else -1

    def start(self, timeout: float = 60.0) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "INVENTORY_LOG_LEVEL": "warning",
            "INVENTORY_BOOTSTRAP_TOKEN": TOKEN,
            # Enough connections for the clients one process serves (a
            # request may hold three: its root field and two loaders). With
            # fewer, the pool opens and closes overflow connections under
            # load, and asyncpg's connection setup then dominates the profile.
            "INVENTORY_DB_POOL_SIZE": "24",
            # The sweep would mark the synthetic nodes unreachable mid-run.
            "INVENTORY_UNREACHABLE_AFTER": "86400",
            "INVENTORY_LOST_AFTER": "172800",
            **self.env,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port)],
            env=env,
            cwd=REPO,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited with {self.process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError("service did not start in time")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


@contextlib.contextmanager
def services(database_url: str, count: int) -> Iterator[list[Service]]:
    started: list[Service] = []
    try:
        for _ in range(count):
            service = Service(database_url)
            service.start()
            started.append(service)
        yield started
    finally:
        for service in started:
            service.stop()
