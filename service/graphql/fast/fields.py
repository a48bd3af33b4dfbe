"""A type's field lists, read from its Strawberry definition, never restated.

The compiled routes need two lists per type: the fields whose value is an
attribute of the GraphQL object (the compiled heartbeat reads them from
Node.of's object), and the attribute of the domain record each field's value
comes from (the compiled page has PostgreSQL build the record's JSON). Both
are read from the Strawberry type: the first is its fields without resolver,
extensions or arguments; the second adds the resolver fields a page may
answer (those marked READY, execution.py, or naming a RECORD) and takes each
field's attribute from its RECORD metadata where the type says the record
names it differently (Node.stateChangedBy is NodeRecord.state_actor), else
its Python name. A field added to a type is then known to both routes at
once, and a renamed one cannot silently keep its old name here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import strawberry
from strawberry.types.arguments import StrawberryArgument, convert_arguments
from strawberry.types.base import StrawberryObjectDefinition
from strawberry.types.field import StrawberryField
from strawberry.types.private import is_private

from service.graphql.private_api import scalar_registry
from service.graphql.types import READY, RECORD


class NotAnObjectType(LookupError):
    """The schema has no Strawberry object type of that name."""


def _definition(schema: strawberry.Schema, type_name: str) -> StrawberryObjectDefinition:
    definition = schema.get_type_by_name(type_name)
    if not isinstance(definition, StrawberryObjectDefinition):
        raise NotAnObjectType(type_name)
    return definition


def _fields(schema: strawberry.Schema, type_name: str) -> list[StrawberryField]:
    """The type's GraphQL fields (its strawberry.Private attributes left out)."""
    return [f for f in _definition(schema, type_name).fields if not is_private(f.type)]


def _graphql_name(schema: strawberry.Schema, field: StrawberryField) -> str:
    return schema.config.name_converter.get_graphql_name(field)


def field_arguments(
    schema: strawberry.Schema, type_name: str, field_name: str
) -> list[StrawberryArgument]:
    """The arguments the type's field declares, as Strawberry converts them; LookupError if none such."""
    for f in _fields(schema, type_name):
        if _graphql_name(schema, f) == field_name:
            return list(f.arguments)
    raise LookupError(f"{type_name}.{field_name}")


class ArgumentConversion:
    """A field's arguments as Strawberry's resolver wrapper converts them: convert_arguments
    with the field's own arguments, the schema's scalars and its config (for the compiled
    routes that call a resolver's steps themselves). LookupError if there is no such field."""

    def __init__(self, schema: strawberry.Schema, type_name: str, field_name: str) -> None:
        self._arguments = field_arguments(schema, type_name, field_name)
        self._scalars = scalar_registry(schema)
        self._config = schema.config

    def __call__(self, values: dict[str, Any]) -> dict[str, Any]:
        return convert_arguments(values, self._arguments, self._scalars, self._config)


def plain_fields(schema: strawberry.Schema, type_name: str) -> dict[str, StrawberryField]:
    """GraphQL name -> field, for the type's fields that are attributes of its objects."""
    return {
        _graphql_name(schema, f): f
        for f in _fields(schema, type_name)
        if f.base_resolver is None and not f.extensions and not f.arguments
    }


def record_attributes(schema: strawberry.Schema, type_name: str) -> dict[str, str]:
    """GraphQL name -> the record's attribute holding the field's value."""
    attributes: dict[str, str] = {}
    for f in _fields(schema, type_name):
        metadata: Mapping[Any, Any] = f.metadata or {}
        plain = f.base_resolver is None and not f.extensions and not f.arguments
        # A field with arguments is named only by RECORD, which then names its
        # value when no argument is given (Node.freeGpus without gpuClass): the
        # compiled page declines a selection that passes arguments.
        answerable = not f.extensions and (
            RECORD in metadata or (READY in metadata and not f.arguments)
        )
        if plain or answerable:
            attributes[_graphql_name(schema, f)] = str(metadata.get(RECORD, f.python_name))
    return attributes
