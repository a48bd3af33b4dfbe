"""The previous release keeps working on the new schema, and a rolling upgrade under load fails no request.

docs/deployment/upgrades.md's order, played with real processes: two
processes of the previous release (its code from this repository's history,
`git archive`: LLMGW_PREVIOUS_RELEASE, by default the commit this round
started from) serve a database they migrated; schedulers place and release
and nodes heartbeat and report through a client that balances over the
processes in rotation, as a load balancer does. Then the new release's
migrations are applied (with none new in a release, its newest migration is
applied again, undone first, so that a migration runs under the load), and
each process is replaced in turn: taken out of rotation, its requests in
flight finished, stopped (SIGTERM), a process of this release started on
the same port and put back once its /readyz answers 200.

Judged: every request answered without error (0 failed), every place
acknowledged is stored with its GPUs and every release acknowledged gone, and
no statement of the service waited on a lock longer than the migrations'
lock_timeout (sampled from pg_stat_activity every 50 ms while they ran).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from service.database.migrations import downgrade, head_revision, upgrade
from tests.support import REPO
from tests.support.databases import create_database, drop_database
from tests.support.live_service import LiveService, free_port
from tests.support.reports import PLACE, REGISTER, node_input

PREVIOUS = os.environ.get("LLMGW_PREVIOUS_RELEASE", "8bbedff")
LOCK_TIMEOUT = 2.0  # alembic/env.py's default INVENTORY_MIGRATION_LOCK_TIMEOUT
NODES = [f"roll-{i}" for i in range(4)]
RELEASE = "mutation Release($id: ID!) { releaseReplica(replicaId: $id) }"
HEARTBEAT = "mutation Beat($id: ID!) { heartbeat(nodeId: $id) { id } }"
HELD = "{ allocations(first: 1000) { replicaId nodeId gpuIndices } }"

pytestmark = [pytest.mark.process, pytest.mark.serial]


@pytest.fixture(scope="module")
def previous_release() -> Iterator[Path]:
    """The previous release's service and migrations, exported from git history."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], capture_output=True
    )
    if found.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} (LLMGW_PREVIOUS_RELEASE) is not in this clone's history")
    with tempfile.TemporaryDirectory(prefix="llmgw-previous-") as folder:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", PREVIOUS, "service", "alembic"],
            capture_output=True, check=True,
        )  # fmt: skip
        subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
        yield Path(folder)


class PreviousService(LiveService):
    """`llmgw-inventory serve` of the previous release (its code first on the path)."""

    tree: Path = Path()

    def start(self, timeout: float = 60.0) -> None:
        env = {
            "INVENTORY_SHUTDOWN_DRAIN": "0",
            **os.environ,
            **self.env,
            "DATABASE_URL": self.database_url,
            "PYTHONPATH": str(self.tree),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port)],
            env=env,
            cwd=self.tree,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the previous release exited with {self.process.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the previous release did not start in time")


@dataclass
class Balancer:
    """Round robin over the processes in rotation; counts every request and every failure."""

    token: str
    rotation: list[str] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    turn: int = 0

    def post(self, client: httpx.Client, query: str, variables: dict[str, Any]) -> Any:
        with self.lock:
            url = self.rotation[self.turn % len(self.rotation)]
            self.turn += 1
            self.in_flight[url] = self.in_flight.get(url, 0) + 1
            self.requests += 1
        try:
            response = client.post(url, json={"query": query, "variables": variables})
            body = response.json()
            if response.status_code != 200 or body.get("errors"):
                self.failures.append(f"{url}: HTTP {response.status_code} {str(body)[:200]}")
                return None
            return body["data"]
        except (httpx.HTTPError, ValueError) as error:
            self.failures.append(f"{url}: {type(error).__name__}: {error}")
            return None
        finally:
            with self.lock:
                self.in_flight[url] -= 1

    def take_out(self, url: str) -> None:
        with self.lock:
            self.rotation.remove(url)
        deadline = time.monotonic() + 30
        while self.in_flight.get(url, 0) and time.monotonic() < deadline:
            time.sleep(0.02)

    def put_in(self, url: str) -> None:
        with self.lock:
            self.rotation.append(url)


class Traffic:
    """Two schedulers (each keeps three replicas) and heartbeats plus reports for four nodes."""

    def __init__(self, balancer: Balancer) -> None:
        self.balancer = balancer
        self.stopping = threading.Event()
        self.held: dict[str, frozenset[tuple[str, int]]] = {}
        self.released: set[str] = set()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self.scheduler, args=(f"s{i}",), daemon=True) for i in (1, 2)
        ] + [threading.Thread(target=self.nodes, daemon=True)]

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=60)

    def client(self) -> httpx.Client:
        return httpx.Client(timeout=30, headers={"Authorization": f"Bearer {self.balancer.token}"})

    def scheduler(self, who: str) -> None:
        mine: list[str] = []
        n = 0
        with self.client() as client:
            while not self.stopping.is_set():
                if len(mine) >= 3:
                    replica = mine.pop(0)
                    if self.balancer.post(client, RELEASE, {"id": replica}) is not None:
                        with self.lock:
                            self.held.pop(replica, None)
                            self.released.add(replica)
                else:
                    replica = f"{who}-{n}"
                    n += 1
                    data = self.balancer.post(client, PLACE, {"input": {
                        "replicaId": replica, "gpuClass": "H100-80GB", "gpusPerShard": 1}})  # fmt: skip
                    if data and data["place"]["__typename"] == "Allocated":
                        gpus = frozenset(
                            (a["nodeId"], i)
                            for a in data["place"]["allocations"]
                            for i in a["gpuIndices"]
                        )
                        with self.lock:
                            self.held[replica] = gpus
                        mine.append(replica)
                time.sleep(0.02)

    def nodes(self) -> None:
        with self.client() as client:
            beat = 0
            while not self.stopping.is_set():
                for node in NODES:
                    self.balancer.post(client, HEARTBEAT, {"id": node})
                beat += 1
                if beat % 5 == 0:
                    self.balancer.post(client, REGISTER, {"input": node_input(NODES[beat % 4])})
                time.sleep(0.2)


