"""The private parts of graphql-core and Strawberry the fast path uses still mean what they meant.

service/graphql/private_api.py is the only module that reaches them;
each test here fails, by name, on an engine upgrade that moves or changes
one, before any answer of the service changes.
"""

from __future__ import annotations

import inspect
from datetime import UTC, datetime
from typing import Any

import pytest
from graphql import GraphQLError, GraphQLObjectType, GraphQLSchema, parse
from graphql.pyutils import Path
from strawberry.relay.types import GlobalID
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

from service.graphql import private_api
from service.graphql.fast.execution import PlainFieldExecutionContext
from service.graphql.fast.variables import compile_variables
from service.graphql.inputs import NodeInput
from service.graphql.schema import schema
from service.graphql.types import NodeState


def test_strawberrys_graphql_core_schema_is_the_one_it_executes() -> None:
    core = private_api.core_schema(schema)
    assert isinstance(core, GraphQLSchema)
    assert isinstance(core.get_type("Node"), GraphQLObjectType)
    assert core is schema._schema


def test_strawberry_marks_the_resolvers_it_makes_for_plain_fields() -> None:
    node = private_api.core_schema(schema).get_type("Node")
    assert isinstance(node, GraphQLObjectType)
    assert private_api.is_default_resolver(node.fields["hostname"].resolve)
    assert not private_api.is_default_resolver(node.fields["gpus"].resolve)
    assert not private_api.is_default_resolver(None)


def test_strawberrys_leaf_test_takes_scalars_and_enums_not_inputs_or_global_ids() -> None:
    scalars = private_api.scalar_registry(schema)
    assert private_api.is_strawberry_leaf(str, scalars)
    assert private_api.is_strawberry_leaf(NodeState.__strawberry_definition__, scalars)  # type: ignore[attr-defined]
    assert not private_api.is_strawberry_leaf(NodeInput, scalars)
    assert not private_api.is_strawberry_leaf(GlobalID, scalars)


async def test_an_executor_built_on_coerced_variables_runs_the_operation() -> None:
    core = private_api.core_schema(schema)
    document = parse('query Q($n: Int) { __typename a: __type(name: "Node") { name } }')
    operation = document.definitions[0]
    plan = compile_variables(core, operation)  # type: ignore[arg-type]
    assert plan is not None
    values = plan.coerce({"n": 3})
    bare = parse('query Q { __typename a: __type(name: "Node") { name } }')
    executor = private_api.executor_for_coerced_variables(
        schema.execution_context_class,
        core,
        bare,
        operation,
        "Q",
        values,
        None,  # type: ignore[arg-type]
    )
    assert executor.operation is operation
    assert executor.variable_values is values
    result = executor.execute_operation()
    if inspect.isawaitable(result):
        result = await result
    assert result.errors is None
    assert result.data == {"__typename": "Query", "a": {"name": "Node"}}


@pytest.mark.parametrize(
    "method",
    ["execute_fields", "complete_value", "execute_field", "collect_subfields", "build_response"],
)
def test_the_executor_methods_the_plain_field_context_overrides_or_calls_keep_their_signature(
    method: str,
) -> None:
    base: Any = StrawberryGraphQLCoreExecutionContext
    expected = {
        "execute_fields": [
            "self", "parent_type", "source_value", "path", "grouped_field_set", "position_context"
        ],
        "complete_value": [
            "self", "return_type", "field_details_list", "info", "path", "result",
            "position_context",
        ],
        "execute_field": [
            "self", "parent_type", "source", "field_details_list", "path", "position_context"
        ],
        "collect_subfields": ["self", "return_type", "field_details_list"],
        "build_response": ["self", "data"],
    }[method]  # fmt: skip
    assert list(inspect.signature(getattr(base, method)).parameters) == expected
    assert issubclass(PlainFieldExecutionContext, private_api.StrawberryGraphQLCoreExecutionContext)
    assert callable(base.settle_in_background)


def test_graphql_cores_variable_helpers_answer_as_the_plans_expect() -> None:
    core = private_api.core_schema(schema)
    definition = parse("query Q($id: ID!) { node(id: $id) { id } }").definitions[0]
    signature = private_api.get_variable_signature(core, definition.variable_definitions[0])  # type: ignore[attr-defined]
    assert signature.name == "id"
    source = private_api.VariableValueSource(signature, "x")
    values = private_api.VariableValues({"id": source}, {"id": "x"})
    assert values.coerced == {"id": "x"}
    node_input = core.get_type("NodeInput")
    field = node_input.fields["labels"]  # type: ignore[union-attr]
    assert private_api.coerce_default_value(field) is not None or field.default_value is None


def test_errors_added_after_execution_keep_out_of_what_an_error_nulled() -> None:
    """pages.py adds PAGE_TRUNCATED this way: at its path, unless that part of the answer is gone."""
    core = private_api.core_schema(schema)
    executor = StrawberryGraphQLCoreExecutionContext.build(core, parse("{ __typename }"))
    nulled = Path(None, "a", "Query")
    executor.collected_errors.add(GraphQLError("a failed"), nulled)  # type: ignore[union-attr]
    under = GraphQLError("under a")
    beside = GraphQLError("beside a")
    private_api.add_field_errors(
        executor, [(Path(nulled, "list", "A"), under), (Path(None, "b", "Query"), beside)]
    )
    errors = executor.collected_errors.errors  # type: ignore[union-attr]
    assert [e.message for e in errors] == ["a failed", "beside a"]
    # Adding marks nothing nulled: a later error under `b` is still kept.
    executor.collected_errors.add(GraphQLError("under b"), Path(Path(None, "b", "Query"), 0, None))  # type: ignore[union-attr]
    assert len(errors) == 3


def test_strawberrys_datetime_parser_reads_iso_8601_and_names_a_bad_value() -> None:
    parsed = private_api.parse_strawberry_datetime("2026-12-04T08:00:00.5+01:00")
    assert parsed == datetime(2026, 12, 4, 7, 0, 0, 500000, tzinfo=UTC)
    with pytest.raises(GraphQLError, match='Value cannot represent a DateTime: "yesterday"'):
        private_api.parse_strawberry_datetime("yesterday")
