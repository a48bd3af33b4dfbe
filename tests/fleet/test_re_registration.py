"""Agents re-register on every restart: the same report changes nothing, a different one is logged as a change."""

from __future__ import annotations

import asyncio

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks.cluster import to_report
from service import metrics
from service.database import connections
from service.fleet import node_writes, re_registration
from service.scheduling import allocations
from service.scheduling.allocations import Allocated, AllocationRequest, ShardRequest
from tests.support.api import Api
from tests.support.reports import H100, REGISTER, TB, gpus, node_input
from tests.support.statements import StatementCounter

EVENTS = '{ events(nodeId: "gpu-07") { kind } }'


async def kinds(api: Api) -> list[str]:
    return [e["kind"] for e in (await api(EVENTS))["events"]]


async def test_the_same_report_again_writes_only_the_node_row(
    api: Api, count_statements: StatementCounter
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    count_statements.statements.clear()

    await api(REGISTER, {"input": node_input("gpu-07")})

    writes = [s for s in count_statements.statements if not s.lstrip().startswith("SELECT")]
    assert len(writes) == 1, writes
    assert await kinds(api) == ["registered"]


async def test_a_changed_report_is_logged_as_a_change_not_a_new_node(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})

    await api(REGISTER, {"input": node_input("gpu-07", gpus=gpus(H100, 4))})

    assert await kinds(api) == ["registered", "report_changed"]


# A known, alive node whose GPUs did not change is stored in one statement
# without a transaction block (service/fleet/re_registration.py); everything else
# takes the transaction, and says why.

STORAGE = [
    {"id": "nvme0", "mountPoint": "/data", "shared": False, "freeBytes": 3 * TB,
     "totalBytes": 4 * TB},
    {"id": "filer", "mountPoint": "/mnt/filer", "shared": True, "freeBytes": 50 * TB,
     "totalBytes": 100 * TB},
]  # fmt: skip
NODE = '{ node(id: "gpu-07") { localDisk { freeBytes } storage { id freeBytes } gpus { index healthy } } }'


def counted() -> dict[tuple[str, str], int]:
    return metrics.registrations()


def since(before: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    now = counted()
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}


