"""An operator cordons, drains, uncordons and removes nodes; an agent heartbeats."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api
from tests.support.reports import REGISTER, node_input

STATE = "query($id: ID!) { node(id: $id) { state stateReason schedulable lastSeen } }"


async def test_cordon_then_uncordon(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    cordoned = await api(
        'mutation { cordonNode(id: "gpu-07", reason: "kernel upgrade") { state stateReason schedulable } }'
    )
    assert cordoned["cordonNode"] == {
        "state": "CORDONED", "stateReason": "kernel upgrade", "schedulable": False,
    }  # fmt: skip
    ready = await api('mutation { uncordonNode(id: "gpu-07") { state stateReason schedulable } }')
    assert ready["uncordonNode"] == {"state": "READY", "stateReason": None, "schedulable": True}


async def test_a_cordon_needs_a_reason(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    error = await api.fails('mutation { cordonNode(id: "gpu-07", reason: "  ") { state } }')
    assert error["extensions"]["code"] == "BAD_INPUT" and error["extensions"]["field"] == "reason"
    assert (await api(STATE, {"id": "gpu-07"}))["node"]["state"] == "READY"


async def test_operator_mutations_on_an_unknown_node_say_so(api: Api) -> None:
    for mutation in (
        'cordonNode(id: "ghost", reason: "x") { id }',
        'drainNode(id: "ghost", reason: "x") { id }',
        'uncordonNode(id: "ghost") { id }',
    ):
        error = await api.fails(f"mutation {{ {mutation} }}")
        assert error["extensions"] == {"code": "NODE_NOT_FOUND", "nodeId": "ghost"}
        assert "ghost" in error["message"]


async def test_heartbeat_from_an_unknown_node_tells_the_agent_to_re_register(api: Api) -> None:
    error = await api.fails('mutation { heartbeat(nodeId: "gpu-99") { id } }')
    assert error["extensions"]["code"] == "NODE_NOT_FOUND"
    assert error["path"] == ["heartbeat"]


async def test_heartbeat_stamps_the_databases_clock(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE nodes SET last_seen = now() - interval '1 hour' WHERE id = 'gpu-07'")
        )
    await api('mutation { heartbeat(nodeId: "gpu-07") { id } }')
    async with engine.connect() as conn:
        age = (
            await conn.execute(
                text("SELECT extract(epoch FROM now() - last_seen) FROM nodes WHERE id = 'gpu-07'")
            )
        ).scalar_one()
    assert 0 <= age < 60


async def test_remove_forgets_the_node_and_its_allocations(api: Api, engine: AsyncEngine) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO shards (shard_id, replica_id, node_id, gpu_indices)"
                 " VALUES ('s0', 'r0', 'gpu-07', '{0}')")
        )  # fmt: skip
        await conn.execute(
            text(
                "INSERT INTO allocated_gpus (node_id, gpu_index, shard_id, gpu_class)"
                " SELECT node_id, idx, 's0', gpu_class FROM gpus WHERE node_id = 'gpu-07' AND idx = 0"
            )
        )

    assert (await api('mutation { removeNode(id: "gpu-07") }'))["removeNode"] is True
    assert (await api(STATE, {"id": "gpu-07"}))["node"] is None
    assert (await api("{ allocations { shardId } }"))["allocations"] == []
    assert (await api('mutation { removeNode(id: "gpu-07") }'))["removeNode"] is False


async def test_a_removed_node_registers_again_from_scratch(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    await api('mutation { cordonNode(id: "gpu-07", reason: "rma") { id } }')
    await api('mutation { removeNode(id: "gpu-07") }')
    await api(REGISTER, {"input": node_input("gpu-07")})
    assert (await api(STATE, {"id": "gpu-07"}))["node"]["state"] == "READY"
