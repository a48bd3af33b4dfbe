"""The deployment files say what the code does: compose is valid, nginx knows every replica, units fit the CLI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest
import yaml

from service.cli import uvicorn_options
from service.config import Settings
from tests.support import REPO

DOCKER_COMPOSE = shutil.which("docker-compose")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The compose file as docker-compose itself resolves it (anchors, defaults, paths)."""
    if DOCKER_COMPOSE is None:
        pytest.skip(
            "docker-compose is not installed (Debian's docker-compose package; .ci/run installs it)"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INVENTORY_", "POSTGRES_"))}
    done = subprocess.run(
        [DOCKER_COMPOSE, "config"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    resolved: dict[str, Any] = yaml.safe_load(done.stdout)
    return resolved


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source; docker-compose 1.x prints "source:target:mode", 2.x a mapping."""
    found = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume["source"], volume["target"]
        found[target] = source
    return found


def replicas(compose: dict[str, Any]) -> list[str]:
    return sorted(name for name, s in compose["services"].items() if s.get("command") == ["serve"])


@pytest.mark.docker
def test_compose_runs_postgres_on_a_volume_and_migrates_once_before_the_replicas(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    postgres = services["postgres"]
    assert mounts(postgres)["/var/lib/postgresql/data"] == "pgdata"
    assert "pgdata" in compose["volumes"]

    migrate = services["migrate"]
    assert migrate["command"] == ["migrate"] and migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"

    assert len(replicas(compose)) == 2
    for name in replicas(compose):
        replica = services[name]
        assert replica["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert replica["environment"]["DATABASE_URL"] == migrate["environment"]["DATABASE_URL"]
        assert replica["environment"]["INVENTORY_HOST"] == "0.0.0.0"
        assert replica["environment"]["INVENTORY_BOOTSTRAP_TOKEN"]  # tokens in force off loopback


@pytest.mark.docker
def test_the_proxy_balances_over_exactly_the_compose_replicas(compose: dict[str, Any]) -> None:
    nginx = (REPO / "deploy" / "nginx.conf").read_text()
    upstream = re.findall(r"^\s*server\s+([\w-]+):8080", nginx, flags=re.MULTILINE)
    assert sorted(upstream) == replicas(compose)

    proxy = compose["services"]["proxy"]
    assert mounts(proxy)["/etc/nginx/conf.d/default.conf"] == str(REPO / "deploy" / "nginx.conf")
    # Subscriptions are websockets: the proxy must pass the upgrade on.
    assert "proxy_set_header Upgrade $http_upgrade" in nginx
    # A vanished replica costs a short connect timeout, not nginx's 60 s; a
    # mutation that reached a replica is never sent to another
    # (test_compose_stack.py proves both under traffic).
    timeout = re.search(r"proxy_connect_timeout\s+(\d+)(ms|s);", nginx)
    assert timeout is not None
    assert int(timeout.group(1)) / (1000 if timeout.group(2) == "ms" else 1) <= 1
    retries = re.search(r"^\s*proxy_next_upstream\s([^;]*);", nginx, flags=re.MULTILINE)
    assert retries is not None and "non_idempotent" not in retries.group(1)


def test_the_proxy_closes_an_idle_connection_before_a_replica_would() -> None:
    # A replica that closes an idle keep-alive connection as nginx writes a
    # request on it loses that request (a POST is not retried): nginx's
    # upstream idle timeout must be the shorter one (service/web/draining.py).
    nginx = (REPO / "deploy" / "nginx.conf").read_text()
    idle = re.search(r"^\s*keepalive_timeout\s+(\d+)s;", nginx, flags=re.MULTILINE)
    assert idle is not None, "the upstream sets no keepalive_timeout (nginx's default is 60 s)"
    assert int(idle.group(1)) < uvicorn_options(Settings())["timeout_keep_alive"]


@pytest.mark.docker
def test_the_demo_agent_reports_to_the_proxy_with_the_services_token(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    agent = services["agent"]
    assert agent["entrypoint"] == ["llmgw-agent"]
    assert agent["environment"]["LLMGW_AGENT_SERVICE_URL"] == "http://proxy:8080/graphql"
    token = services[replicas(compose)[0]]["environment"]["INVENTORY_BOOTSTRAP_TOKEN"]
    assert agent["environment"]["LLMGW_AGENT_TOKEN"] == token


def test_the_image_runs_unprivileged_with_graphiqls_assets_baked_in() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", dockerfile, flags=re.MULTILINE)[1:]
    build, runtime = stages[0], stages[-1]
    # The service's build fetches GraphiQL's scripts (setup.py); the image checks them.
    assert "pip install ./agent " in build and "llmgw-inventory fetch-assets --check" in build
    assert "COPY --from=build /opt/llmgw /opt/llmgw" in runtime and "/src" not in runtime
    user = re.findall(r"^USER (\S+)", runtime, flags=re.MULTILINE)
    assert user and user[-1] not in {"root", "0"}
    # The build context leaves out what the image must not carry.
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "service/static/vendor"} <= set(ignored)


@pytest.mark.process
def test_the_unit_stops_retrying_on_the_exit_status_of_a_bad_setting() -> None:
    unit = (REPO / "deploy" / "llmgw-inventory.service").read_text()
    assert re.search(r"^ExecStart=\S*/llmgw-inventory serve$", unit, flags=re.MULTILINE)
    prevented = re.search(r"^RestartPreventExitStatus=(\d+)$", unit, flags=re.MULTILINE)
    assert prevented is not None

    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"],
        env={**os.environ, "INVENTORY_PORT": "eighty"},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert done.returncode == int(prevented.group(1))
    assert "INVENTORY_PORT='eighty'" in done.stderr
