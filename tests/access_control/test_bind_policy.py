"""A service without tokens listens on loopback only; elsewhere it refuses to start, unless --insecure."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import tokens
from service.access_control.bind_policy import bind_decision, is_loopback
from tests.support import REPO
from tests.support.live_service import free_port

pytestmark = pytest.mark.process


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_is_always_allowed(host: str) -> None:
    assert is_loopback(host)
    assert bind_decision(host, tokens_in_force=False, insecure=False).start


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.7", "inventory.cluster.local", ""])
def test_anywhere_else_needs_tokens(host: str) -> None:
    refused = bind_decision(host, tokens_in_force=False, insecure=False)
    assert not refused.start
    assert refused.message is not None and "\n" not in refused.message
    assert "without tokens" in refused.message and "--insecure" in refused.message
    assert bind_decision(host, tokens_in_force=True, insecure=False) == bind_decision(
        "127.0.0.1", tokens_in_force=False, insecure=False
    )


def test_insecure_starts_but_says_so() -> None:
    decision = bind_decision("0.0.0.0", tokens_in_force=False, insecure=True)
    assert decision.start
    assert decision.message is not None and decision.message.startswith("INSECURE")


def _serve(database_url: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", *args],
        env={**os.environ, "DATABASE_URL": database_url, **env},
        cwd=REPO,
        stderr=subprocess.PIPE,
    )


def test_a_tokenless_service_refuses_a_public_address_with_one_line(
    database_url: str, engine: AsyncEngine
) -> None:
    process = _serve(database_url, "--host", "0.0.0.0", "--port", str(free_port()))
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    lines = [line for line in stderr.decode().splitlines() if "refusing" in line]
    assert len(lines) == 1 and "without tokens" in lines[0], stderr.decode()


def _started(process: subprocess.Popen[bytes], port: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            time.sleep(0.1)
    return False


def _stop(process: subprocess.Popen[bytes]) -> str:
    process.terminate()
    _, stderr = process.communicate(timeout=30)
    return stderr.decode()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_insecure_overrides_loudly(database_url: str, engine: AsyncEngine, how: str) -> None:
    port = free_port()
    args: list[str] = ["--host", "0.0.0.0", "--port", str(port)]
    env: dict[str, Any] = {}
    if how == "flag":
        args.append("--insecure")
    else:
        env["INVENTORY_INSECURE"] = "true"
    process = _serve(database_url, *args, **env)
    try:
        assert _started(process, port)
    finally:
        stderr = _stop(process)
    assert "INSECURE: serving on 0.0.0.0 without tokens" in stderr


async def test_with_a_token_a_public_address_is_fine(
    database_url: str, engine: AsyncEngine
) -> None:
    import asyncio

    async with engine.begin() as conn:
        await tokens.create_token(conn, "operator")
    port = free_port()
    process = _serve(database_url, "--host", "0.0.0.0", "--port", str(port))
    try:
        assert await asyncio.to_thread(_started, process, port)
    finally:
        stderr = await asyncio.to_thread(_stop, process)
    assert "INSECURE" not in stderr
