"""fit counted by the pool census answers what fit reading every pool answers, on random clusters.

A seeded differential (service/scheduling/pool_census.py): clusters of
NVSwitch boards, bridged pairs and 4-GPU nodes on one fabric or two, some
GPUs sick, some held, some tainted of each effect, some nodes cordoned; for
every shape the census may count (one shard, nvlinkShards or none, on a
fabric or any), the
whole answer (replicas, the first nodes and how many more, what limits the
rest) is the survey's, for a small and a large `first`.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import fit as fits
from service.scheduling.pool_census import DECLINED
from tests.support.api import Api
from tests.support.reports import H100, gpus
from tests.support.topology import bridged_pairs, hgx_h100
from tests.support.two_fabrics import random_cluster

CORDON = 'mutation C($id: ID!) { cordonNode(id: $id, reason: "maintenance") { id } }'
SHAPES = [
    PlaceRequest("x", "H100-80GB", per, nvlink_shards=nvlink, fabric=fabric)
    for per in (1, 2, 3, 4, 8)
    for nvlink in (False, True)
    for fabric in (None, "ib-a", "ib-b")
]


def boards(rng: random.Random) -> list[dict[str, Any]]:
    return rng.choice([hgx_h100(near=False), bridged_pairs(), gpus(H100, 4)])


@pytest.mark.seeds(range(6))
async def test_the_census_counts_what_reading_every_pool_counts(
    api: Api, engine: AsyncEngine, seed: int
) -> None:
    rng = random.Random(seed)
    await random_cluster(api, rng, nodes=(6, 12), gpus_of=boards)
    for i in rng.sample(range(6), k=2):
        await api(CORDON, {"id": f"n{i}"})
    declined = DECLINED.snapshot()
    for shape in SHAPES:
        assert fits.counted_by_census(shape)
        for first in (1, 3, 100):
            async with connections.read_only(engine) as conn:
                counted = await fits.fit(conn, shape, first=first)
                surveyed = await fits.fit(conn, shape, first=first, census=False)
            assert counted == surveyed, (seed, shape, first)
    assert DECLINED.snapshot() == declined


def test_the_census_counts_only_what_its_kinds_tell_apart() -> None:
    """Shapes that read more than a pool row says are counted by reading every pool."""
    for shape in (
        PlaceRequest("x", "H100-80GB", 4, shards=2),
        PlaceRequest("x", "H100-80GB", 4, weights="/models/x"),
        PlaceRequest("x", "H100-80GB", 4, label=("rack", "r1")),
        PlaceRequest("x", "H100-80GB", 4, min_local_disk_free=1),
        PlaceRequest("x", "H100-80GB", 4, max_age=60),
        PlaceRequest("x", "H100-80GB", 4, nvlink_shards=True, same_nvlink_domain=True),
    ):
        assert not fits.counted_by_census(shape), shape
