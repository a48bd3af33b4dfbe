"""Inputs built by the compiled converters equal what Strawberry's own conversion builds."""

from __future__ import annotations

from typing import Any

import pytest
from graphql import GraphQLInputObjectType
from graphql.utilities import coerce_input_value
from strawberry.types.arguments import convert_argument
from strawberry.types.base import StrawberryObjectDefinition

from service.graphql.allocation_types import AllocateInput, PlaceInput
from service.graphql.fast.input_conversion import install_input_plans
from service.graphql.inputs import NodeFilter, NodeInput
from service.graphql.schema import schema
from tests.support.reports import A100, GB, allocation, gpus, node_input, placement, shard


@pytest.fixture(autouse=True)
def plans_installed() -> None:
    """The compiled plans, as the app installs them when built with the fast path on."""
    install_input_plans(schema)


def input_definitions() -> dict[str, StrawberryObjectDefinition]:
    found = {}
    for name, gql_type in schema._schema.type_map.items():
        if isinstance(gql_type, GraphQLInputObjectType) and not name.startswith("__"):
            definition = schema.get_type_by_name(name)
            assert isinstance(definition, StrawberryObjectDefinition)
            found[name] = definition
    return found


def test_every_input_type_of_the_schema_is_built_by_a_compiled_converter() -> None:
    install_input_plans(schema)  # as the app does when it is built with the fast path on
    uncompiled = [name for name, d in input_definitions().items() if d.from_input is None]
    assert uncompiled == []
    # Installing again changes nothing: each type keeps the plan it has.
    plans = {name: d.from_input for name, d in input_definitions().items()}
    install_input_plans(schema)
    assert {name: d.from_input for name, d in input_definitions().items()} == plans


def convert_both(
    cls: type, value: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any]:
    """The same client value through graphql-core's coercion, then both conversions."""
    definition: StrawberryObjectDefinition = cls.__strawberry_definition__  # type: ignore[attr-defined]
    coerced = coerce_input_value(value, schema._schema.get_type(definition.name))
    config, scalars = schema.config, schema.schema_converter.scalar_registry
    compiled = convert_argument(coerced, cls, scalars, config)
    with monkeypatch.context() as m:
        # Strawberry's own path, for every nested input type too.
        for nested in input_definitions().values():
            m.setattr(nested, "from_input", None)
        strawberrys = convert_argument(coerced, cls, scalars, config)
    return compiled, strawberrys


REPORTS = [
    node_input("gpu-01"),
    node_input(
        "gpu-02",
        labels=[{"key": "zone", "value": "a"}],
        gpus=[*gpus(A100, 2), {"index": 2, "name": "NVIDIA A100-SXM4-40GB", "healthy": False,
                               "healthReasons": ["ecc_uncorrected", "row_remap_failure"],
                               "pciBusId": "00000000:18:00.0", "gpuClass": "A100-40GB"}],
        fabrics=[{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}],
        storage=[{"id": "dev:1", "mountPoint": "/data", "shared": False, "freeBytes": GB,
                  "totalBytes": 2 * GB, "directories": ["/data/models"]}],
        weights=[{"path": "/data/models/x", "sizeBytes": None}, {"path": "/data/models/y"}],
        memoryTotalMb=None,
        engineVersions=[],
    ),
]  # fmt: skip


@pytest.mark.parametrize("report", REPORTS, ids=["minimal", "everything"])
def test_a_node_report_converts_alike(
    report: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled, strawberrys = convert_both(NodeInput, report, monkeypatch)
    assert compiled == strawberrys
    assert compiled.to_report(5.0) == strawberrys.to_report(5.0)
    # Lists are the converter's own, not graphql-core's shared defaults.
    assert compiled.gpus is not strawberrys.gpus


@pytest.mark.parametrize(
    ("cls", "value"),
    [
        (AllocateInput, allocation("r1", shard("r1-s0", "gpu-01", 0, 1))["input"]),
        (
            PlaceInput,
            placement("r2", "H100-80GB", gpusPerShard=4, shards=2, fabric="ib-a")["input"],
        ),
        (
            NodeFilter,
            {"state": "CORDONED", "label": {"key": "zone", "value": "a"}, "minLocalDiskFree": GB},
        ),
        (NodeFilter, {}),
    ],
)
def test_scheduler_inputs_convert_alike(
    cls: type, value: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled, strawberrys = convert_both(cls, value, monkeypatch)
    assert compiled == strawberrys
