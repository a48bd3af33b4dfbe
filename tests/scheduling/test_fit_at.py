"""fit(at: T) equals what place does at T: a seeded random differential over clusters with reservations and maintenance windows.

Each seed builds a cluster (nodes of 4 or 8 H100, some GPUs sick), books
maintenance windows on some nodes (over by T, in progress at T, draining at
T, or drained only after T), places replicas (some promising to be gone by
a time, `until`), and makes reservations whose windows end before T, are in
force at T, or start after it, all seconds from now. It asks fit(shape, at:
T) and freeGpus(at: T); then, once T has passed, the timeline runs (as every
process runs it), the replicas that promised to be gone by T are released
(as their schedulers would), and the shape is placed until Unplaceable: the
count is fit's; the GPUs one-GPU places take until Unplaceable are
freeGpus(at: T)'s, and so are freeGpus' but for the nodes of a window
draining at T (listed now, their taint PREFER_NO_SCHEDULE withholding
nothing) (docs/scheduler/reservations.md).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.maintenance import SCHEDULE, at, one_round, window_input
from tests.support.place_group import role
from tests.support.reports import H100, REGISTER, gpus, node_input
from tests.support.reservations import iso, reserve, soon, tick, until_past
from tests.support.tenancy import PLACE, RELEASE, place, quota, set_tenant

FIT_AT = """
query F($shape: PlaceInput!, $at: DateTime) { fit(shape: $shape, at: $at) { replicas } }
"""
FREE_AT = """
query F($at: DateTime) { freeGpus(gpuClass: "H100-80GB", at: $at) { node { id } gpuIndices } }
"""
FREE_NOW = 'query F { freeGpus(gpuClass: "H100-80GB") { node { id } gpuIndices } }'


# Maintenance windows by where T falls in them: (start, end) seconds from T,
# drainLead seconds. All but the last drain from the moment they are booked,
# so nothing is placed or set aside on their nodes meanwhile (place's rule)
# and no start stops a replica fit(at: T) counted as held.
WINDOWS = {
    "over": (-1.5, -0.5, 3600),
    "in_progress": (-1.0, 5.0, 3600),
    "draining": (2.0, 6.0, 3600),
    "later": (10.0, 20.0, 5),
}


async def book_windows(api: Api, rng: random.Random, t: datetime, nodes: list[str]) -> list[str]:
    """Windows on a few nodes (one each); the nodes of those draining at T."""
    draining = []
    for node_id in rng.sample(nodes, rng.randint(0, 2)):
        kind = rng.choice(sorted(WINDOWS))
        start, end, lead = WINDOWS[kind]
        window = window_input(
            f"mw-{node_id}",
            [node_id],
            iso(t + timedelta(seconds=start)),
            iso(t + timedelta(seconds=end)),
            drain_lead=lead,
        )
        booked = (await api(SCHEDULE, {"input": window}))["scheduleMaintenance"]
        assert booked["id"] == f"mw-{node_id}", booked
        if kind == "draining":
            draining.append(node_id)
    return draining


async def build(api: Api, rng: random.Random, t: datetime) -> tuple[list[str], list[str]]:
    """The cluster and what holds it; the replica ids due to be released by T, and the
    nodes of a maintenance window draining at T."""
    nodes = []
    for i in range(rng.randint(3, 5)):
        count = rng.choice([4, 8, 8])
        report = gpus(H100, count)
        for g in report:
            if rng.random() < 0.08:
                g["healthy"] = False
                g["healthReasons"] = ["ECC"]
        await api(REGISTER, {"input": node_input(f"n{i}", gpus=report)})
        nodes.append(f"n{i}")
    draining = await book_windows(api, rng, t, nodes)
    await set_tenant(api, "owner")
    await set_tenant(api, "batch")
    limit = rng.choice([None, None, 16])
    await set_tenant(api, "fitter", *([quota(limit=limit)] if limit is not None else []))
    due: list[str] = []
    now = soon(0)
    windows = [
        (now + timedelta(seconds=0.8), now + timedelta(seconds=1.6)),  # over by T
        (now + timedelta(seconds=1.0), None),  # in force at T
        (now + timedelta(seconds=1.2), t + timedelta(seconds=5)),  # in force at T
        (t + timedelta(seconds=2), t + timedelta(seconds=6)),  # starts after T
    ]
    for k in range(rng.randint(1, 3)):
        start, end = rng.choice(windows)
        fields: dict[str, Any] = {"start": start, "end": end} if end else {"start": start}
        per = rng.choice([2, 4, 8])
        await reserve(
            api,
            f"res-{k}",
            tenant=rng.choice(["owner", "fitter"]),
            count=rng.randint(1, 2),
            shape={"replicaId": "s", "gpuClass": "H100-80GB", "gpusPerShard": per},
            **fields,
        )
    for k in range(rng.randint(2, 6)):
        until = rng.choice([None, None, t - timedelta(seconds=1), t, t + timedelta(seconds=9)])
        fields = {"until": iso(until)} if until is not None else {}
        tenant = rng.choice(["batch", "fitter"])
        got = await place(api, f"r{k}", per=rng.choice([1, 2, 4]), tenant=tenant, **fields)
        if got["__typename"] == "Allocated" and until is not None and until <= t:
            due.append(f"r{k}")
    return due, draining


async def taken_by_one_gpu_places(api: Api) -> dict[str, list[int]]:
    """The GPUs one-GPU places (no tenant, no promise) take until Unplaceable; released after."""
    taken: dict[str, list[int]] = {}
    ids = []
    while True:
        replica_id = f"sweep-{len(ids)}"
        shape = {"replicaId": replica_id, "gpuClass": "H100-80GB", "gpusPerShard": 1}
        got = (await api(PLACE, {"input": shape}))["place"]
        if got["__typename"] != "Allocated":
            break
        ids.append(replica_id)
        for a in got["allocations"]:
            taken.setdefault(a["nodeId"], []).extend(a["gpuIndices"])
    for replica_id in ids:
        await api(RELEASE, {"id": replica_id})
    return {node_id: sorted(indices) for node_id, indices in taken.items()}


@pytest.mark.seeds(range(6))
async def test_fit_at_equals_place_at(api: Api, engine: AsyncEngine, seed: int) -> None:
    rng = random.Random(seed)
    t = soon(4)
    due, draining = await build(api, rng, t)
    # The build ends before the window "over" ends: its node took nothing.
    assert datetime.now(UTC) < t + timedelta(seconds=WINDOWS["over"][1]), "build too slow"
    shapes = [
        {
            "replicaId": "probe",
            "gpuClass": "H100-80GB",
            "gpusPerShard": rng.choice([1, 2, 4, 8]),
            "shards": rng.choice([1, 1, 2]),
            "tenant": "fitter",
        }
        for _ in range(3)
    ]
    predicted = [
        (await api(FIT_AT, {"shape": shape, "at": iso(t)}))["fit"]["replicas"] for shape in shapes
    ]
    listed = {
        e["node"]["id"]: e["gpuIndices"] for e in (await api(FREE_AT, {"at": iso(t)}))["freeGpus"]
    }

    # T: the timeline's changes, and the promises kept.
    await until_past(t)
    await one_round(engine)
    await tick(engine)
    for replica_id in due:
        await api(RELEASE, {"id": replica_id})
    free_then = {e["node"]["id"]: e["gpuIndices"] for e in (await api(FREE_NOW))["freeGpus"]}
    assert {n: i for n, i in free_then.items() if n not in draining} == listed, (
        seed,
        free_then,
        listed,
    )
    assert await taken_by_one_gpu_places(api) == listed, (seed, listed)
    # Each shape placed until Unplaceable, then its probes released for the next.
    placed = []
    for k, shape in enumerate(shapes):
        ids = []
        while True:
            replica_id = f"probe-{k}-{len(ids)}"
            got = (await api(PLACE, {"input": {**shape, "replicaId": replica_id}}))["place"]
            if got["__typename"] != "Allocated":
                break
            ids.append(replica_id)
        placed.append(len(ids))
        for replica_id in ids:
            await api(RELEASE, {"id": replica_id})
    assert placed == predicted, (seed, shapes, placed, predicted)


FIT_GROUP_AT = """
query F($g: PlaceGroupInput!, $at: DateTime) { fitGroup(group: $g, at: $at) { groups } }
"""


async def test_fit_group_at_counts_what_a_reservation_frees_by_then(
    api: Api, engine: AsyncEngine
) -> None:
    for i in range(3):
        await api(REGISTER, {"input": node_input(f"n{i}")})
    await set_tenant(api, "owner")
    start, end = soon(1), soon(2)
    made = await reserve(api, "r", tenant="owner", count=2, start=start, end=end)
    assert made["__typename"] == "Reservation", made
    group = {"groupId": "pd", "roles": [role("prefill", 1, 4), role("decode", 1, 4)]}
    now = (await api(FIT_GROUP_AT, {"g": group, "at": None}))["fitGroup"]["groups"]
    later = (await api(FIT_GROUP_AT, {"g": group, "at": iso(end)}))["fitGroup"]["groups"]
    # One free node now (a group of 2x4 per node); all three once the window ends.
    assert (now, later) == (1, 3)
    await until_past(end)
    await tick(engine)
    assert (await api(FIT_GROUP_AT, {"g": group, "at": None}))["fitGroup"]["groups"] == later


async def test_fit_at_takes_out_the_nodes_a_maintenance_window_holds_then(api: Api) -> None:
    """A window in force at T keeps fit(at: T) off its nodes; one over by T does not."""
    for node_id, count in (("n0", 8), ("n1", 4), ("n2", 4)):
        await api(REGISTER, {"input": node_input(node_id, gpus=gpus(H100, count))})
    # n1: draining now (its drain began ten minutes before its start), over in 30 min.
    await api(SCHEDULE, {"input": window_input("now", ["n1"], at(1), at(1800), drain_lead=600)})
    # n0: from an hour on, for an hour.
    await api(SCHEDULE, {"input": window_input("later", ["n0"], at(3600), at(7200), drain_lead=0)})
    shape = {"replicaId": "probe", "gpuClass": "H100-80GB", "gpusPerShard": 4}
    t = (datetime.now(UTC) + timedelta(seconds=5400)).isoformat()
    now = (await api(FIT_AT, {"shape": shape, "at": None}))["fit"]["replicas"]
    then = (await api(FIT_AT, {"shape": shape, "at": t}))["fit"]["replicas"]
    # Now: n0 twice and n2 (n1 is draining); in 90 minutes: n1 and n2 (n0 is in its window).
    assert (now, then) == (3, 2)
