"""A compiled variable plan coerces exactly what graphql-core coerces, or declines.

The plan (service/graphql/fast/variables.py) replaces graphql-core's coercion of
the agents' and schedulers' variables. For any value, generated here from a
real report by replacing, dropping and adding parts, it must either give
graphql-core's own result (same values, same sources) or decline, and it must
decline whatever graphql-core refuses, so a bad report still gets
graphql-core's error in its words.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
from graphql import GraphQLError, OperationDefinitionNode, parse
from graphql.execution.values import VariableValues, get_variable_values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.graphql.fast.variables import Declined, compile_variables
from service.graphql.schema import schema
from tests.support.direct_execution import FULL_REPORT
from tests.support.reports import ALLOCATE, PLACE, allocation, placement, shard

CORE = schema._schema
OPERATIONS = Path(__file__).resolve().parents[2] / "agent" / "operations"
REGISTER = (OPERATIONS / "register_node.graphql").read_text()

ODD_VALUES = [None, 0, -1, 2**31, 2**63, 1.0, 1.5, float("nan"), "", "7", True, [], [1], {},
              {"unknown": 1}]  # fmt: skip


def operation(document: str) -> OperationDefinitionNode:
    (definition,) = [
        d for d in parse(document).definitions if isinstance(d, OperationDefinitionNode)
    ]
    return definition


def graphql_core(op: OperationDefinitionNode, variables: dict[str, Any]) -> Any:
    return get_variable_values(CORE, op.variable_definitions or (), variables)


def same_or_declined(document: str, variables: dict[str, Any]) -> str:
    """'same' or 'declined'; fails when the plan answers differently from graphql-core."""
    op = operation(document)
    plan = compile_variables(CORE, op)
    assert plan is not None
    expected = graphql_core(op, variables)
    try:
        values = plan.coerce(variables)
    except Declined:
        return "declined"
    assert isinstance(expected, VariableValues), f"graphql-core refused {variables}: {expected}"
    assert values.coerced == expected.coerced
    assert _sources(values) == _sources(expected)
    return "same"


def _sources(values: VariableValues) -> dict[str, Any]:
    # Signatures (and their type wrappers) are built per call: compared by what they say.
    return {
        name: (s.signature.name, str(s.signature.type), s.signature.default, s.value)
        for name, s in values.sources.items()
    }


def test_an_agents_report_and_a_schedulers_requests_are_coerced_by_the_plan() -> None:
    assert same_or_declined(REGISTER, {"input": FULL_REPORT}) == "same"
    assert same_or_declined(ALLOCATE, allocation("r1", shard("r1-s0", "gpu-01", 0, 1))) == "same"
    assert same_or_declined(PLACE, placement("r2", shards=2, gpusPerShard=4)) == "same"
    # A nullable variable not given is left out, as graphql-core leaves it.
    beat = "query Q($first: Int, $after: ID) { nodes(first: $first, after: $after) { id } }"
    assert same_or_declined(beat, {"first": 5}) == "same"


@pytest.mark.parametrize(
    "variables",
    [
        {},
        {"input": None},
        {"input": {**FULL_REPORT, "unknownField": 1}},
        {"input": {k: v for k, v in FULL_REPORT.items() if k != "hostname"}},
        {"input": {**FULL_REPORT, "memoryTotalMb": 2**31}},
        {"input": {**FULL_REPORT, "gpus": FULL_REPORT["gpus"][0]}},  # a lone value for a list
        {"input": {**FULL_REPORT, "id": 17}},  # an ID sent as a number
    ],
)
def test_what_graphql_core_refuses_or_reads_its_own_way_is_left_to_it(
    variables: dict[str, Any],
) -> None:
    assert same_or_declined(REGISTER, variables) == "declined"


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*path, index))
    return out


REPORT_PATHS = _paths(FULL_REPORT)[1:]


def _edit(report: dict[str, Any], path: tuple[Any, ...], how: str, odd: Any) -> dict[str, Any]:
    edited = copy.deepcopy(report)
    parent = edited
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if isinstance(parent, dict) != isinstance(last, str):
        # An earlier edit put an object where a list was (or the reverse): an
        # index as an object's key is no JSON a client could send, and
        # graphql-core's suggestions for unknown fields fail on it.
        raise TypeError(f"{path} no longer fits the edited report")
    if how == "replace":
        parent[last] = odd
    elif how == "drop" and isinstance(parent, dict):
        del parent[last]
    elif how == "add" and isinstance(parent, dict):
        parent["extra"] = odd
    return edited


@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "200")),
    deadline=None,
    database=None,
    derandomize=os.environ.get("CI") == "true",
    suppress_health_check=list(HealthCheck),
)
@given(
    edits=st.lists(
        st.tuples(
            st.sampled_from(REPORT_PATHS),
            st.sampled_from(["replace", "drop", "add"]),
            st.sampled_from(ODD_VALUES),
        ),
        max_size=3,
    )
)
def test_any_edited_report_is_coerced_as_graphql_core_coerces_it_or_left_to_it(
    edits: list[tuple[tuple[Any, ...], str, Any]],
) -> None:
    report: dict[str, Any] = FULL_REPORT
    for path, how, odd in edits:
        try:
            report = _edit(report, path, how, odd)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced what this one names
    same_or_declined(REGISTER, {"input": report})


def test_a_variable_with_a_default_or_of_a_type_graphql_core_must_judge_is_not_planned() -> None:
    with_default = operation("query Q($first: Int = 5) { nodes(first: $first) { id } }")
    assert compile_variables(CORE, with_default) is None
    # Unknown types never reach here (validation refuses them), but the plan
    # must not guess either way.
    unknown = operation("query Q($x: NoSuchType) { nodes { id } }")
    assert compile_variables(CORE, unknown) is None
    assert isinstance(graphql_core(unknown, {}), list)
    assert all(isinstance(e, GraphQLError) for e in graphql_core(unknown, {}))