class LockWaits:
    """pg_stat_activity every 50 ms: the longest any other session waited on a lock."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.longest = 0.0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self.sample()), daemon=True)

    async def sample(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            while not self.stopping.is_set():
                waited = await conn.fetchval(
                    "SELECT coalesce(max(extract(epoch FROM now() - query_start)), 0) "
                    "FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND pid <> pg_backend_pid() "
                    "AND query NOT ILIKE '%alembic%' AND query NOT ILIKE '%advisory%' "
                    "AND query NOT ILIKE 'CREATE INDEX%' AND query NOT ILIKE 'DROP INDEX%'"
                )
                self.longest = max(self.longest, float(waited))
                await asyncio.sleep(0.05)
        finally:
            await conn.close()

    def __enter__(self) -> LockWaits:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)


@pytest.fixture
def database(server_url: str) -> Iterator[str]:
    url = create_database(server_url, prefix="llmgw_rolling")
    yield url
    drop_database(server_url, url)


def stored(url: str) -> dict[str, frozenset[tuple[str, int]]]:
    with httpx.Client(timeout=30, headers={"Authorization": "Bearer roll-token"}) as client:
        data = client.post(url, json={"query": HELD}).json()["data"]
    held: dict[str, set[tuple[str, int]]] = {}
    for a in data["allocations"]:
        held.setdefault(a["replicaId"], set()).update((a["nodeId"], i) for i in a["gpuIndices"])
    return {r: frozenset(g) for r, g in held.items()}


def test_a_rolling_upgrade_from_the_previous_release_under_load_fails_no_request(
    previous_release: Path, database: str
) -> None:
    env = {"INVENTORY_BOOTSTRAP_TOKEN": "roll-token"}
    old = []
    for _ in range(2):
        process = PreviousService(database_url=database, port=free_port(), env=env)
        process.tree = previous_release
        process.start()  # the first one migrates, as each replica does at start
        old.append(process)
    new: list[LiveService] = []
    balancer = Balancer("roll-token", rotation=[p.url for p in old])
    try:
        with httpx.Client(timeout=30, headers={"Authorization": "Bearer roll-token"}) as client:
            for node in NODES:
                assert balancer.post(client, REGISTER, {"input": node_input(node)}) is not None
        with Traffic(balancer) as traffic:
            time.sleep(3)
            # 1. The new release's migrations, under the previous release's load.
            with LockWaits(database) as waits:
                if head_revision() == "0020":  # no new migration: run the newest again
                    downgrade(database, "0019")
                upgrade(database)
            time.sleep(2)
            # 2. Each process replaced in turn, out of rotation first.
            for process in old:
                balancer.take_out(process.url)
                process.stop()
                replacement = LiveService(database_url=database, port=process.port, env=env)
                replacement.start()
                new.append(replacement)
                ready = httpx.get(f"http://127.0.0.1:{process.port}/readyz", timeout=5)
                assert ready.status_code == 200, ready.text
                balancer.put_in(replacement.url)
                time.sleep(3)
        held = stored(new[0].url)
    finally:
        for process in [*old, *new]:
            process.stop()
    assert balancer.failures == [], balancer.failures[:10]
    assert balancer.requests > 200, balancer.requests
    assert {r: g for r, g in held.items()} == traffic.held, "acknowledged places lost or changed"
    assert not traffic.released & set(held), "acknowledged releases undone"
    assert waits.longest <= LOCK_TIMEOUT + 0.5, waits.longest
    print(
        f"\nrolling upgrade {PREVIOUS} -> this release: {balancer.requests} requests, 0 failed; "
        f"{len(traffic.held)} replicas held at the end, {len(traffic.released)} released; the "
        f"longest lock wait of a service statement during the migrations {waits.longest:.2f} s "
        f"(bound {LOCK_TIMEOUT:g} s)"
    )
