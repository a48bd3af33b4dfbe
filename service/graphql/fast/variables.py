"""Variable values coerced by a plan compiled once per operation.

Why: graphql-core coerces a request's variables by walking the value against
its type generically, after a second walk that guards against values nested
too deeply, for every registerNode report (8 GPUs, 2 filesystems, labels)
again. Compiled per type once, the same coercion is a few dict lookups per object.

Exact or delegate: the plan answers only values it coerces exactly as
graphql-core's coerce_input_value would (a str for String and ID, a bool, an
int within Int's 32 bits, a list, a dict whose keys are the type's fields,
every other leaf by the leaf type's own coerce_input_value). Anything else (a
missing or null non-null value, an unknown field, a non-list for a list, a
default on a variable, a value its leaf refuses) raises Declined, and
graphql-core coerces the request itself, with its own errors in its own
words. Recursive and @oneOf input types are not planned at all: their depth
and exclusivity rules are graphql-core's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphql import (
    GRAPHQL_MAX_INT,
    GRAPHQL_MIN_INT,
    GraphQLBoolean,
    GraphQLError,
    GraphQLID,
    GraphQLInputObjectType,
    GraphQLInputType,
    GraphQLInt,
    GraphQLList,
    GraphQLNonNull,
    GraphQLSchema,
    GraphQLString,
    OperationDefinitionNode,
    is_leaf_type,
    is_required_input_field,
)
from graphql.pyutils import Undefined

from service.graphql.private_api import (
    VariableValues,
    VariableValueSource,
    coerce_default_value,
    get_variable_signature,
)

Coerce = Callable[[Any], Any]


class Declined(Exception):
    """Not the plan's to coerce: graphql-core coerces the variables itself."""


def _string(value: Any) -> Any:
    if type(value) is str:
        return value
    raise Declined


def _boolean(value: Any) -> Any:
    if type(value) is bool:
        return value
    raise Declined


def _int(value: Any) -> Any:
    if type(value) is int and GRAPHQL_MIN_INT <= value <= GRAPHQL_MAX_INT:
        return value
    raise Declined


# graphql-core's own scalars, by identity: these answers are theirs exactly
# (coerce_string, coerce_boolean, coerce_int, coerce_id on those types).
_FAST: dict[Any, Coerce] = {
    GraphQLString: _string,
    GraphQLID: _string,
    GraphQLBoolean: _boolean,
    GraphQLInt: _int,
}


def _leaf(type_: Any) -> Coerce:
    fast = _FAST.get(type_)
    if fast is not None:
        return fast
    parse = type_.coerce_input_value

    def leaf(value: Any) -> Any:
        try:
            coerced = parse(value)
        except Exception as error:  # graphql-core too reads any exception here as a refusal
            raise Declined from error
        if coerced is Undefined:
            raise Declined
        return coerced

    return leaf


def _recursive(type_: GraphQLInputObjectType, seen: frozenset[str] = frozenset()) -> bool:
    if type_.name in seen:
        return True
    for field in type_.fields.values():
        named: Any = field.type
        while isinstance(named, (GraphQLNonNull, GraphQLList)):
            named = named.of_type
        if isinstance(named, GraphQLInputObjectType) and _recursive(named, seen | {type_.name}):
            return True
    return False


def _plan(type_: GraphQLInputType) -> Coerce:
    """The coercion of a value of `type_` that may be null (non-null is the caller's check)."""
    if isinstance(type_, GraphQLNonNull):
        inner = _plan(type_.of_type)

        def non_null(value: Any) -> Any:
            if value is None:
                raise Declined
            return inner(value)

        return non_null
    if isinstance(type_, GraphQLList):
        item = _plan(type_.of_type)

        def listed(value: Any) -> Any:
            if value is None:
                return None
            if type(value) is not list:  # a lone value as a list of one: graphql-core's
                raise Declined
            return [item(v) for v in value]

        return listed
    if isinstance(type_, GraphQLInputObjectType):
        return _input_object(type_)
    if not is_leaf_type(type_):
        raise Declined
    leaf = _leaf(type_)

    def nullable_leaf(value: Any) -> Any:
        return None if value is None else leaf(value)

    return nullable_leaf


def _input_object(type_: GraphQLInputObjectType) -> Coerce:
    if type_.is_one_of or _recursive(type_):
        raise Declined
    fields = type_.fields
    # (name, output name, coercion, required, default)
    plan = []
    for name, field in fields.items():
        default = Undefined
        required = is_required_input_field(field)
        if not required:
            default = coerce_default_value(field)
        plan.append((name, field.out_name or name, _plan(field.type), required, default))
    out_type = type_.out_type

    def input_object(value: Any) -> Any:
        if value is None:
            return None
        if type(value) is not dict:
            raise Declined
        for key in value:
            if key not in fields:
                raise Declined
        coerced: dict[str, Any] = {}
        for name, out_name, coerce, required, default in plan:
            if name in value:
                coerced[out_name] = coerce(value[name])
            elif required:
                raise Declined
            elif default is not Undefined:
                coerced[out_name] = default
        return out_type(coerced)

    return input_object


class VariablePlan:
    def __init__(self, variables: list[tuple[str, Any, Coerce, bool]]) -> None:
        # (name, signature, coercion, non-null)
        self._variables = variables

    def coerce(self, inputs: dict[str, Any] | None) -> VariableValues:
        """The variables as graphql-core would coerce them, or raise Declined."""
        given = inputs or {}
        sources: dict[str, VariableValueSource] = {}
        coerced: dict[str, Any] = {}
        for name, signature, coerce, non_null in self._variables:
            value = given.get(name, Undefined)
            if value is Undefined:
                if non_null:
                    raise Declined
                # A nullable variable not given is omitted, as graphql-core does.
                sources[name] = VariableValueSource(signature)
                continue
            sources[name] = VariableValueSource(signature, value)
            coerced[name] = coerce(value)
        return VariableValues(sources, coerced)


def compile_variables(
    schema: GraphQLSchema, operation: OperationDefinitionNode
) -> VariablePlan | None:
    """The plan for this operation's variables; None when graphql-core must coerce them."""
    variables = []
    try:
        for definition in operation.variable_definitions or ():
            if definition.default_value is not None:
                return None
            signature = get_variable_signature(schema, definition)
            if isinstance(signature, GraphQLError):
                return None
            variables.append(
                (
                    signature.name,
                    signature,
                    _plan(signature.type),
                    isinstance(signature.type, GraphQLNonNull),
                )
            )
    except Declined:
        return None
    return VariablePlan(variables)
