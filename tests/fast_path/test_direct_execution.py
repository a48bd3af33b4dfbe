"""The direct executor answers exactly what Strawberry's view answers, and answers the agents' requests.

Each request goes to two apps on the same database: one with
INVENTORY_FAST_PATH on (the default), one with it off. The mutations
used are ones a client may repeat with the same answer (a report re-sent, a
heartbeat, an allocation or placement re-sent with its ids), so running each
twice compares answers, not states.
"""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import tokens
from service.config import Settings
from service.graphql.fast.compiled_heartbeat import compile_heartbeat
from service.graphql.fast.front_door import FrontDoor
from service.graphql.schema import schema
from tests.support.direct_execution import (
    AGENT_HEARTBEAT,
    FULL_REPORT,
    OPERATIONS,
    PAGE,
    answered,
    route_counts,
    same_answer,
)
from tests.support.reports import (
    ALLOCATE,
    PLACE,
    REGISTER,
    allocation,
    node_input,
    placement,
    shard,
)

AGENT_REGISTER = (OPERATIONS / "register_node.graphql").read_text()


TWO_OPERATIONS = """
query Classes { gpuClasses { gpuClass total free allocated unhealthy unschedulable } }
query Fabrics { fabrics { name nodes { id } } }
"""


async def test_an_agents_report_and_heartbeat_are_answered_directly_and_alike(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    before = route_counts()
    registered = await same_answer(
        both, {"query": AGENT_REGISTER, "variables": {"input": FULL_REPORT}}
    )
    assert registered == {
        "data": {"registerNode": {"id": "gpu-01", "state": "READY", "stateReason": None}}
    }

    beat = await same_answer(both, {"query": AGENT_HEARTBEAT, "variables": {"nodeId": "gpu-01"}})
    assert beat["data"]["heartbeat"]["state"] == "READY"

    # On the first app, the report by the compiled registration, the beat by
    # the compiled heartbeat (the second app has no fast path).
    assert answered(before, "registration") == 1
    assert answered(before, "heartbeat") == 1


async def test_errors_read_the_same_whichever_executor_answers(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    await same_answer(both, {"query": REGISTER, "variables": {"input": FULL_REPORT}})

    unknown = await same_answer(both, {"query": AGENT_HEARTBEAT, "variables": {"nodeId": "gpu-99"}})
    assert unknown["errors"][0]["extensions"]["code"] == "NODE_NOT_FOUND"

    bad_gpu = node_input(
        "gpu-02", gpus=[{"index": -1, "name": "NVIDIA H100 80GB HBM3", "healthy": True}]
    )
    bad = await same_answer(both, {"query": REGISTER, "variables": {"input": bad_gpu}})
    assert bad["errors"][0]["extensions"]["code"] == "BAD_INPUT"
    assert bad["errors"][0]["extensions"]["value"] == -1

    # Variables that do not fit the document: graphql-core's own refusal.
    missing = await same_answer(both, {"query": REGISTER, "variables": {"input": {"id": "x"}}})
    assert missing["data"] is None and "hostname" in missing["errors"][0]["message"]

    # A NUL reaching PostgreSQL is masked the same way (the masked path).
    nul = await same_answer(
        both,
        {"query": "query N($id: ID!) { node(id: $id) { id } }", "variables": {"id": "gpu\x0001"}},
    )
    assert nul["errors"][0]["extensions"]["code"] == "BAD_INPUT"

    # Left to Strawberry, and still the same words: syntax and validation
    # errors, an unknown or missing operation name, malformed bodies.
    await same_answer(both, {"query": "mutation { heartbeat(nodeId: "})
    await same_answer(both, {"query": "{ nodes { noSuchField } }"})
    await same_answer(both, {"query": TWO_OPERATIONS})
    await same_answer(both, {"query": TWO_OPERATIONS, "operationName": "Nope"})
    await same_answer(both, {"query": "{ nodes { id } }", "variables": [1]})
    await same_answer(both, b'{"query": ')
    await same_answer(both, [{"query": "{ nodes { id } }"}])


async def test_queries_and_allocations_read_the_same_whichever_executor_answers(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    await same_answer(both, {"query": REGISTER, "variables": {"input": FULL_REPORT}})
    await same_answer(both, {"query": REGISTER, "variables": {"input": node_input("gpu-02")}})
    await same_answer(
        both, {"query": 'mutation { cordonNode(id: "gpu-02", reason: "burn-in") { id state } }'}
    )

    allocated = await same_answer(
        both, {"query": ALLOCATE, "variables": allocation("r1", shard("r1-s0", "gpu-01", 0, 1))}
    )
    assert allocated["data"]["allocate"]["__typename"] == "Allocated"
    taken = await same_answer(
        both, {"query": ALLOCATE, "variables": allocation("r2", shard("r2-s0", "gpu-01", 1))}
    )
    assert taken["data"]["allocate"]["code"] == "GPU_TAKEN"
    placed = await same_answer(
        both, {"query": PLACE, "variables": placement("r3", "A100-40GB", gpusPerShard=1)}
    )
    assert placed["data"]["place"]["__typename"] == "Allocated"
    no_room = await same_answer(
        both, {"query": PLACE, "variables": placement("r4", "H100-80GB", gpusPerShard=8)}
    )
    assert no_room["data"]["place"]["__typename"] == "Unplaceable"

    page = await same_answer(both, {"query": PAGE, "variables": {"first": 10, "withGpus": True}})
    assert [n["id"] for n in page["data"]["nodes"]] == ["gpu-01", "gpu-02"]
    assert page["data"]["nodes"][0]["gpus"][0]["allocation"]["shardId"] == "r1-s0"
    without = await same_answer(
        both, {"query": PAGE, "variables": {"first": 10, "withGpus": False}}
    )
    assert "gpus" not in without["data"]["nodes"][0]
    too_many = await same_answer(
        both, {"query": PAGE, "variables": {"first": 100_000, "withGpus": False}}
    )
    assert too_many["errors"][0]["extensions"]["code"] == "BAD_INPUT"

    await same_answer(both, {"query": TWO_OPERATIONS, "operationName": "Classes"})
    await same_answer(both, {"query": TWO_OPERATIONS, "operationName": "Fabrics"})


async def test_a_tokens_role_is_enforced_the_same_way_on_both_paths(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient], engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        agent = await tokens.create_token(conn, "agent", "gpu-01", description="agent of gpu-01")
        reader = await tokens.create_token(conn, "reader", None, description="dashboard")
    as_agent = {"Authorization": f"Bearer {agent.secret}"}
    as_reader = {"Authorization": f"Bearer {reader.secret}"}

    ok = await same_answer(
        both, {"query": AGENT_REGISTER, "variables": {"input": FULL_REPORT}}, as_agent
    )
    assert ok["data"]["registerNode"]["id"] == "gpu-01"
    other_node = await same_answer(
        both, {"query": AGENT_HEARTBEAT, "variables": {"nodeId": "gpu-02"}}, as_agent
    )
    assert other_node["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    scheduling = await same_answer(
        both, {"query": PLACE, "variables": placement("r1", gpusPerShard=1)}, as_reader
    )
    assert scheduling["errors"][0]["extensions"]["requiredRole"] == "scheduler"
    # No token at all: refused before either executor, with HTTP 401.
    await same_answer(both, {"query": AGENT_HEARTBEAT, "variables": {"nodeId": "gpu-01"}})


# Every leaf the beat itself returns (types.BEAT_FIELDS): the compiled route's.
BEAT_LEAVES = """
mutation Beat($id: ID!) {
  beat: heartbeat(nodeId: $id) {
    __typename id node: id state stateReason schedulable stateChangedBy
  }
}
"""
# Leaves of the node the beat does not return: graphql-core's, whose
# resolver reads the rest of the node after the beat.
LEAVES = """
mutation Beat($id: ID!) {
  beat: heartbeat(nodeId: $id) {
    __typename id name: hostname mgmtAddr memoryTotalMb state stateReason schedulable
    agentVersion knowsItsWeights stateChangedBy registeredAt
  }
}
"""


@pytest.mark.parametrize(
    ("document", "compiled"),
    [
        (AGENT_HEARTBEAT, True),
        (BEAT_LEAVES, True),
        (LEAVES, False),
        ('mutation { heartbeat(nodeId: "gpu-01") { id lastSeen } }', False),
        ('mutation { heartbeat(nodeId: "gpu-01") { id state } }', True),
        ("mutation B($id: ID!) { heartbeat(nodeId: $id) { id gpus { index } } }", False),
        ("mutation B($id: ID!) { heartbeat(nodeId: $id) { id localDisk { freeBytes } } }", False),
        (
            "mutation B($id: ID!, $x: Boolean!) { heartbeat(nodeId: $id) { id @include(if: $x) } }",
            False,
        ),
        (
            "mutation B($id: ID!) { heartbeat(nodeId: $id) { ...F } } fragment F on Node { id }",
            False,
        ),
        (
            "mutation B($id: ID!) { a: heartbeat(nodeId: $id) { id } b: heartbeat(nodeId: $id) { id } }",
            False,
        ),
    ],
)
async def test_which_heartbeat_documents_are_compiled(document: str, compiled: bool) -> None:
    front_door = FrontDoor(schema, None, Settings())  # type: ignore[arg-type]
    prepared = await front_door.documents.get(document)
    assert prepared is not None, "the document must be valid"
    operation = prepared.operation(None)
    assert operation is not None
    assert (compile_heartbeat(schema, operation) is not None) is compiled


async def test_a_compiled_heartbeat_answers_every_leaf_as_graphql_core_does(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    await same_answer(both, {"query": REGISTER, "variables": {"input": FULL_REPORT}})
    await same_answer(
        both, {"query": 'mutation { cordonNode(id: "gpu-01", reason: "burn-in") { id } }'}
    )

    before = route_counts()
    beat = await same_answer(both, {"query": BEAT_LEAVES, "variables": {"id": "gpu-01"}})
    assert beat["data"]["beat"] == {
        "__typename": "Node",
        "id": "gpu-01",
        "node": "gpu-01",
        "state": "CORDONED",
        "stateReason": "burn-in",
        "schedulable": False,
        "stateChangedBy": None,  # no token here: no actor
    }
    # The rest of the node: graphql-core's resolver reads it after the beat.
    whole = await same_answer(both, {"query": LEAVES, "variables": {"id": "gpu-01"}})
    assert whole["data"]["beat"]["name"] == FULL_REPORT["hostname"]
    assert whole["data"]["beat"]["stateReason"] == "burn-in"
    now = route_counts()
    assert {
        key: now[key] - before.get(key, 0) for key in now if now[key] != before.get(key, 0)
    } == {
        ("heartbeat", "answered", ""): 1,
        ("graphql_core", "answered", ""): 1,
    }
    literal = await same_answer(both, {"query": 'mutation { heartbeat(nodeId: "gpu-01") { id } }'})
    assert literal == {"data": {"heartbeat": {"id": "gpu-01"}}}
    # An ID sent as a number is graphql-core's to coerce; the answer is the same.
    await same_answer(both, {"query": AGENT_HEARTBEAT, "variables": {"nodeId": 7}})

    # lastSeen moves with every beat: the compiled answer's is the one stored.
    direct, strawberry = both
    beat_seen = (
        await direct.post(
            "/graphql",
            json={"query": 'mutation { heartbeat(nodeId: "gpu-01") { lastSeen } }'},
        )
    ).json()
    stored = (
        await strawberry.post("/graphql", json={"query": '{ node(id: "gpu-01") { lastSeen } }'})
    ).json()
    assert beat_seen["data"]["heartbeat"]["lastSeen"] == stored["data"]["node"]["lastSeen"]
