"""The quota counters are exact: a seeded random differential against a recount of what is held.

tenant_quotas.used is kept by triggers on allocated_gpus, so every path that
holds or frees GPUs must leave it equal to a count of the tenant's rows:
places (one by one and in shared transactions), allocate, releases of
replicas and shards, placement groups, a node's removal (cascades), a GPU
that leaves its node's report while held, LOST frees (the liveness
sweep's and an operator's free of held shards), the undo of an incomplete
claim, and setTenant changing, lowering, dropping and adding quotas. After
every operation the counters are compared with the recount, and no place
may have taken a tenant past its limit (a limit lowered below use only
forbids growing).

Varied clusters per seed: H100 and A100 nodes, nodes with both, one fabric,
two or none, unhealthy GPUs.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.connections import transaction
from service.fleet.fencing import free_held, hold_shards_on
from service.fleet.liveness import release_replicas_on
from service.scheduling.allocations import Rows, Wanted, store, store_statement
from tests.support.api import Api
from tests.support.reports import A100, H100, REGISTER, gpus, node_input
from tests.support.tenancy import ALLOCATE, PLACE, RELEASE, SET_TENANT
from tests.support.topology import IB_A, IB_B

CLASSES = ("H100-80GB", "A100-40GB")
TENANTS = ("t0", "t1", "t2", None)  # None: name none (default)

RECOUNT = text(
    """
    SELECT q.tenant, q.gpu_class, q.used, q.gpu_limit,
           (SELECT count(*) FROM allocated_gpus a
            WHERE a.tenant = q.tenant AND a.gpu_class = q.gpu_class) AS held
    FROM tenant_quotas q ORDER BY 1, 2
    """
)
PLACE_GROUP = "mutation P($g: PlaceGroupInput!) { placeGroup(input: $g) { __typename } }"
RELEASE_GROUP = "mutation R($id: ID!) { releaseGroup(groupId: $id) }"
RELEASE_SHARD = "mutation R($id: ID!) { releaseShard(shardId: $id) }"
REMOVE_NODE = "mutation R($id: ID!) { removeNode(id: $id) }"

# An incomplete claim, built as a claim's CTEs are: shard :shard_id on
# :node_id asking for :gpus, one of which another shard holds; the insert
# of allocated_gpus skips it, the claim comes out incomplete, and
# store_calls takes back what it wrote.
_PARTIAL = store_statement(
    Wanted(
        shards=Rows(
            {
                "call": "0",
                "replica_id": "CAST(:replica_id AS text)",
                "actor": "CAST(NULL AS text)",
                "shard_id": "CAST(:shard_id AS text)",
                "node_id": "CAST(:node_id AS text)",
                "gpu_indices": "CAST(:gpus AS int[])",
                "fabric": "CAST(NULL AS text)",
                "hcas": "CAST('{}' AS text[])",
                "weights": "CAST(NULL AS text)",
                "tolerations": "CAST(NULL AS jsonb)",
                "tenant": "CAST(:tenant AS text)",
                "priority": "0",
                "deployment": "CAST(NULL AS text)",
            }
        ),
        gpus=Rows(
            {
                "call": "0",
                "node_id": "CAST(:node_id AS text)",
                "idx": "i",
                "shard_id": "CAST(:shard_id AS text)",
            },
            "FROM unnest(CAST(:gpus AS int[])) i",
        ),
        go=Rows({"call": "0", "ok": "true"}),
    )
)


def node_report(rng: random.Random, node_id: str) -> dict[str, Any]:
    kind = rng.choice(["h100", "a100", "both"])
    if kind == "h100":
        entries = gpus(H100)
    elif kind == "a100":
        entries = gpus(A100)
    else:
        entries = gpus(H100, 4) + [dict(g, index=g["index"] + 4) for g in gpus(A100, 4)]
    for entry in entries:
        if rng.random() < 0.08:
            entry.update(healthy=False, healthReasons=["ecc_uncorrected"])
    fabrics = rng.choice([[IB_A], [IB_B], [IB_A, IB_B], []])
    return node_input(node_id, gpus=entries, fabrics=fabrics)


class Run:
    def __init__(self, api: Api, engine: AsyncEngine, rng: random.Random) -> None:
        self.api, self.engine, self.rng = api, engine, rng
        self.reports: dict[str, dict[str, Any]] = {}
        self.removed: set[str] = set()
        self.replicas: set[str] = set()
        self.groups: set[str] = set()
        self.n = 0

    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}-{self.n}"

    async def held_shards(self) -> list[tuple[str, str, str, list[int]]]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT shard_id, replica_id, node_id, gpu_indices FROM shards ORDER BY 1")
            )
            return [(r.shard_id, r.replica_id, r.node_id, list(r.gpu_indices)) for r in rows]

    async def place(self) -> None:
        tenant = self.rng.choice(TENANTS)
        shards = self.rng.choice([1, 1, 1, 2])
        shape = {
            "replicaId": self.fresh("p"),
            "gpuClass": self.rng.choice(CLASSES),
            "gpusPerShard": self.rng.randint(1, 4),
            "shards": shards,
            "tenant": tenant,
        }
        answer = (await self.api(PLACE, {"input": shape}))["place"]
        if answer["__typename"] == "Allocated":
            self.replicas.add(shape["replicaId"])

    async def burst(self) -> None:
        """Places at once: the process's shared transactions (place_batches.py)."""
        await asyncio.gather(*(self.place() for _ in range(self.rng.randint(3, 8))))

    async def allocate(self) -> None:
        live = sorted(set(self.reports) - self.removed)
        if not live:
            return
        node_id = self.rng.choice(live)
        indices = sorted(self.rng.sample(range(8), self.rng.randint(1, 2)))
        replica = self.fresh("a")
        shards = [{"shardId": f"{replica}-s0", "nodeId": node_id, "gpuIndices": indices}]
        answer = (
            await self.api(
                ALLOCATE,
                {
                    "input": {
                        "replicaId": replica,
                        "shards": shards,
                        "tenant": self.rng.choice(TENANTS),
                    }
                },
            )
        )["allocate"]
        if answer["__typename"] == "Allocated":
            self.replicas.add(replica)

    async def release(self) -> None:
        if self.replicas:
            replica = self.rng.choice(sorted(self.replicas))
            await self.api(RELEASE, {"id": replica})
            self.replicas.discard(replica)

    async def release_shard(self) -> None:
        held = await self.held_shards()
        if held:
            await self.api(RELEASE_SHARD, {"id": self.rng.choice(held)[0]})

    async def group(self) -> None:
        if self.groups and self.rng.random() < 0.5:
            group_id = self.rng.choice(sorted(self.groups))
            await self.api(RELEASE_GROUP, {"id": group_id})
            self.groups.discard(group_id)
            return
        group_id = self.fresh("g")
        shape = {"replicaId": "x", "gpuClass": "H100-80GB", "gpusPerShard": 2}
        group = {"groupId": group_id, "tenant": self.rng.choice(TENANTS),
                 "roles": [{"role": "r", "replicas": self.rng.randint(1, 3), "shape": shape}]}  # fmt: skip
        if (await self.api(PLACE_GROUP, {"g": group}))["placeGroup"]["__typename"] == "GroupPlaced":
            self.groups.add(group_id)

    async def remove_node(self) -> None:
        live = sorted(set(self.reports) - self.removed)
        if live:
            node_id = self.rng.choice(live)
            await self.api(REMOVE_NODE, {"id": node_id})
            self.removed.add(node_id)

    async def register(self) -> None:
        """A removed node comes back, or a node reports one GPU fewer (held or not), or all again."""
        if self.removed and self.rng.random() < 0.5:
            node_id = self.rng.choice(sorted(self.removed))
            self.removed.discard(node_id)
            report = self.reports[node_id]
        else:
            live = sorted(set(self.reports) - self.removed)
            if not live:
                return
            node_id = self.rng.choice(live)
            report = dict(self.reports[node_id])
            if self.rng.random() < 0.5:
                gone = self.rng.randrange(len(report["gpus"]))
                report["gpus"] = [g for i, g in enumerate(report["gpus"]) if i != gone]
        await self.api(REGISTER, {"input": report})

    async def lost(self) -> None:
        """A LOST node's replicas freed: by the sweep's policy free, or held and then freed by an operator."""
        live = sorted(set(self.reports) - self.removed)
        if not live:
            return
        node_id = self.rng.choice(live)
        async with transaction(self.engine) as conn:
            if self.rng.random() < 0.5:
                await release_replicas_on(conn, [node_id])
            else:
                await hold_shards_on(conn, [node_id], "differential")
                await free_held(conn, node_id, "differential", "lost, then freed")

    async def partial(self) -> None:
        """An incomplete claim: it asks for a GPU another shard holds; what it wrote is taken back."""
        held = await self.held_shards()
        if not held:
            return
        _, _, node_id, indices = self.rng.choice(held)
        taken = self.rng.choice(indices)
        asked = sorted({taken, *self.rng.sample(range(8), 2)})
        replica = self.fresh("partial")
        async with transaction(self.engine) as conn:
            outcome = await store(
                conn,
                _PARTIAL,
                {
                    "replica_id": replica,
                    "shard_id": f"{replica}-s0",
                    "node_id": node_id,
                    "gpus": asked,
                    "tenant": self.rng.choice(("t0", "t1", "t2")),
                },
            )
        assert type(outcome).__name__ in ("NotStored", "Refused"), outcome

    async def set_tenant(self) -> None:
        tenant = self.rng.choice(("t0", "t1"))
        quotas = []
        for gpu_class in CLASSES:
            if self.rng.random() < 0.75:
                guaranteed = self.rng.randint(0, 6)
                limit = self.rng.choice([None, guaranteed + self.rng.randint(0, 12)])
                quotas.append({"gpuClass": gpu_class, "guaranteed": guaranteed, "limit": limit})
        body = await self.api.raw(SET_TENANT, {"input": {"id": tenant, "quotas": quotas}})
        for error in body.get("errors") or ():
            # Every node of a class removed: a quota for it is refused, nothing changed.
            assert error["extensions"]["field"].endswith(".gpuClass"), error


