"""A type's field lists, read from its Strawberry definition, never restated.

The compiled routes need two lists per type: the fields whose value is an
attribute of the GraphQL object (the compiled heartbeat reads them from
Node.of's object), and the attribute of the domain record each field's value
comes from (the compiled page has PostgreSQL build the record's JSON). Both
are read from the Strawberry type: the first is its fields without resolver,
extensions or arguments; the second adds the resolver fields a page builds
itself (RECORD_ATTRIBUTES, this package's own list: the types know nothing of
the fast path) and takes each field's attribute from there where the record
names it differently (Node.stateChangedBy is NodeRecord.state_actor), else
its Python name. A field added to a type is then known to both routes at
once, and a renamed one cannot silently keep its old name here: a name in
RECORD_ATTRIBUTES that the type does not have is refused (UnknownField).
"""

from __future__ import annotations

from typing import Any

import strawberry
from strawberry.types.arguments import StrawberryArgument, convert_arguments
from strawberry.types.base import StrawberryObjectDefinition
from strawberry.types.field import StrawberryField
from strawberry.types.private import is_private

from service.graphql.private_api import scalar_registry

# The fields a page of nodes answers from its records (json_pages.py), by
# type and GraphQL name, with the record attribute that holds each value:
# resolver fields the page builds itself (Node.taints from fleet health's
# SQL, Node.gpus and the other detail lists from the same statement), and
# plain fields whose record attribute has another name. A field with
# arguments is answered only without them (Node.freeGpus without gpuClass):
# the compiled page declines a selection that passes arguments.
RECORD_ATTRIBUTES: dict[str, dict[str, str]] = {
    "Node": {
        "stateChangedBy": "state_actor",
        "gpus": "gpus",
        "freeGpus": "free_gpus",
        "largestFreeNvlinkGroup": "largest_free_nvlink_group",
        "nvlinkGroups": "nvlink_groups",
        "fabrics": "fabrics",
        "storage": "filesystems",
        "weights": "weights",
        "allocations": "shards",
        "taints": "taints",
        "drift": "drift",
        "remediations": "remediations",
    },
    "NodeFreeGpus": {"node": "node"},
}


class NotAnObjectType(LookupError):
    """The schema has no Strawberry object type of that name."""


class UnknownField(LookupError):
    """RECORD_ATTRIBUTES names a field its type does not have (renamed or removed)."""


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
    named = RECORD_ATTRIBUTES.get(type_name, {})
    attributes: dict[str, str] = {}
    for f in _fields(schema, type_name):
        name = _graphql_name(schema, f)
        plain = f.base_resolver is None and not f.extensions and not f.arguments
        if name in named and not f.extensions:
            attributes[name] = named[name]
        elif plain:
            attributes[name] = f.python_name
    unknown = sorted(set(named) - {_graphql_name(schema, f) for f in _fields(schema, type_name)})
    if unknown:
        raise UnknownField(f"{type_name} has no field {', '.join(unknown)} (RECORD_ATTRIBUTES)")
    return attributes


def check_record_attributes(schema: strawberry.Schema) -> None:
    """UnknownField (or NotAnObjectType) unless every RECORD_ATTRIBUTES name is in the schema.

    Called when the fast path is installed, so a field renamed on the type
    alone stops the app from being built rather than a page from compiling.
    """
    for type_name in RECORD_ATTRIBUTES:
        record_attributes(schema, type_name)
