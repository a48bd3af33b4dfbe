"""The history test of issue 37, on loopback: PostgreSQL paused while schedulers time out and release.

Schedulers place replicas through a real service process over HTTP, each
saying how long it waits (X-Client-Timeout) and giving up after that long:
then it releases the replica it never heard back about, until that release
is acknowledged, and never uses the id again. Meanwhile PostgreSQL is paused
with SIGSTOP for longer than the schedulers wait, a few times, in turn:
the whole server (postmaster and every backend), and only the backends that
are inside a transaction at that moment (places caught before their claim,
mid-claim, or with their COMMIT sent), while the releases run on the others:
the release then finds nothing, and the paused place would commit after it.

Judged on the history, at the end:
- no replica released after a timeout holds GPUs (the gap issue 37 found: a
  place whose client had given up committed after the release found nothing);
- every place that was acknowledged and not released is held, and nothing
  is held twice (the consistency check of tests/support/consistency.py);
- no answer was a 5xx other than 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest
from sqlalchemy import text

from service.config import Settings
from service.database.db import create_engine, dispose, libpq_url
from service.database.embedded import EmbeddedPostgres, postmaster_pid
from tests.support.consistency import inconsistencies
from tests.support.live_service import LiveService, free_port
from tests.support.reports import H100, PLACE, REGISTER, gpus, node_input, placement

pytestmark = [pytest.mark.serial, pytest.mark.process]

SCHEDULERS = 8
# Room for 128 one-GPU replicas: the cluster must not fill up, or places stop
# claiming anything (Unplaceable) and no pause can catch one mid-claim.
NODES = 16
WAITS = 1.0  # what each scheduler waits for a place, and says it waits
PAUSES = 8
PAUSED_FOR = 2.5  # longer than a scheduler waits
RELEASE = "mutation Release($id: ID!) { releaseReplica(replicaId: $id) }"


@dataclass
class History:
    acknowledged: set[str] = field(default_factory=set)  # placed, answered Allocated
    released: set[str] = field(default_factory=set)  # release acknowledged
    gave_up: set[str] = field(default_factory=set)  # timed out (or refused), then released
    statuses: list[int] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)


def _server_pids(data: Path) -> list[int]:
    """The postmaster and every process it started (backends, background workers)."""
    postmaster = postmaster_pid(data)
    assert postmaster is not None
    children = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(postmaster)], capture_output=True, text=True
    ).stdout.split()
    return [postmaster, *(int(pid) for pid in children)]


async def _in_transaction_pids(url: str) -> list[int]:
    """The service's backends inside a transaction right now."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'llmgw-inventory'"
            " AND state IN ('active', 'idle in transaction')"
        )
    finally:
        await conn.close()
    return [r["pid"] for r in rows]


@contextlib.contextmanager
def paused(pids: list[int]) -> Iterator[None]:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def _release_until_acknowledged(
    client: httpx.AsyncClient, replica: str, history: History
) -> None:
    for attempt in range(200):
        try:
            answer = await client.post(
                "/graphql", json={"query": RELEASE, "variables": {"id": replica}}, timeout=10
            )
        except httpx.TransportError:
            await asyncio.sleep(0.2)
            continue
        history.statuses.append(answer.status_code)
        if answer.status_code == 200 and not answer.json().get("errors"):
            history.released.add(replica)
            return
        await asyncio.sleep(min(1.0, 0.1 * (attempt + 1)))
    raise AssertionError(f"the release of {replica} was never acknowledged")


async def _scheduler(
    url: str, n: int, history: History, stop: asyncio.Event, rng: random.Random
) -> None:
    async with httpx.AsyncClient(base_url=url) as client:
        k = 0
        while not stop.is_set():
            replica = f"s{n}-{k}"
            k += 1
            try:
                answer = await client.post(
                    "/graphql",
                    json={"query": PLACE, "variables": placement(replica, gpusPerShard=1)},
                    headers={"X-Client-Timeout": f"{WAITS:g}"},
                    timeout=WAITS,
                )
            except httpx.TimeoutException:
                # Gave up on it: release it, and never use this id again.
                history.gave_up.add(replica)
                await _release_until_acknowledged(client, replica, history)
                continue
            history.statuses.append(answer.status_code)
            body = answer.json()
            if body.get("errors"):
                history.codes.append(body["errors"][0]["extensions"]["code"])
                history.gave_up.add(replica)
                await _release_until_acknowledged(client, replica, history)
                continue
            if body["data"]["place"]["__typename"] != "Allocated":
                await asyncio.sleep(0.05)  # no room: some is released soon
                continue
            history.acknowledged.add(replica)
            # Most are released; the rest stay held to the end.
            if rng.random() < 0.8:
                await _release_until_acknowledged(client, replica, history)


async def test_no_replica_released_after_a_timeout_holds_gpus_when_postgresql_pauses(
    own_postgres: Path,
) -> None:
    server = EmbeddedPostgres(own_postgres)
    url = libpq_url(server.url)
    service = LiveService(
        database_url=url,
        port=free_port(),
        env={"INVENTORY_DB_TIMEOUT": "1", "INVENTORY_REQUEST_TIMEOUT": "10"},
    )
    service.start()
    history = History()
    try:
        base = service.url.removesuffix("/graphql")
        async with httpx.AsyncClient(base_url=base) as admin:
            for i in range(NODES):
                registered = await admin.post(
                    "/graphql",
                    json={
                        "query": REGISTER,
                        "variables": {"input": node_input(f"h-{i}", gpus=gpus(H100, 8))},
                    },
                )
                assert not registered.json().get("errors"), registered.text
        stop = asyncio.Event()
        rng = random.Random(37)
        schedulers = [
            asyncio.create_task(_scheduler(base, n, history, stop, random.Random(rng.random())))
            for n in range(SCHEDULERS)
        ]
        for k in range(PAUSES):
            await asyncio.sleep(rng.uniform(0.5, 1.0))
            whole = k % 4 == 0
            pids = _server_pids(own_postgres) if whole else await _in_transaction_pids(url)
            with paused(pids):
                await asyncio.sleep(PAUSED_FOR)
        await asyncio.sleep(1.5)
        stop.set()
        await asyncio.gather(*schedulers)
    finally:
        service.stop()

    engine = create_engine(url, Settings())
    try:
        async with engine.connect() as conn:
            holding = set(
                (await conn.execute(text("SELECT DISTINCT replica_id FROM shards"))).scalars()
            )
        problems = await inconsistencies(engine)
    finally:
        await dispose(engine)
        server.stop()
    print(
        f"\n{len(history.acknowledged)} places acknowledged, {len(history.gave_up)} given up "
        f"and released ({', '.join(sorted(set(history.codes))) or 'timeouts only'}), "
        f"{len(holding)} replicas holding GPUs at the end"
    )
    assert history.gave_up, "no place was caught by a pause: the test proved nothing"
    late = sorted(holding & history.gave_up)
    assert not late, f"held for replicas their schedulers released after a timeout: {late}"
    assert holding == history.acknowledged - history.released
    assert not problems, problems
    assert all(s == 200 or s == 503 for s in history.statuses), sorted(set(history.statuses))