async def counters(engine: AsyncEngine) -> dict[tuple[str, str], tuple[int, int | None, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(RECOUNT)
        return {(r.tenant, r.gpu_class): (r.used, r.gpu_limit, int(r.held)) for r in rows}


@pytest.mark.seeds([46, 4646, 464646])
async def test_counters_equal_a_recount_after_every_operation(
    api: Api, engine: AsyncEngine, seed: int
) -> None:
    rng = random.Random(seed)
    run = Run(api, engine, rng)
    for i in range(rng.randint(4, 7)):
        node_id = f"n{i}"
        run.reports[node_id] = node_report(rng, node_id)
        await api(REGISTER, {"input": run.reports[node_id]})
    await api(SET_TENANT, {"input": {"id": "t0", "quotas": [
        {"gpuClass": "H100-80GB", "guaranteed": 2, "limit": 10},
        {"gpuClass": "A100-40GB", "guaranteed": 0, "limit": 6}]}})  # fmt: skip
    await api(SET_TENANT, {"input": {"id": "t1", "quotas": [
        {"gpuClass": "H100-80GB", "guaranteed": 0, "limit": 6}]}})  # fmt: skip
    await api(SET_TENANT, {"input": {"id": "t2", "quotas": []}})
    operations: list[tuple[Callable[[], Awaitable[None]], int]] = [
        (run.place, 30), (run.burst, 6), (run.allocate, 10), (run.release, 14),
        (run.release_shard, 5), (run.group, 6), (run.remove_node, 3), (run.register, 6),
        (run.lost, 4), (run.partial, 5), (run.set_tenant, 5),
    ]  # fmt: skip
    kinds, weights = zip(*operations, strict=True)
    before = await counters(engine)
    for step in range(140):
        operation = rng.choices(kinds, weights)[0]
        await operation()
        after = await counters(engine)
        for key, (used, limit, held) in after.items():
            where = f"seed {seed}, step {step} ({operation.__name__}), {key}"
            assert used == held, f"{where}: counter {used}, recount {held}"
            if limit is not None and used > limit and operation.__name__ != "set_tenant":
                # Over only by a limit lowered below use: then nothing may grow.
                assert key in before and used <= before[key][0], f"{where}: {used} > {limit}"
        before = after
    # Everything released at the end: every counter back to zero.
    for replica in sorted(run.replicas):
        await api(RELEASE, {"id": replica})
    for group_id in sorted(run.groups):
        await api(RELEASE_GROUP, {"id": group_id})
    for shard_id, *_ in await run.held_shards():
        await api(RELEASE_SHARD, {"id": shard_id})
    final = await counters(engine)
    assert all(used == held == 0 for used, _, held in final.values()), final
