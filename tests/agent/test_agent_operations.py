"""The agent's GraphQL operations and its report, checked against the service's schema.

The agent and the service meet only at the schema. These tests are what stops
a renamed field on either side from shipping.
"""

from importlib.resources import files
from pathlib import Path

import pytest
from fake_nvml import FakeNvml, h100
from fake_root import FakeDisks, add_model, make_node
from graphql import GraphQLSchema, OperationDefinitionNode, parse, validate
from graphql.execution.values import get_variable_values
from service_schema import load_service_schema

from agent.client import load_operation
from agent.config import AgentConfig, FabricConfig
from agent.discovery.weights import WeightsScanner
from agent.report import Host, build_report

OPERATIONS = sorted(
    p.name.removesuffix(".graphql")
    for p in files("agent").joinpath("operations").iterdir()
    if p.name.endswith(".graphql")
)


@pytest.fixture(scope="module")
def schema() -> GraphQLSchema:
    return load_service_schema()


def test_the_agent_ships_its_operations() -> None:
    # The fenced two are sent instead when running_shards is configured; the
    # _pins two when model_dirs is (the answer names the weights' pins); the
    # validation two when validations are (agent/validations.py).
    assert OPERATIONS == [
        "heartbeat",
        "heartbeat_fenced",
        "heartbeat_pins",
        "record_validation",
        "register_node",
        "register_node_fenced",
        "register_node_pins",
        "validations_to_run",
    ]


@pytest.mark.parametrize("name", OPERATIONS)
def test_each_operation_is_valid_against_the_schema(schema: GraphQLSchema, name: str) -> None:
    errors = validate(schema, parse(load_operation(name)))
    assert [e.message for e in errors] == []


def test_the_report_is_a_valid_node_input(schema: GraphQLSchema, tmp_path: Path) -> None:
    # A report with every part present, so every field name and type is checked.
    node = make_node(tmp_path)
    add_model(node, "/data/models/llama", {"config.json": 10, "model.safetensors": 1 << 33})
    (node / "mnt/filer/models").mkdir(parents=True)
    config = AgentConfig(
        node_id="gpu-07",
        hostname="gpu-07",
        mgmt_addr="10.0.0.7",
        labels={"zone": "z1"},
        model_dirs=("/data/models", "/mnt/filer/models"),
        fabrics=(FabricConfig("ib-a", ("mlx5_0", "mlx5_1")),),
        gpu_class="H100-80GB",
        root=str(node),
    )
    disks = FakeDisks(node)
    host = Host(
        nvml=FakeNvml([h100(0), h100(1, ecc_uncorrected=1, recovery_action=1)]),
        statvfs=disks.statvfs,
        stat=disks.stat,
        version_of=lambda dist: "0.11.0",
    )
    report = build_report(config, host, WeightsScanner(config.root))
    assert {"memoryTotalMb", "gpus", "fabrics", "storage", "weights", "engineVersions"} <= set(
        report.node_input
    )

    operation = parse(load_operation("register_node")).definitions[0]
    assert isinstance(operation, OperationDefinitionNode)
    coerced = get_variable_values(
        schema, operation.variable_definitions, {"input": report.node_input}
    )
    assert not isinstance(coerced, list), [e.message for e in coerced]
