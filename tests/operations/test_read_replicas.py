"""Reads that tolerate staleness on a read replica, while it keeps up; everything else on the primary.

On the loopback pair of tests/support/pg_cluster.py with an asynchronous replica
whose replay the tests pause (pg_wal_replay_pause: it keeps receiving WAL
and stops applying it, as a replica stuck behind a long query or a slow
disk would). The stories a user relies on:

- a page of freeGpus or nodes, a node, gpuClasses, fit are read from the
  replica and the answer says so (`extensions.readFrom`), on both routes;
- with replay paused, answers read from the replica never claim to be more
  than INVENTORY_READ_MAX_LAG behind, and once it is further behind reads
  move to the primary (and see what the replica has not replayed);
- a request's maxAge bounds it too; writes, allocations and mutations'
  answers always read the primary;
- a replica unreachable at start or later: reads from the primary, said once
  in the log and in inventory_read_replica_up, and back to the replica when
  it answers again;
- INVENTORY_READ_DATABASE_URL malformed: a start-up error naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from service.config import SettingError, Settings
from service.database import read_routing
from service.database.db import create_engine, dispose
from service.database.migrations import upgrade
from service.web.app import create_app
from tests.support.api import Api
from tests.support.live_service import free_port
from tests.support.pg_cluster import Server, StandbyPair, running_pair
from tests.support.reports import H100, REGISTER, gpus, node_input
from tests.support.waiting import until

pytestmark = pytest.mark.process

MAX_LAG = 1.0
FREE_GPUS = '{ freeGpus(gpuClass: "H100-80GB") { node { id } gpuIndices } }'
NODES = "{ nodes { id } }"
GROUP = (
    '{groupId: "g", roles: [{role: "a", replicas: 1, '
    'shape: {replicaId: "x", gpuClass: "H100-80GB", gpusPerShard: 2}}]}'
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[StandbyPair, Server]]:
    with running_pair() as pair:
        upgrade(pair.url)
        replica = pair.add_replica(free_port())
        yield pair, replica


def settings_for(pair: StandbyPair, *replicas: Server, **changes: Any) -> Settings:
    return Settings(
        db_timeout=2,
        read_database_url=pair.url_of(*replicas),
        read_max_lag=MAX_LAG,
        **changes,
    )


class Service:
    """The app in-process on the pair, with `direct` execution (the fast path) on or off."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.api = Api(client)

    async def ask(self, query: str) -> dict[str, Any]:
        response = await self.client.post("/graphql", json={"query": query})
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        assert not body.get("errors"), body
        return body


@contextlib.asynccontextmanager
async def serving(pair: StandbyPair, settings: Settings) -> AsyncIterator[Service]:
    """The app in this process on the pair's primary, with these settings."""
    engine = create_engine(pair.url, settings)
    app = create_app(settings, engine=engine, sweep=False)
    # The app's lifespan (which starts the probe) does not run under ASGITransport.
    read_routing.start(engine)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://inventory"
        ) as client:
            yield Service(client)
    finally:
        await dispose(engine)


@pytest.fixture(params=[True, False], ids=["fast-path", "strawberry"])
async def service(
    request: pytest.FixtureRequest, cluster: tuple[StandbyPair, Server]
) -> AsyncIterator[Service]:
    pair, replica = cluster
    pair.primary.sql("TRUNCATE nodes CASCADE")
    async with serving(pair, settings_for(pair, replica, fast_path=request.param)) as s:
        yield s


async def caught_up(replica: Server, node_id: str) -> None:
    async def there() -> bool:
        return replica.sql(f"SELECT count(*) FROM nodes WHERE id = '{node_id}'") == "1"

    await until(there, f"{node_id} replayed on the replica")


def read_from(body: dict[str, Any]) -> dict[str, Any]:
    extensions = body.get("extensions") or {}
    entry: dict[str, Any] = extensions.get("readFrom") or {}
    return entry


async def test_staleness_tolerant_reads_go_to_the_replica_and_say_so(
    service: Service, cluster: tuple[StandbyPair, Server]
) -> None:
    _, replica = cluster
    await service.api(REGISTER, {"input": node_input("r-1", gpus=gpus(H100, 8))})
    await caught_up(replica, "r-1")

    async def from_replica(query: str) -> dict[str, Any]:
        async def answered() -> dict[str, Any] | None:
            body = await service.ask(query)
            return body if read_from(body).get("source") == "replica" else None

        return await until(answered, f"{query} read from the replica")

    body = await from_replica(FREE_GPUS)
    assert body["data"]["freeGpus"] == [{"node": {"id": "r-1"}, "gpuIndices": list(range(8))}]
    assert 0 <= read_from(body)["lagSeconds"] <= MAX_LAG
    for query in (
        NODES,
        '{ node(id: "r-1") { id state gpus { index } } }',
        "{ gpuClasses { gpuClass free } }",
        "{ fabrics { name } }",
        # Placement groups' reads (issue 39's), by the same route.
        "{ groups { groupId } }",
        '{ group(groupId: "g") { groupId } }',
        f"{{ fitGroup(group: {GROUP}) {{ groups }} }}",
        f"{{ explainGroupPlacement(input: {GROUP}) {{ placeable }} }}",
    ):
        assert read_from(await from_replica(query))["lagSeconds"] <= MAX_LAG

    # What a scheduler reads back after writing, and writes themselves: the
    # primary, and no readFrom (nothing was routed).
    for query in ('{ allocations(replicaId: "x") { shardId } }', "{ events(first: 1) { id } }"):
        assert "readFrom" not in ((await service.ask(query)).get("extensions") or {})
    registered = await service.client.post(
        "/graphql", json={"query": REGISTER, "variables": {"input": node_input("r-2")}}
    )
    assert "extensions" not in registered.json(), registered.text


