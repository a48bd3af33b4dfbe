"""DATABASE_URL: one host or libpq's several, bad ones refused clearly, and a database not up yet waited for.

The password never appears in any message: not in a parse error, not in the
"no reachable host" error, not in the log of a replica waiting for PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from service.config import SettingError, Settings
from service.database import database_url
from service.database.database_wait import DatabaseStartupError, wait_until_reachable
from tests.support import REPO
from tests.support.live_service import free_port
from tests.support.pg_cluster import StandbyPair

SECRET = "s3cr%3At-pw"  # percent-encoded, as in a real URL: ':' inside a password


def test_the_multi_host_form_is_kept_whole_for_asyncpg() -> None:
    url = f"postgresql://llmgw:{SECRET}@pg-a:5432,pg-b:6432/inv?target_session_attrs=read-write"
    parsed = database_url.parse(url)
    assert parsed.hosts == ("pg-a:5432", "pg-b:6432")
    assert parsed.dsn == url  # asyncpg reads libpq's form itself
    assert parsed.user == "llmgw" and parsed.database == "inv"
    assert "s3cr" not in parsed.shown and "llmgw:***@pg-a:5432,pg-b:6432" in parsed.shown
    # The driver's scheme is accepted and passed on as libpq's.
    assert database_url.parse(url.replace("postgresql:", "postgresql+asyncpg:")).dsn == url


@pytest.mark.parametrize(
    ("url", "names"),
    [
        (f"postgresql://u:{SECRET}@h1:5432,h2:54x2/db", ["port '54x2'", "host 'h2'"]),
        (f"postgresql://u:{SECRET}@h1:5432,:5433/db", ["host ':5433'"]),
        (f"postgresql://u:{SECRET}@h1:70000/db", ["port '70000'"]),
        (f"mysql://u:{SECRET}@h1/db", ["scheme 'mysql'"]),
        (f"postgresql://u:{SECRET}@h1,h2/db?target_session_attrs=primary-ish", ["primary-ish"]),
    ],
)
def test_a_bad_url_is_refused_naming_what_is_wrong_never_the_password(
    url: str, names: list[str]
) -> None:
    with pytest.raises(SettingError) as refused:
        Settings.from_env({"DATABASE_URL": url})
    message = str(refused.value)
    assert all(name in message for name in names), message
    assert "DATABASE_URL=" in message and "s3cr" not in message


@pytest.mark.process
def test_serve_with_a_bad_url_exits_with_the_settings_status_and_says_why() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"],
        env={**os.environ, "DATABASE_URL": f"postgresql://u:{SECRET}@h1:5432,h2:x/db"},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert "port 'x' of host 'h2'" in done.stderr and "s3cr" not in done.stderr


async def test_no_reachable_host_names_every_host_tried_and_not_the_password() -> None:
    a, b = free_port(), free_port()  # nothing listens there
    url = f"postgresql://u:{SECRET}@127.0.0.1:{a},127.0.0.1:{b}/db?target_session_attrs=read-write"
    with pytest.raises(DatabaseStartupError) as gave_up:
        await wait_until_reachable(url, connect_timeout=1, within=1.5)
    message = str(gave_up.value)
    assert f"127.0.0.1:{a}, 127.0.0.1:{b}" in message and "gave up after" in message
    assert "s3cr" not in message


async def test_what_waiting_cannot_fix_stops_at_once(database_url: str) -> None:
    parts = urlsplit(database_url)
    missing = urlunsplit(parts._replace(path="/no_such_database_here"))
    started = time.monotonic()
    with pytest.raises(DatabaseStartupError) as refused:
        await asyncio.wait_for(wait_until_reachable(missing, within=None), timeout=30)
    assert "InvalidCatalogNameError" in str(refused.value)
    assert time.monotonic() - started < 5


@pytest.mark.process
def test_a_replica_started_while_postgres_is_down_waits_not_ready_and_serves_once_it_is_up() -> (
    None
):
    pair = StandbyPair(free_port(), free_port())
    log = Path(tempfile.mkstemp(prefix="llmgw-wait-", suffix=".log")[1])
    process = None
    try:
        pair.start()
        pair.standby.stop()
        pair.primary.stop()
        port = free_port()
        url = pair.url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")
        with log.open("w") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                env={**os.environ, "DATABASE_URL": url},
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        # Waiting, and saying so (a loaded machine may take seconds to import).
        deadline = time.monotonic() + 60
        while "not ready: waiting for PostgreSQL at" not in (waiting := log.read_text()):
            assert process.poll() is None, waiting
            assert time.monotonic() < deadline, waiting
            time.sleep(0.2)
        time.sleep(1.5)  # a few attempts, with backoff
        assert process.poll() is None, log.read_text()
        # Not listening: a load balancer or health check sees it as not ready.
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
        assert f"127.0.0.1:{pair.primary.port}, 127.0.0.1:{pair.standby.port}" in waiting
        assert "s3cr" not in waiting

        pair.primary.start()
        pair.standby.start()
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(timeout=20)
        pair.stop()
        log.unlink(missing_ok=True)
