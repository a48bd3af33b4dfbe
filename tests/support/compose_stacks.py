"""Compose stacks for the deployment tests: Docker or a clear skip, per-run names, the images.

tests/operations/test_compose_stack.py (the demo, docker-compose.yml) and
tests/operations/test_ha_stack.py (docker-compose.ha.yml) bring real stacks up
on the machine's dockerd. Test sessions of several worktrees may share that
dockerd: each run builds its own image tags and uses its own project name and
subnet (one shared tag and project name once ran another checkout's code, and
tore another run's stack down).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

import httpx
import pytest

from tests.support import REPO
from tests.support.live_service import free_port

HOW_TO_RUN = (
    "run it as root with docker.io and docker-compose installed and dockerd running "
    "(`apt-get install docker.io docker-compose debootstrap; dockerd &`), as .ci/run does"
)


def docker_problem() -> str | None:
    docker, compose = shutil.which("docker"), shutil.which("docker-compose")
    if docker is None or compose is None:
        return "docker or docker-compose is not installed"
    try:
        done = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "dockerd did not answer `docker info` within 20 s"
    if done.returncode != 0:
        return f"dockerd is not reachable: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    return None


def require_docker(what: str) -> None:
    """Skip (or, with LLMGW_REQUIRE_DOCKER=1 as in CI, fail) when Docker cannot be used."""
    problem = docker_problem()
    if problem is not None:
        message = f"{what} needs Docker: {problem}; {HOW_TO_RUN}"
        if os.environ.get("LLMGW_REQUIRE_DOCKER") == "1":
            pytest.fail(message)
        pytest.skip(message)


def run(*command: str, env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def clean_environment() -> dict[str, str]:
    """This process's environment without the service's, PostgreSQL's and Patroni's settings."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("INVENTORY_", "POSTGRES_", "PATRONI_", "DATABASE_URL"))
    }


def stack_environment(image: str, token: str, **extra: str) -> tuple[dict[str, str], int, str]:
    """The environment a compose file is brought up with: this run's image tag, token, port
    on loopback and subnet prefix (and `extra`); also the port and the prefix."""
    env = clean_environment()
    base_images(env)
    port = free_port()
    prefix = free_subnet_prefix()
    env.update(
        extra,
        LLMGW_IMAGE=image,
        INVENTORY_BOOTSTRAP_TOKEN=token,
        INVENTORY_PUBLISH_PORT=str(port),
        LLMGW_SUBNET_PREFIX=prefix,
    )
    return env, port, prefix


def base_images(env: dict[str, str]) -> None:
    """PYTHON_IMAGE, POSTGRES_IMAGE, NGINX_IMAGE into `env` (deploy/base-images.sh, cached)."""
    images = run("bash", "deploy/base-images.sh", env=env, timeout=900)
    for line in images.splitlines():
        name, _, value = line.partition("=")
        env[name] = value


def build_service_image(env: dict[str, str], tag: str) -> None:
    run(
        "docker", "build", "--network", "host", "-q",
        "--build-arg", f"PYTHON_IMAGE={env['PYTHON_IMAGE']}",
        "-t", tag, ".",
        env=env, timeout=900,
    )  # fmt: skip


def remove_image_tags(*tags: str) -> None:
    # The tags, not their parents: they are docker's build cache (without
    # --no-prune the next run rebuilt for 23 s instead of 1 s).
    subprocess.run(["docker", "image", "rm", "--no-prune", *tags], capture_output=True, timeout=60)


def free_subnet_prefix() -> str:
    """A 172.29.N no docker network uses any part of yet: the stacks' fixed addresses live there."""
    ids = subprocess.run(
        ["docker", "network", "ls", "-q"], capture_output=True, text=True, timeout=30
    ).stdout.split()
    used = subprocess.run(
        ["docker", "network", "inspect", "--format",
         "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *ids],
        capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    # Any subnet inside the /24 (docker-compose.ha.yml carves it into /26s), or
    # a wider one holding it, such as a 172.29.0.0/16 docker picked by itself.
    taken = used.split()
    start = 82 + os.getpid() % 100
    for n in [*range(start, 250), *range(82, start)]:
        if not any(s.startswith(f"172.29.{n}.") or s == "172.29.0.0/16" for s in taken):
            return f"172.29.{n}"
    raise AssertionError(f"no free 172.29.N.0/24 for the compose network; in use: {used}")


def wait_for(what: str, within: float, check: Any, every: float = 0.5) -> Any:
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, AssertionError, ValueError) as error:
            last = error
        time.sleep(every)
    raise AssertionError(f"gave up waiting for {what} after {within:g} s; last: {last!r}")
