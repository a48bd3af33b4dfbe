"""Every private part of graphql-core and Strawberry the service's execution uses, and nothing else.

The fast path answers as Strawberry would by calling the same code, and some of
that code is not public: graphql-core 3.3's executor attributes and
variable-coercion helpers, Strawberry's test for a leaf type and its mark on
default resolvers, and its DateTime parser (service/graphql/scalars.py); and the executor's collected errors, to which
PAGE_TRUNCATED is added once execution is done (service/graphql/pages.py).
Each is reached through this module only, so an upgrade that
moves one breaks here, by name, in tests/fast_path/test_private_api.py (which checks each
against the installed versions), before any answer changes. pyproject.toml pins
both engines to the versions these were read from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import strawberry
from graphql import DocumentNode, GraphQLError, GraphQLSchema, OperationDefinitionNode
from graphql.execution.collect_fields import FieldDetailsList, GroupedFieldSet
from graphql.execution.get_variable_signature import get_variable_signature
from graphql.execution.values import VariableValues, VariableValueSource
from graphql.pyutils import Path
from graphql.utilities.coerce_input_value import coerce_default_value
from strawberry.execution.is_awaitable import optimized_is_awaitable
from strawberry.relay.types import GlobalID
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext, validate_document
from strawberry.schema.types.base_scalars import DateTimeDefinition
from strawberry.types.arguments import _is_leaf_type
from strawberry.types.base import StrawberryType

__all__ = [
    "FieldDetailsList",
    "GroupedFieldSet",
    "StrawberryGraphQLCoreExecutionContext",
    "VariableValueSource",
    "VariableValues",
    "add_field_errors",
    "coerce_default_value",
    "core_schema",
    "executor_for_coerced_variables",
    "get_variable_signature",
    "is_default_resolver",
    "is_strawberry_leaf",
    "optimized_is_awaitable",
    "parse_strawberry_datetime",
    "provided_operation_name",
    "scalar_registry",
    "validate_document",
]


def core_schema(schema: strawberry.Schema) -> GraphQLSchema:
    """The graphql-core schema Strawberry built (its `_schema`)."""
    core: GraphQLSchema = schema._schema
    return core


def scalar_registry(schema: strawberry.Schema) -> Mapping[object, Any]:
    """The scalars Strawberry converts arguments with (its converter's registry)."""
    return schema.schema_converter.scalar_registry


def executor_for_coerced_variables(
    executor_class: type[Any],
    schema: GraphQLSchema,
    bare: DocumentNode,
    operation: OperationDefinitionNode,
    operation_name: str | None,
    values: VariableValues,
    context: Any,
    root_value: Any = None,
) -> Any:
    """An executor for `operation`, its variables already coerced (fast/variables.py).

    Built on `bare`, the document with the operation's variable definitions
    left out, graphql-core coerces nothing; the operation and the coerced
    values are then set as build() would have set them (the executor's
    `operation` and `variable_values` attributes). None when build refused
    the document, which a prepared document never is.
    """
    executor = executor_class.build(
        schema,
        bare,
        root_value=root_value,
        context_value=context,
        operation_name=operation_name,
        is_awaitable=optimized_is_awaitable,
    )
    if isinstance(executor, list):
        return None
    executor.operation = operation
    executor.variable_values = values
    return executor


def is_default_resolver(resolve: Callable[..., Any] | None) -> bool:
    """Whether graphql-core's resolver is the one Strawberry made for a field without one."""
    return bool(getattr(resolve, "_is_default", False))


def is_strawberry_leaf(type_: StrawberryType | type, scalars: Mapping[object, Any]) -> bool:
    """convert_argument's own test for a value it takes as graphql-core parsed it."""
    return _is_leaf_type(type_, scalars, skip_classes=(GlobalID,))


def add_field_errors(executor: Any, errors: Iterable[tuple[Path, GraphQLError]]) -> None:
    """Add errors to an executor's answer, each at its field's path, after its fields ran.

    As graphql-core's own CollectedErrors.add does, an error under a position
    that another error nulled is left out (that part of the answer is gone);
    unlike add, nothing is marked nulled, since each field still answers.
    """
    collected = executor.collected_errors
    collected.errors.extend(
        error for path, error in errors if not collected.has_nulled_position(path)
    )


def provided_operation_name(context: Any) -> str | None:
    """The operationName a request sent, None when it sent none (Strawberry's ExecutionContext).

    Its public `operation_name` answers the first operation's name when none
    was sent, which is how Strawberry ran the first of several operations
    (service/graphql/checked_documents.py).
    """
    name: str | None = context._provided_operation_name
    return name


def parse_strawberry_datetime(value: object) -> object:
    """Strawberry's DateTime parsing of a value, its error messages included."""
    parse = DateTimeDefinition.parse_value
    assert parse is not None, "Strawberry's DateTime has a parse_value"
    return parse(value)
