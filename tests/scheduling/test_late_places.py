"""No GPUs held for a replica its scheduler gave up on: release tombstones and client deadlines.

The stories a scheduler relies on (docs/scheduler/deadlines.md):

- a releaseReplica of an id that holds nothing leaves a tombstone: a place or
  allocate of that id is refused (CONFLICT, naming when it was released and
  until when), on both routes and inside a batch of places, until it expires;
- a place still committing while the release runs is waited for, and its
  GPUs freed; a place arriving while the release commits sees the tombstone;
- with X-Client-Timeout, a write that would commit after the client stopped
  waiting is rolled back: one stuck behind a lock, and one whose COMMIT
  reaches a server that was paused past the deadline;
- a malformed, past or absurd X-Client-Timeout is BAD_INPUT naming it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.database import request_state
from service.database.connections import NativeConnection
from service.database.request_state import ClientDeadline, DeadlinePassed
from service.database.transactions import in_transaction
from service.fleet.liveness import sweep
from service.scheduling.allocations import Allocated, ReplicaReleased, release_replica
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import place
from service.web.app import create_app
from tests.support.api import Api
from tests.support.reports import (
    ALLOCATE,
    H100,
    PLACE,
    REGISTER,
    allocation,
    gpus,
    node_input,
    shard,
)
from tests.support.reports import placement as placement_input
from tests.support.waiting import until

RELEASE = "mutation Release($id: ID!) { releaseReplica(replicaId: $id) }"


async def cluster(api: Api, nodes: int = 1) -> None:
    for i in range(nodes):
        await api(REGISTER, {"input": node_input(f"n-{i}", gpus=gpus(H100, 8))})


def parsed(moment: str) -> datetime:
    return datetime.fromisoformat(moment.replace("Z", "+00:00"))


async def held_by(engine: AsyncEngine, replica_id: str) -> int:
    async with engine.connect() as conn:
        return int(
            await conn.scalar(
                text("SELECT count(*) FROM shards WHERE replica_id = :r"), {"r": replica_id}
            )
            or 0
        )


async def test_a_place_of_a_replica_released_while_holding_nothing_is_refused_naming_when(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient], engine: AsyncEngine
) -> None:
    for route, client in zip(("fast path", "strawberry"), both, strict=True):
        api = Api(client)
        await cluster(api)
        replica = f"gone-{route}"
        # The scheduler timed out and released a replica it never heard back about.
        assert (await api(RELEASE, {"id": replica}))["releaseReplica"] == 0
        error = await api.fails(PLACE, placement_input(replica, gpusPerShard=2))
        extensions = error["extensions"]
        assert extensions["code"] == "CONFLICT", error
        assert extensions["replicaId"] == replica
        released, until_ = parsed(extensions["releasedAt"]), parsed(extensions["tombstoneUntil"])
        assert until_ - released == timedelta(seconds=900)
        assert "released at" in error["message"] and "new replica id" in error["message"]
        # allocate takes the same write path.
        error = await api.fails(ALLOCATE, allocation(replica, shard(f"{replica}-s0", "n-0", 0)))
        assert error["extensions"]["code"] == "CONFLICT", error
        assert await held_by(engine, replica) == 0
        # Under a new id it is placed.
        placed = await api(PLACE, placement_input(f"{replica}-again", gpusPerShard=2))
        assert placed["place"]["__typename"] == "Allocated", placed
        await client.post("/graphql", json={"query": 'mutation { removeNode(id: "n-0") }'})


async def test_a_retried_release_naming_the_generation_leaves_no_tombstone(
    api: Api, engine: AsyncEngine
) -> None:
    await cluster(api)
    place_reading_generation = (
        "mutation P($input: PlaceInput!) { place(input: $input) {"
        " ... on Allocated { allocations { generation } } } }"
    )
    placed = await api(place_reading_generation, placement_input("known", gpusPerShard=2))
    generation = placed["place"]["allocations"][0]["generation"]
    release = "mutation R($id: ID!, $g: Int) { releaseReplica(replicaId: $id, generation: $g) }"
    assert (await api(release, {"id": "known", "g": generation}))["releaseReplica"] == 2
    # The scheduler lost that answer and retries: nothing to free, and it knew
    # the placement, so the id is not tombstoned.
    assert (await api(release, {"id": "known", "g": generation}))["releaseReplica"] == 0
    again = await api(PLACE, placement_input("known", gpusPerShard=2))
    assert again["place"]["__typename"] == "Allocated", again


async def test_in_a_batch_of_places_only_the_released_replica_is_refused(
    api: Api, engine: AsyncEngine
) -> None:
    await cluster(api, nodes=4)
    assert (await api(RELEASE, {"id": "batch-gone"}))["releaseReplica"] == 0
    ids = [f"batch-{i}" for i in range(7)] + ["batch-gone"]
    answers = await asyncio.gather(
        *(api.raw(PLACE, placement_input(r, gpusPerShard=2)) for r in ids)
    )
    for replica, body in zip(ids, answers, strict=True):
        if replica == "batch-gone":
            assert body["errors"][0]["extensions"]["code"] == "CONFLICT", body
        else:
            assert body["data"]["place"]["__typename"] == "Allocated", body
    assert await held_by(engine, "batch-gone") == 0


async def test_a_tombstone_expires_and_the_sweep_forgets_it(
    engine: AsyncEngine, settings: Settings
) -> None:
    app = create_app(settings.replace(release_tombstone=0.5), engine=engine, sweep=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://inventory"
    ) as client:
        api = Api(client)
        await cluster(api)
        await api(RELEASE, {"id": "brief"})
        assert (await api.fails(PLACE, placement_input("brief", gpusPerShard=2)))["extensions"][
            "code"
        ] == "CONFLICT"
        await asyncio.sleep(0.6)
        placed = await api(PLACE, placement_input("brief", gpusPerShard=2))
        assert placed["place"]["__typename"] == "Allocated", placed
        await api(RELEASE, {"id": "other"})
    await asyncio.sleep(0.6)
    await in_transaction(engine, lambda conn: sweep(conn, 30, 300))
    async with engine.connect() as conn:
        left = (await conn.execute(text("SELECT replica_id FROM replicas"))).scalars().all()
    # "brief" holds its GPUs (its row stays, no tombstone); "other" expired and is gone.
    assert left == ["brief"]


def _request(replica_id: str) -> PlaceRequest:
    return PlaceRequest(replica_id, "H100-80GB", 2)


async def _waits_for_a_lock(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        waiting = await conn.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND state = 'active'"
            )
        )
    return bool(waiting)


async def test_a_release_while_a_place_commits_waits_for_it_and_frees_its_gpus(
    api: Api, engine: AsyncEngine
) -> None:
    await cluster(api)
    placed, commit = asyncio.Event(), asyncio.Event()

    async def placing(conn: NativeConnection) -> Any:
        outcome = await place(conn, _request("race-1"))
        placed.set()
        await commit.wait()  # the place's COMMIT, held back while the release runs
        return outcome

    place_task = asyncio.create_task(in_transaction(engine, placing))
    await placed.wait()
    release_task = asyncio.create_task(
        in_transaction(engine, lambda conn: release_replica(conn, "race-1", tombstone_for=60))
    )
    await until(lambda: _waits_for_a_lock(engine), "the release waiting for the place")
    commit.set()
    assert isinstance(await place_task, Allocated)
    assert await release_task == 2  # it saw the place's shards and freed them
    assert await held_by(engine, "race-1") == 0
    # It freed something: no tombstone, the id may be placed again.
    again = await in_transaction(engine, lambda conn: place(conn, _request("race-1")))
    assert isinstance(again, Allocated)


async def test_a_place_arriving_while_a_release_commits_sees_its_tombstone(
    api: Api, engine: AsyncEngine
) -> None:
    await cluster(api)
    released, commit = asyncio.Event(), asyncio.Event()

    async def releasing(conn: NativeConnection) -> int:
        freed = await release_replica(conn, "race-2", tombstone_for=60)
        released.set()
        await commit.wait()
        return freed

    release_task = asyncio.create_task(in_transaction(engine, releasing))
    await released.wait()
    place_task = asyncio.create_task(in_transaction(engine, lambda c: place(c, _request("race-2"))))
    await until(lambda: _waits_for_a_lock(engine), "the place waiting for the release")
    commit.set()
    assert await release_task == 0
    with pytest.raises(ReplicaReleased):
        await place_task
    assert await held_by(engine, "race-2") == 0


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("soon", "expected the seconds"),
        ("", "expected the seconds"),
        ("1e3", "expected the seconds"),
        ("-1", "already past"),
        ("0", "already past"),
        ("7200", "at most 3600"),
    ],
)
async def test_a_bad_client_timeout_is_bad_input_naming_it(
    client: httpx.AsyncClient, value: str, problem: str
) -> None:
    response = await client.post(
        "/graphql",
        json={"query": PLACE, "variables": placement_input("never", gpusPerShard=2)},
        headers={"X-Client-Timeout": value},
    )
    assert response.status_code == 400, response.text
    error = response.json()["errors"][0]
    assert error["extensions"] == {"code": "BAD_INPUT", "field": "X-Client-Timeout", "value": value}
    assert problem in error["message"] and "X-Client-Timeout" in error["message"]


async def test_a_place_stuck_behind_a_lock_past_its_deadline_is_rolled_back(
    api: Api, client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    await cluster(api)
    async with engine.connect() as holder:
        await holder.begin()
        await holder.execute(text("SELECT 1 FROM nodes WHERE id = 'n-0' FOR UPDATE"))
        started = asyncio.get_running_loop().time()
        response = await client.post(
            "/graphql",
            json={"query": PLACE, "variables": placement_input("stuck", gpusPerShard=2)},
            headers={"X-Client-Timeout": "0.5"},
        )
        took = asyncio.get_running_loop().time() - started
        await holder.rollback()
    error = response.json()["errors"][0]
    assert error["extensions"] == {"code": "DEADLINE_EXCEEDED", "timeoutSeconds": 0.5}, error
    # Stopped by the bounded statement_timeout, not by the request's 30 s limit.
    assert took < 5, took
    assert await held_by(engine, "stuck") == 0


async def test_a_commit_that_reaches_a_server_paused_past_the_deadline_is_rolled_back(
    engine: AsyncEngine,
) -> None:
    loop = asyncio.get_running_loop()

    async def write_then_pause(conn: NativeConnection) -> None:
        await conn.execute(text("INSERT INTO events (kind) VALUES ('late-commit')"))
        pid = await conn.scalar(text("SELECT pg_backend_pid()"))
        # The server stops right after answering: the COMMIT that follows
        # waits in its socket, past the client's deadline.
        os.kill(pid, signal.SIGSTOP)
        loop.call_later(0.8, os.kill, pid, signal.SIGCONT)

    state, token = request_state.begin()
    state.client_deadline = ClientDeadline(loop.time() + 0.4, 0.4)
    try:
        with pytest.raises(DeadlinePassed) as refused:
            await in_transaction(engine, write_then_pause)
    finally:
        request_state.end(token)
    assert refused.value.where == "at_commit"
    async with engine.connect() as conn:
        stored = await conn.scalar(text("SELECT count(*) FROM events WHERE kind = 'late-commit'"))
    assert stored == 0


PLACE_GROUP = """
mutation P($input: PlaceGroupInput!) {
  placeGroup(input: $input) { __typename ... on GroupPlaced { groupId } }
}
"""


def two_member_group(group_id: str) -> dict[str, Any]:
    shape = {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": 2}
    return {"groupId": group_id, "roles": [{"role": "decode", "replicas": 2, "shape": shape}]}


async def test_a_place_group_whose_member_was_released_while_holding_nothing_holds_nothing(
    api: Api, engine: AsyncEngine
) -> None:
    # A group member is an ordinary replica: its claim passes the same store
    # path, so a member id released while it held nothing refuses the group.
    await cluster(api)
    assert (await api(RELEASE, {"id": "late-decode-1"}))["releaseReplica"] == 0
    error = await api.fails(PLACE_GROUP, {"input": two_member_group("late")})
    assert error["extensions"]["code"] == "CONFLICT", error
    assert error["extensions"]["replicaId"] == "late-decode-1"
    # All or nothing: the other member holds nothing either, and no group is stored.
    assert await held_by(engine, "late-decode-0") == 0
    assert (await api('{ group(groupId: "late") { groupId } }'))["group"] is None
    placed = await api(PLACE_GROUP, {"input": two_member_group("later")})
    assert placed["placeGroup"]["__typename"] == "GroupPlaced"


async def test_a_place_group_stuck_behind_a_lock_past_its_deadline_is_rolled_back(
    api: Api, client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    await cluster(api)
    async with engine.connect() as holder:
        await holder.begin()
        await holder.execute(text("SELECT 1 FROM nodes WHERE id = 'n-0' FOR UPDATE"))
        response = await client.post(
            "/graphql",
            json={"query": PLACE_GROUP, "variables": {"input": two_member_group("stuck")}},
            headers={"X-Client-Timeout": "0.5"},
        )
        await holder.rollback()
    error = response.json()["errors"][0]
    assert error["extensions"] == {"code": "DEADLINE_EXCEEDED", "timeoutSeconds": 0.5}, error
    for member in ("stuck-decode-0", "stuck-decode-1"):
        assert await held_by(engine, member) == 0
