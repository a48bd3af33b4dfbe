"""Many agents heartbeat at once; the service writes their beats together, and each still gets its own answer."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.liveness import LOST_AFTER, run_sweep, silence
from tests.support.reports import REGISTER, node_input
from tests.support.statements import StatementCounter

HEARTBEAT = "mutation Beat($id: ID!) { heartbeat(nodeId: $id) { id state lastSeen } }"
FREE = '{ freeGpus(gpuClass: "H100-80GB") { node { id } } }'
BACK = '{ events(kinds: ["back"]) { nodeId reason } }'


async def test_agents_beating_at_once_each_get_their_own_node(
    api: Api, count_statements: StatementCounter
) -> None:
    ids = [f"gpu-{i:02d}" for i in range(24)]
    for node_id in ids:
        await api(REGISTER, {"input": node_input(node_id)})

    count_statements.statements.clear()

    replies = await asyncio.gather(*(api(HEARTBEAT, {"id": n}) for n in ids + ids))

    assert [r["heartbeat"]["id"] for r in replies] == ids + ids
    assert {r["heartbeat"]["state"] for r in replies} == {"READY"}
    updates = [s for s in count_statements.statements if "UPDATE nodes" in s]
    assert 1 <= len(updates) < len(ids), "48 beats should share a few UPDATEs"


async def test_a_stranger_in_a_crowd_of_beats_is_told_to_register(api: Api) -> None:
    ids = [f"gpu-{i:02d}" for i in range(8)]
    for node_id in ids:
        await api(REGISTER, {"input": node_input(node_id)})

    beats = [api.raw(HEARTBEAT, {"id": n}) for n in [*ids[:4], "never-registered", *ids[4:]]]
    replies = await asyncio.gather(*beats)

    stranger = replies[4]
    assert stranger["errors"][0]["extensions"]["code"] == "NODE_NOT_FOUND"
    assert "never-registered" in stranger["errors"][0]["message"]
    assert [r["data"]["heartbeat"]["id"] for r in replies[:4] + replies[5:]] == ids


async def test_a_lost_node_beating_among_others_comes_back_schedulable(
    api: Api, engine: AsyncEngine
) -> None:
    ids = [f"gpu-{i:02d}" for i in range(6)]
    for node_id in ids:
        await api(REGISTER, {"input": node_input(node_id)})
    await silence(engine, "gpu-03", LOST_AFTER + 1)
    await run_sweep(engine)
    assert "gpu-03" not in {e["node"]["id"] for e in (await api(FREE))["freeGpus"]}

    replies = await asyncio.gather(*(api(HEARTBEAT, {"id": n}) for n in ids))

    assert replies[3]["heartbeat"]["state"] == "READY"
    assert "gpu-03" in {e["node"]["id"] for e in (await api(FREE))["freeGpus"]}
    assert (await api(BACK))["events"] == [{"nodeId": "gpu-03", "reason": "heartbeat while lost"}]


async def test_beats_of_alive_nodes_are_stamped_without_a_transaction(
    api: Api, count_statements: StatementCounter
) -> None:
    ids = [f"gpu-{i:02d}" for i in range(10)]
    for node_id in ids:
        await api(REGISTER, {"input": node_input(node_id)})
    count_statements.transactions = 0

    replies = await asyncio.gather(*(api(HEARTBEAT, {"id": n}) for n in ids))
    assert [r["heartbeat"]["state"] for r in replies] == ["READY"] * len(ids)
    assert count_statements.transactions == 0

    stranger = await api.raw(HEARTBEAT, {"id": "never-registered"})
    assert stranger["errors"][0]["extensions"]["code"] == "NODE_NOT_FOUND"
    # The unknown node is looked up in a transaction (twice: the compiled
    # heartbeat leaves NODE_NOT_FOUND to graphql-core, which beats again).
    assert count_statements.transactions > 0


async def test_a_beat_and_an_unchanged_report_rewrite_no_index_of_the_node(
    api: Api, engine: AsyncEngine
) -> None:
    """Both only move last_seen: HOT updates (no index entry), or the churn of a
    cluster's beats bloats every index of nodes and slows every question until vacuum."""
    from service.database import connections
    from service.fleet import node_writes
    from service.fleet.reports import NodeReport

    ids = [f"gpu-{i:02d}" for i in range(5)]
    for node_id in ids:
        await api(REGISTER, {"input": node_input(node_id)})
    plain = NodeReport(id="plain-01", hostname="plain-01", mgmt_addr="10.0.0.9")
    async with connections.transaction(engine) as conn:
        assert (await node_writes.register_node(conn, plain)).created

    counts = text(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'nodes'"
    )
    async with connections.transaction(engine) as conn:
        # Counted on this backend around the writes: exact, not the sampled
        # statistics (the backend may still hold counts of earlier work).
        updated_before, hot_before = (await conn.execute(counts)).one()
        for _ in range(4):
            await node_writes.heartbeat_many(conn, ids)
        registration = await node_writes.register_node(conn, plain)
        updated_after, hot_after = (await conn.execute(counts)).one()
    updated, hot = updated_after - updated_before, hot_after - hot_before

    assert not registration.changed, "the same report again"
    assert updated == 4 * len(ids) + 1
    assert hot == updated


async def test_an_alive_beat_commits_without_waiting_for_the_flush_and_leaves_its_connection_as_it_was(
    api: Api, engine: AsyncEngine
) -> None:
    """node_writes._ALIVE_HEARTBEATS: synchronous_commit off for its own transaction only.

    The batch's connection is held across batches and then goes back to the
    pool (service/batches.py): a setting left on it would make some later
    registration or allocation commit without waiting for the disk.
    """
    from service.database import connections
    from service.fleet import node_writes

    await api(REGISTER, {"input": node_input("gpu-01")})
    sql, _ = connections.compile_text(node_writes._ALIVE_HEARTBEATS)
    async with connections.autocommit(engine) as conn:
        raw = conn.raw
        server_default = await raw.fetchval("SHOW synchronous_commit")
        # The setting is made by the statement itself, as it runs (the
        # EXPLAIN's beat is rolled back).
        explained = raw.transaction()
        await explained.start()
        plan = await raw.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", ["gpu-01"])
        setting_inside = await raw.fetchval("SHOW synchronous_commit")
        await explained.rollback()
        scans = [
            node for node in _plan_nodes(plan[0]["Plan"]) if node.get("CTE Name") == "no_flush_wait"
        ]
        assert [scan["Actual Rows"] for scan in scans] == [1]
        assert setting_inside == "off"

        before = (await api('{ node(id: "gpu-01") { lastSeen } }'))["node"]["lastSeen"]
        found = await node_writes.heartbeat_alive(conn, ["gpu-01"])
        assert list(found) == ["gpu-01"]
        assert await raw.fetchval("SHOW synchronous_commit") == server_default == "on"

    # Committed: another connection sees the stamp.
    after = (await api('{ node(id: "gpu-01") { lastSeen } }'))["node"]["lastSeen"]
    assert after > before


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", ()) for n in _plan_nodes(child))]
