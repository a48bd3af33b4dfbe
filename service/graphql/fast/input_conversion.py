"""Input objects built by a converter compiled once per input type.

Why: Strawberry turns graphql-core's coerced input value into its input
classes field by field, resolving each field's type again for every value it
converts (strawberry.types.arguments.convert_argument: type checks, name
conversion, generic resolution). A registerNode report of 8 GPUs and two
filesystems is over a hundred such calls, repeated for every report. The
same conversion planned once per type is, per object, a few dict lookups and
the class's constructor.

It is installed (install_input_plans, when the app is built with the fast
path on: install.py) through Strawberry's own hook for input types that
build their value themselves (StrawberryObjectDefinition.from_input), on
every input type of the schema that does not use that hook already; the
schema's modules do not know about it. It keeps
convert_argument's rules for the types it plans: null and UNSET pass through,
lists are copied, leaves (scalars, enums) are taken as graphql-core parsed
them, nested inputs are built by their own plan, fields the client omitted
get None unless the class gives a default. A field of any other kind (Maybe,
a lazy or generic type, a GlobalID) is converted by Strawberry itself
(InputContext.convert), so nothing is converted differently, only faster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING
from typing import Any, TypeVar

import strawberry
from graphql import GraphQLInputObjectType
from strawberry.types.arguments import InputContext
from strawberry.types.base import (
    StrawberryList,
    StrawberryMaybe,
    StrawberryObjectDefinition,
    StrawberryOptional,
    StrawberryType,
    has_object_definition,
)
from strawberry.types.unset import UNSET

# convert_argument's own test for a leaf (private in Strawberry): the plan
# must decide exactly as it does (tests/fast_path/test_input_conversion.py).
from service.graphql.private_api import core_schema, is_strawberry_leaf

from . import switch

T = TypeVar("T")
Convert = Callable[[Any, InputContext], Any]


def _as_is(value: Any, context: InputContext) -> Any:
    return value


def _converter(type_: StrawberryType | type, context: InputContext) -> Convert:
    # Maybe is a kind of Optional with its own rules (Some(...)): Strawberry's.
    if isinstance(type_, StrawberryOptional) and not isinstance(type_, StrawberryMaybe):
        inner = _converter(type_.of_type, context)
        if inner is _as_is:
            return _as_is

        def optional(value: Any, context: InputContext) -> Any:
            return value if value is None or value is UNSET else inner(value, context)

        return optional
    if isinstance(type_, StrawberryList):
        item = _converter(type_.of_type, context)

        def items(value: Any, context: InputContext) -> Any:
            if value is None or value is UNSET:
                return value
            if item is _as_is:
                # Copied, not shared: graphql-core hands every request that
                # omits a value the same default list.
                return list(value)
            return [item(x, context) for x in value]

        return items
    if is_strawberry_leaf(type_, context.scalar_registry):
        return _as_is
    if has_object_definition(type_):
        definition: StrawberryObjectDefinition = type_.__strawberry_definition__
        build = definition.from_input
        if definition.is_input and build is not None:
            cls: type = type_

            def nested(value: Any, context: InputContext) -> Any:
                if value is None or value is UNSET:
                    return value
                return build(cls, value, context)

            return nested

    def strawberrys(value: Any, context: InputContext) -> Any:
        return context.convert(value, type_)

    return strawberrys


class _Plan:
    def __init__(self, definition: StrawberryObjectDefinition, context: InputContext) -> None:
        name_of = context.config.name_converter.from_field
        # Strawberry's implicit None for every field without a default:
        # graphql-core already refused a missing required field.
        self.omitted = {
            f.python_name: None
            for f in definition.fields
            if f.default_value is MISSING and f.default_factory is MISSING
        }
        self.types = {
            f.python_name: f.resolve_type(type_definition=definition) for f in definition.fields
        }
        self.fields = [
            (name_of(f), f.python_name, _converter(self.types[f.python_name], context))
            for f in definition.fields
        ]


def compiled_input(cls: type[T]) -> type[T]:
    """Build `cls` (a @strawberry.input class) from input values through a compiled plan.

    The plan is made on first use, when every forward reference between the
    input types resolves.
    """
    definition: StrawberryObjectDefinition = cls.__strawberry_definition__  # type: ignore[attr-defined]
    if not definition.is_input:
        raise TypeError(f"{cls.__name__} is not a @strawberry.input class")
    plan: _Plan | None = None

    def from_input(type_: type, value: Mapping[str, Any], context: InputContext) -> Any:
        nonlocal plan
        if plan is None:
            plan = _Plan(definition, context)
        kwargs: dict[str, Any] = dict(plan.omitted)
        if context.info is not None and not switch.enabled(context.info.context):
            # The fast path switched off: every field by Strawberry's own
            # conversion (InputContext.convert, as from_input's contract asks).
            for graphql_name, python_name, _convert in plan.fields:
                if graphql_name in value:
                    kwargs[python_name] = context.convert(
                        value[graphql_name], plan.types[python_name], graphql_name
                    )
            return type_(**kwargs)
        for graphql_name, python_name, convert in plan.fields:
            if graphql_name in value:
                kwargs[python_name] = convert(value[graphql_name], context)
        return type_(**kwargs)

    definition.from_input = from_input
    return cls


def install_input_plans(schema: strawberry.Schema) -> None:
    """A compiled plan for each input type of the schema that builds its values Strawberry's way.

    Idempotent: a type whose from_input is set (by an earlier install, or by
    Strawberry for a type with its own way) is left as it is.
    """
    for name, type_ in core_schema(schema).type_map.items():
        if not isinstance(type_, GraphQLInputObjectType):
            continue
        definition = schema.get_type_by_name(name)
        if (
            isinstance(definition, StrawberryObjectDefinition)
            and definition.is_input
            and definition.from_input is None
        ):
            compiled_input(definition.origin)
