"""A group's stored spec reads back as the request it was (scaleGroup and retries rely on it).

scaleGroup plans new replicas with the role's shape read back from the stored
spec (request_from_spec), and placeGroup tells a retry from a clash by
comparing specs: a field that does not survive the round trip is a shape
silently lost (a toleration dropped places on nothing, or a clash refused
as INVALID). Seeded over every field a shape has.
"""

from __future__ import annotations

import json
import random

from service.scheduling.groups import GroupRequest, GroupRole, Locality, LocalityLevel
from service.scheduling.groups.requests import request_from_spec
from service.scheduling.place_request import PlaceRequest
from service.scheduling.taints import TaintEffect, Toleration, TolerationOperator


def random_toleration(rng: random.Random) -> Toleration:
    operator = rng.choice(list(TolerationOperator))
    return Toleration(
        key=rng.choice(["burn-in", "xid-79", "maintenance"]),
        operator=operator,
        value=rng.choice([None, "week-1"]) if operator is TolerationOperator.EQUAL else None,
        effect=rng.choice([None, *TaintEffect]),
        toleration_seconds=rng.choice([None, 0, 30, 86_400]),
    )


def random_shape(rng: random.Random) -> PlaceRequest:
    return PlaceRequest(
        replica_id="",
        gpu_class=rng.choice(["H100-80GB", "GB200"]),
        gpus_per_shard=rng.choice([1, 2, 4, 8]),
        shards=rng.choice([1, 2]),
        fabric=rng.choice([None, "ib-a"]),
        weights=rng.choice([None, "llama-70b"]),
        min_local_disk_free=rng.choice([None, 40 << 30]),
        label=rng.choice([None, ("rack", "r1")]),
        nvlink_shards=rng.random() < 0.5,
        same_nvlink_domain=rng.random() < 0.3,
        rail_aligned=rng.random() < 0.3,
        max_age=rng.choice([None, 60]),
        weights_ready=rng.random() < 0.3,
        tolerations=tuple(random_toleration(rng) for _ in range(rng.choice([0, 1, 3]))),
    )


def test_a_stored_spec_reads_back_as_the_request_it_was() -> None:
    rng = random.Random(39)
    for i in range(300):
        group = GroupRequest(
            group_id=f"g{i}",
            roles=tuple(
                GroupRole(f"r{k}", rng.randint(1, 4), random_shape(rng))
                for k in range(rng.randint(1, 3))
            ),
            locality=Locality(
                rng.choice(list(LocalityLevel)), rng.choice([None, "rack"]), rng.random() < 0.5
            ),
            kv_from=None,
            kv_to=None,
        )
        # As stored: through JSON text (groups.spec is jsonb).
        stored = json.loads(json.dumps(group.spec()))
        back = request_from_spec(group.group_id, stored)
        assert back == group, (i, group, back)
        assert back.spec() == group.spec()