async def test_reads_move_to_the_primary_once_the_replica_is_further_behind_than_allowed(
    service: Service, cluster: tuple[StandbyPair, Server]
) -> None:
    _, replica = cluster
    await service.api(REGISTER, {"input": node_input("lag-1")})
    await caught_up(replica, "lag-1")
    replica.pause_replay()
    try:
        # Written after the pause: on the primary only.
        await service.api(REGISTER, {"input": node_input("lag-2")})
        seen: list[tuple[str, float, bool]] = []

        async def moved() -> bool:
            body = await service.ask(NODES)
            entry = read_from(body)
            ids = {n["id"] for n in body["data"]["nodes"]}
            seen.append((entry["source"], entry["lagSeconds"], "lag-2" in ids))
            return entry["source"] == "primary"

        await until(moved, "reads moved to the primary")
        # Never read from the replica while it was further behind than allowed,
        # and the replica never showed what it had not replayed.
        for source, lag, has_new in seen:
            if source == "replica":
                assert lag <= MAX_LAG and not has_new, seen
        assert seen[-1][2], "the primary's answer has the node written after the pause"
        # A request's maxAge bounds it as well: a paused replica is never within 0 s.
        body = await service.ask("{ nodes(maxAge: 3600) { id } }")
        assert read_from(body)["source"] == "primary", body
    finally:
        replica.resume_replay()
    await caught_up(replica, "lag-2")

    async def back() -> bool:
        return read_from(await service.ask(NODES)).get("source") == "replica"

    await until(back, "reads back on the replica once it caught up")


async def test_a_request_max_age_below_the_replica_lag_reads_the_primary(
    cluster: tuple[StandbyPair, Server],
) -> None:
    pair, replica = cluster
    async with serving(pair, settings_for(pair, replica).replace(read_max_lag=3600)) as service:
        await service.api(REGISTER, {"input": node_input("age-1")})
        await caught_up(replica, "age-1")
        replica.pause_replay()
        try:
            await service.api(REGISTER, {"input": node_input("age-2")})

            async def behind() -> bool:
                lag = replica.sql(
                    "SELECT extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())"
                )
                return float(lag) > 2

            await until(behind, "the replica more than 2 s behind")
            # Within INVENTORY_READ_MAX_LAG (an hour): the replica.
            lagging = await service.ask("{ nodes(maxAge: 3600) { id } }")
            assert read_from(lagging)["source"] == "replica", lagging
            # maxAge 1 asks for at most a second: the primary.
            fresh = await service.ask("{ nodes(maxAge: 1) { id } }")
            assert read_from(fresh)["source"] == "primary", fresh
        finally:
            replica.resume_replay()


async def test_an_unreachable_replica_is_said_once_and_reads_go_to_the_primary(
    cluster: tuple[StandbyPair, Server], caplog: pytest.LogCaptureFixture
) -> None:
    pair, _ = cluster
    dead = free_port()
    settings = Settings(
        db_timeout=1,
        read_database_url=f"postgresql://postgres@127.0.0.1:{dead}/postgres",
        read_max_lag=MAX_LAG,
    )
    caplog.set_level(logging.INFO, "service.database.read_routing")
    async with serving(pair, settings) as service:
        await service.api(REGISTER, {"input": node_input("dead-1")})
        for _ in range(5):
            body = await service.ask(NODES)
            assert read_from(body)["source"] == "primary", body
            await asyncio.sleep(0.3)
        metrics = (await service.client.get("/metrics")).text
        assert f'inventory_read_replica_up{{replica="127.0.0.1:{dead}"}} 0' in metrics
    said = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert f"127.0.0.1:{dead}" in said[0].getMessage()


async def test_a_replica_that_goes_away_and_comes_back(
    service: Service, cluster: tuple[StandbyPair, Server]
) -> None:
    _, replica = cluster
    await service.api(REGISTER, {"input": node_input("away-1")})
    await caught_up(replica, "away-1")

    async def source() -> str:
        return str(read_from(await service.ask(NODES)).get("source"))

    await until(lambda: _is(source, "replica"), "reads on the replica")
    await asyncio.to_thread(replica.stop, "fast")
    try:
        # Every answer meanwhile is whole, from the primary.
        await until(lambda: _is(source, "primary"), "reads on the primary")
        body = await service.ask(NODES)
        assert {n["id"] for n in body["data"]["nodes"]} >= {"away-1"}
    finally:
        await asyncio.to_thread(replica.start)
    await until(lambda: _is(source, "replica"), "reads back on the replica")


async def _is(source: Any, wanted: str) -> bool:
    return bool(await source() == wanted)


def test_a_malformed_read_database_url_stops_start_up_naming_the_variable() -> None:
    with pytest.raises(SettingError, match="INVENTORY_READ_DATABASE_URL") as refused:
        Settings.from_env({"INVENTORY_READ_DATABASE_URL": "mysql://reader:secret@db/x"})
    assert "secret" not in str(refused.value)
    with pytest.raises(SettingError, match="INVENTORY_READ_MAX_LAG"):
        Settings.from_env({"INVENTORY_READ_MAX_LAG": "-1"})