async def test_disk_space_moving_is_one_statement_without_begin(
    api: Api, count_statements: StatementCounter
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07", storage=STORAGE)})
    count_statements.statements.clear()
    count_statements.transactions = 0
    before = counted()

    moved = [{**STORAGE[0], "freeBytes": 2 * TB}]  # and the filer is gone
    await api(REGISTER, {"input": node_input("gpu-07", storage=moved)})

    writes = [s for s in count_statements.statements if not s.lstrip().startswith("SELECT")]
    assert len(writes) == 1, writes
    assert count_statements.transactions == 0
    assert since(before) == {("one_statement", "changed"): 1}
    node = (await api(NODE))["node"]
    assert node["localDisk"]["freeBytes"] == 2 * TB
    assert node["storage"] == [{"id": "nvme0", "freeBytes": 2 * TB}]
    assert await kinds(api) == ["registered", "report_changed"]


async def test_the_same_report_again_is_one_row_updated(
    api: Api, count_statements: StatementCounter
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    before = counted()
    count_statements.statements.clear()

    await api(REGISTER, {"input": node_input("gpu-07")})

    assert since(before) == {("one_statement", "same_as_last_stored"): 1}
    (write,) = [s for s in count_statements.statements if not s.lstrip().startswith("SELECT")]
    assert write.lstrip().startswith("UPDATE nodes")


async def test_the_same_report_stored_by_another_process_is_one_statement(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    re_registration._LAST_STORED.clear()  # this process did not store it
    before = counted()

    await api(REGISTER, {"input": node_input("gpu-07")})

    assert since(before) == {("one_statement", "unchanged"): 1}


async def test_a_report_this_process_stored_but_another_changed_since_is_stored_again(
    api: Api, engine: AsyncEngine
) -> None:
    """The digest this process remembers is a hint: the stored one decides."""
    first = node_input("gpu-07", storage=STORAGE[:1])
    await api(REGISTER, {"input": first})
    async with connections.transaction(engine) as elsewhere:
        await node_writes.register_node(elsewhere, to_report(node_input("gpu-07", storage=STORAGE)))
    before = counted()

    await api(REGISTER, {"input": first})

    assert since(before) == {("one_statement", "changed"): 1}
    assert [fs["id"] for fs in (await api(NODE))["node"]["storage"]] == ["nvme0"]


async def test_a_gpu_turning_unhealthy_takes_the_transaction_and_counts_the_pool(
    api: Api,
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    before = counted()
    sick = gpus(H100)
    sick[3] = {**sick[3], "healthy": False, "healthReasons": ["ecc_uncorrected"]}

    await api(REGISTER, {"input": node_input("gpu-07", gpus=sick)})

    assert since(before) == {("transaction", "gpus_changed"): 1}
    free = await api('{ freeGpus(gpuClass: "H100-80GB") { node { id } gpuIndices } }')
    assert free["freeGpus"][0]["gpuIndices"] == [0, 1, 2, 4, 5, 6, 7]


async def test_a_new_node_an_unreachable_one_a_reboot_and_xids_take_the_transaction(
    api: Api, engine: AsyncEngine
) -> None:
    before = counted()
    await api(REGISTER, {"input": node_input("gpu-07", bootId="boot-1")})
    assert since(before) == {("transaction", "new_node"): 1}

    async with engine.begin() as conn:
        await conn.execute(text("UPDATE nodes SET liveness = 'unreachable' WHERE id = 'gpu-07'"))
    before = counted()
    registered = await api(REGISTER, {"input": node_input("gpu-07", bootId="boot-1")})
    assert since(before) == {("transaction", "coming_back"): 1}
    assert registered["registerNode"]["state"] == "READY"

    before = counted()
    await api(REGISTER, {"input": node_input("gpu-07", bootId="boot-2")})
    assert since(before) == {("transaction", "rebooted"): 1}

    before = counted()
    await api(
        REGISTER, {"input": node_input("gpu-07", bootId="boot-2", gpus=gpus(H100, xids=[13]))}
    )
    assert since(before) == {("transaction", "xids"): 1}
    assert await kinds(api) == ["registered", "back"] + ["gpu_xid"] * 8


async def test_a_report_stored_while_this_one_waited_for_the_lock_sends_it_to_the_transaction(
    api: Api, engine: AsyncEngine
) -> None:
    """The statement's snapshot predates its lock: a report committed meanwhile is not in it.

    Here that report added a filesystem the waiting report does not list. Read
    from the snapshot, the filesystem would survive; the transaction reads
    after the lock and removes it.
    """
    await api(REGISTER, {"input": node_input("gpu-07", storage=STORAGE[:1])})
    before = counted()
    with_filer = node_input("gpu-07", storage=STORAGE)
    without_filer = node_input("gpu-07", storage=[{**STORAGE[0], "freeBytes": 1 * TB}])

    async with connections.transaction(engine) as holder:
        await node_writes.register_node(holder, to_report(with_filer))
        waiting = asyncio.create_task(api(REGISTER, {"input": without_filer}))
        await wait_for_lock_wait(engine)
    await waiting

    node = (await api(NODE))["node"]
    assert node["storage"] == [{"id": "nvme0", "freeBytes": 1 * TB}]
    assert node["localDisk"]["freeBytes"] == 1 * TB
    assert since(before) == {("transaction", "written_meanwhile"): 1}


async def test_an_allocation_committed_while_it_waited_leaves_the_pools_right(
    api: Api, engine: AsyncEngine
) -> None:
    """An allocation locks the node row without updating it: the report still goes in one statement.

    It may: the statement writes no pool and no GPU, so the allocation's own
    pool change is what stays.
    """
    await api(REGISTER, {"input": node_input("gpu-07", storage=STORAGE)})
    before = counted()
    moved = node_input("gpu-07", storage=[{**STORAGE[0], "freeBytes": 1 * TB}])

    async with connections.transaction(engine) as holder:
        request = AllocationRequest("r1", (ShardRequest("s1", "gpu-07", (0,)),))
        assert isinstance(await allocations.allocate(holder, request), Allocated)
        waiting = asyncio.create_task(api(REGISTER, {"input": moved}))
        await wait_for_lock_wait(engine)
    await waiting

    assert since(before) == {("one_statement", "changed"): 1}
    free = await api('{ freeGpus(gpuClass: "H100-80GB") { gpuIndices } }')
    assert free["freeGpus"][0]["gpuIndices"] == [1, 2, 3, 4, 5, 6, 7]
    assert (await api(NODE))["node"]["localDisk"]["freeBytes"] == 1 * TB


async def wait_for_lock_wait(engine: AsyncEngine) -> None:
    """Until some backend of this database waits for a row lock."""
    for _ in range(500):
        async with engine.connect() as conn:
            waiting = await conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no backend waited for the lock")


async def test_metrics_say_how_each_report_was_stored(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    await api(REGISTER, {"input": node_input("gpu-07")})

    exposition = await metrics.render(None)

    stored = [
        line
        for line in exposition.splitlines()
        if line.startswith("inventory_registrations_total{")
    ]
    assert 'inventory_registrations_total{path="transaction",reason="new_node"}' in "".join(stored)
    assert any(
        line.startswith(
            'inventory_registrations_total{path="one_statement",reason="same_as_last_stored"} '
        )
        for line in stored
    ), stored


POOL = text("SELECT fabrics, fabric_rates, nvlink_domain FROM gpu_pools WHERE node_id = 'gpu-07'")


async def pool_of(engine: AsyncEngine) -> tuple[list[str], list[int], str]:
    async with connections.autocommit(engine) as conn:
        row = (await conn.execute(POOL)).one()
    return list(row.fabrics), list(row.fabric_rates), row.nvlink_domain


async def test_a_report_that_changes_only_fabrics_rewrites_the_pools_they_are_on(
    api: Api, engine: AsyncEngine
) -> None:
    """Every pool carries its node's fabrics (gpu_pools.attached_fabrics): a change takes the recount."""
    ib = [{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}]
    domain = [{**g, "nvlinkDomain": "nvl/7"} for g in gpus(H100)]
    await api(REGISTER, {"input": node_input("gpu-07", fabrics=ib, gpus=domain)})
    assert await pool_of(engine) == (["ib-a"], [400], "nvl/7")
    before = counted()

    both = [*ib, {"fabric": "ib-b", "hcas": ["mlx5_1"], "rateGbps": 200}]
    await api(REGISTER, {"input": node_input("gpu-07", fabrics=both, gpus=domain)})
    assert since(before) == {("transaction", "fabrics_changed"): 1}
    assert await pool_of(engine) == (["ib-a", "ib-b"], [400, 200], "nvl/7")

    before = counted()
    slower = [{**both[0], "rateGbps": 100}, both[1]]
    await api(REGISTER, {"input": node_input("gpu-07", fabrics=slower, gpus=gpus(H100))})
    assert since(before) == {("transaction", "gpus_changed"): 1}
    assert await pool_of(engine) == (["ib-a", "ib-b"], [100, 200], "")

    # HCAs alone are not a pool's fact: one statement, the pool as it was.
    before = counted()
    moved = [{**slower[0], "hcas": ["mlx5_2"]}, slower[1]]
    await api(REGISTER, {"input": node_input("gpu-07", fabrics=moved, gpus=gpus(H100))})
    assert since(before) == {("one_statement", "changed"): 1}
    assert await pool_of(engine) == (["ib-a", "ib-b"], [100, 200], "")
