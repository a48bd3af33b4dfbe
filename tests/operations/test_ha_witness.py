"""The death witness (deploy/ha/witness.py) frees only a dead leader's lock, and only that lock.

Against a real etcd (the HA deployment's image) and the real Docker daemon:
a member whose container runs or is paused keeps its lock; one whose
container was killed or removed loses it; a lock renewed or taken by another
member since the witness read it is left alone. test_ha_stack.py sees the
whole of it: each leader killed there is replaced without waiting for ttl.
Needs Docker (skipped without it, failed under LLMGW_REQUIRE_DOCKER=1, as in CI).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tests.support.compose_stacks import (
    REPO,
    base_images,
    clean_environment,
    free_port,
    require_docker,
    run,
)

pytestmark = pytest.mark.docker

PROJECT = f"llmgw-witness-{os.getpid()}"
ETCD_IMAGE = f"llmgw-witness-{os.getpid()}/etcd:3.4"
KEY = "/patroni/llmgw/leader"


def load_witness() -> ModuleType:
    name = "llmgw_ha_witness"
    spec = importlib.util.spec_from_file_location(name, REPO / "deploy" / "ha" / "witness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


witness = load_witness()


def test_only_a_container_with_no_process_left_is_dead() -> None:
    Container = witness.Container
    assert witness.dead_reason(Container("running", True, 42)) is None
    # Frozen is alive: it resumes where it stopped, sessions and all.
    assert witness.dead_reason(Container("paused", True, 42)) is None
    assert witness.dead_reason(Container("exited", False, 0)) == "its container is exited"
    assert witness.dead_reason(Container("dead", False, 0)) == "its container is dead"
    assert witness.dead_reason(None) == "its container is gone"
    # Docker still names a pid: something of it may run yet.
    assert witness.dead_reason(Container("removing", False, 42)) is None


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    require_docker("the HA witness test")
    env = clean_environment()
    base_images(env)
    return env


@pytest.fixture(scope="module")
def etcd(env: dict[str, str]) -> Iterator[Any]:
    run(
        "docker", "build", "--network", "host", "-q", "-f", "deploy/ha/etcd.Dockerfile",
        "--build-arg", f"BASE={env['PYTHON_IMAGE']}", "-t", ETCD_IMAGE, "deploy/ha",
        env=env, timeout=900,
    )  # fmt: skip
    port, peer = free_port(), free_port()
    name = f"{PROJECT}-etcd"
    run(
        "docker", "run", "-d", "--rm", "--name", name, "--network", "host", ETCD_IMAGE,
        "--data-dir", "/tmp/etcd", "--listen-client-urls", f"http://127.0.0.1:{port}",
        "--advertise-client-urls", f"http://127.0.0.1:{port}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"default=http://127.0.0.1:{peer}",
        env=env,
    )  # fmt: skip
    client = witness.Etcd([f"127.0.0.1:{port}"])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.leader(KEY)
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield client
    finally:
        run("docker", "rm", "-f", name, env=env)
        run("docker", "rmi", "-f", ETCD_IMAGE, env=env)


def put(etcd: Any, value: str) -> None:
    b64 = witness._b64
    etcd.post("/v3/kv/put", {"key": b64(KEY), "value": b64(value)})


def test_the_lock_is_freed_only_if_it_still_names_the_member_at_the_revision_read(
    etcd: Any,
) -> None:
    put(etcd, "pg-1")
    read = etcd.leader(KEY)
    assert read.member == "pg-1"
    # Renewed since: Patroni rewrote it (a live leader), so it stays.
    put(etcd, "pg-1")
    assert not etcd.release(KEY, read)
    assert etcd.leader(KEY).member == "pg-1"
    # Taken by another member since: stays.
    renewed = etcd.leader(KEY)
    put(etcd, "pg-2")
    assert not etcd.release(KEY, renewed)
    assert etcd.leader(KEY).member == "pg-2"
    # As read: freed.
    current = etcd.leader(KEY)
    assert etcd.release(KEY, current)
    assert etcd.leader(KEY) is None


def test_docker_says_which_members_can_no_longer_write(env: dict[str, str]) -> None:
    docker = witness.Docker("/var/run/docker.sock")
    name = f"{PROJECT}-pg-9"
    run(
        "docker", "run", "-d", "--name", name,
        "--label", f"com.docker.compose.project={PROJECT}",
        "--label", "com.docker.compose.service=pg-9",
        env["PYTHON_IMAGE"], "sleep", "600",
        env=env,
    )  # fmt: skip
    try:
        assert witness.dead_reason(docker.member(PROJECT, "pg-9")) is None
        run("docker", "pause", name, env=env)
        paused = docker.member(PROJECT, "pg-9")
        assert paused.status == "paused" and witness.dead_reason(paused) is None
        run("docker", "unpause", name, env=env)
        run("docker", "kill", name, env=env)
        assert witness.dead_reason(docker.member(PROJECT, "pg-9")) == "its container is exited"
        run("docker", "rm", name, env=env)
        assert witness.dead_reason(docker.member(PROJECT, "pg-9")) == "its container is gone"
        # Another project's member of the same name is not this one.
        assert docker.member(f"{PROJECT}-other", "pg-9") is None
    finally:
        run("docker", "rm", "-f", name, env=env)
