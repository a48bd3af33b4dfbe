"""The schedulers' place, compiled: answered without graphql-core's executor.

Why: with calls sharing transactions (service/scheduling/place_batches.py)
a claim's service CPU is bounded by what runs per call, and graphql-core
executing the mutation (the executor, Strawberry's resolver wrapper and
extension, the union's type resolver and the completion of each field of the
answer) is the largest part of that which the answer does not need.

Which documents: a mutation with one root field, `place` (aliased or not),
whose `input` is a variable, an object literal, or a literal holding
variables, selecting on the PlaceResult union with `__typename` and inline
fragments (`... on Allocated { ... }`, `... on PlaceResult { ... }` or none)
the plain fields of its members and of the objects they hold (Allocation,
PlacementVerdict). Directives, named fragments, and fields with a resolver or
arguments are not compiled: graphql-core answers those documents. The
documents schedulers send (benchmarks/allocation.py, tests/support/reports.py, the
README's examples) are all of this shape.

How it stays exact: the variables are coerced by the plan the graphql_core
route uses (variables.py: exactly as graphql-core, or not at all), the
argument by graphql-core's own get_argument_values (a literal without
variables once per document), the input built by Strawberry's argument
conversion with the field's own arguments; then the same role check as the
field's RequireRole extension, and the resolver's own steps
(allocation_mutations: place_outcome, the domain call with the process's
shared transactions; place_result, the union member it answers;
count_place, the rejection counter). The answer is completed from that
member by the plain-field completers of the execution context
(execution.plain_completer: graphql-core's rules, the schema's own
serializers for each leaf), its fields collected as graphql-core collects
them (in the order their response keys first appear, repeated keys merged).

It declines with a reason, and graphql-core runs the document as usual,
before the place: variables the plan leaves to graphql-core
(variables_for_graphql_core), an argument graphql-core refuses or words
(arguments_for_graphql_core), a caller the role check refuses (refused).
After the place it never places again: when the place raised (place_failed)
or a value of the answer is one graphql-core would refuse
(leaf_not_serializable), the outcome is handed over (hand_over.py: the
resolver's place_answer from it) and graphql-core words the answer from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import Any

import strawberry
from graphql import (
    FieldNode,
    GraphQLError,
    GraphQLField,
    GraphQLObjectType,
    GraphQLSchema,
    GraphQLUnionType,
    InlineFragmentNode,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    get_argument_values,
    get_named_type,
    is_abstract_type,
    is_non_null_type,
)
from strawberry.types.base import StrawberryObjectDefinition

from service.graphql.operations.allocation_mutations import (
    count_place,
    place_answer,
    place_outcome,
    place_result,
)
from service.graphql.private_api import core_schema, optimized_is_awaitable

from .documents import only_root_field
from .execution import (
    DELEGATED,
    Completer,
    Entry,
    object_completer,
    plain_attribute,
    plain_completer,
)
from .fast_request import FastRequest
from .fields import ArgumentConversion
from .hand_over import HandedOver
from .outcomes import Answered, Declined, Outcome, encode
from .variables import Declined as LeftToGraphqlCore
from .variables import VariablePlan, compile_variables

FIELD = "place"
ARGUMENT = "input"

# A response key -> the field nodes selecting it, in the order keys first appear.
Collected = dict[str, list[FieldNode]]


class CompiledPlace:
    def __init__(
        self,
        key: str,
        field: GraphQLField,
        node: FieldNode,
        variables: VariablePlan,
        literal: dict[str, Any] | None,
        convert: ArgumentConversion,
        members: dict[type, Completer],
    ) -> None:
        self._key = key
        self._field = field
        self._node = node
        self._variables = variables
        self._literal = literal
        self._convert = convert
        self._members = members

    def _argument_values(self, variables: dict[str, Any] | None) -> dict[str, Any] | Declined:
        """The field's arguments as graphql-core's executor coerces them, or a decline."""
        if self._literal is not None:
            return self._literal
        try:
            values = self._variables.coerce(variables)
        except LeftToGraphqlCore:
            return Declined("variables_for_graphql_core")
        try:
            return get_argument_values(self._field, self._node, values)
        except GraphQLError:  # e.g. null in a non-null position: graphql-core's words
            return Declined("arguments_for_graphql_core")

    def arguments(self, variables: dict[str, Any] | None) -> dict[str, Any] | Declined:
        values = self._argument_values(variables)
        if isinstance(values, Declined):
            return values
        # As Strawberry's resolver wrapper converts the field's arguments.
        return self._convert(values)

    async def run(self, arguments: dict[str, Any], request: FastRequest) -> Outcome:
        placement = arguments[ARGUMENT].to_request()
        try:
            outcome = await place_outcome(request.context(), placement)
        except Exception as error:  # graphql-core words it (masked if unexpected)
            return Declined("place_failed", HandedOver.error(FIELD, error))
        result = place_result(outcome)
        try:
            completed = self._members[type(result)](result)
        except DELEGATED:
            return Declined(
                "leaf_not_serializable", HandedOver(FIELD, lambda context: place_answer(outcome))
            )
        count_place(outcome)
        return Answered(encode({"data": {self._key: completed}}))


def _collect(
    schema: GraphQLSchema,
    parent: GraphQLObjectType,
    selection_sets: Iterable[SelectionSetNode],
    collected: Collected,
) -> bool:
    """Add the fields these selections select on `parent`, as graphql-core's collect_fields
    does; False for what is not compiled (a directive, a named fragment)."""
    for selection_set in selection_sets:
        for selection in selection_set.selections:
            if selection.directives:
                return False
            if isinstance(selection, FieldNode):
                key = selection.alias.value if selection.alias else selection.name.value
                collected.setdefault(key, []).append(selection)
            elif isinstance(selection, InlineFragmentNode):
                condition = selection.type_condition
                if condition is not None:
                    on = schema.get_type(condition.name.value)
                    # graphql-core's does_fragment_condition_match
                    applies = on is parent or (
                        is_abstract_type(on) and schema.is_sub_type(on, parent)
                    )
                    if not applies:
                        continue
                if not _collect(schema, parent, (selection.selection_set,), collected):
                    return False
            else:
                return False
    return True


def _entries(
    schema: GraphQLSchema, parent: GraphQLObjectType, collected: Collected
) -> list[Entry] | None:
    """How each collected field of `parent` is read and completed; None if one is not plain."""
    entries: list[Entry] = []
    for key, nodes in collected.items():
        name = nodes[0].name.value
        if name == "__typename":
            entries.append((key, [], None, None))  # the parent type's name
            continue
        field = parent.fields.get(name)
        if field is None or any(node.arguments for node in nodes):
            return None
        attribute = plain_attribute(field)
        if attribute is None:
            return None
        selections = [node.selection_set for node in nodes if node.selection_set is not None]

        def object_entries(
            object_type: GraphQLObjectType, selections: list[SelectionSetNode] = selections
        ) -> list[Entry] | None:
            inner: Collected = {}
            if not _collect(schema, object_type, selections, inner):
                return None
            return _entries(schema, object_type, inner)

        complete = plain_completer(field.type, object_entries, optimized_is_awaitable)
        if complete is None:
            return None
        entries.append((key, [], attrgetter(attribute), complete))
    return entries


def _members(
    schema: strawberry.Schema,
    union: GraphQLUnionType,
    selection_set: SelectionSetNode,
    non_null: bool,
) -> dict[type, Completer] | None:
    """The completer of each member of the union, by its Strawberry class, for this selection."""
    core = core_schema(schema)
    members: dict[type, Completer] = {}
    for member in union.types:
        definition = schema.get_type_by_name(member.name)
        if not isinstance(definition, StrawberryObjectDefinition):
            return None
        collected: Collected = {}
        if not _collect(core, member, (selection_set,), collected):
            return None
        entries = _entries(core, member, collected)
        if entries is None:
            return None
        members[definition.origin] = object_completer(
            entries, member.name, optimized_is_awaitable, non_null
        )
    return members


def compile_place(
    schema: strawberry.Schema, operation: OperationDefinitionNode
) -> CompiledPlace | None:
    """A CompiledPlace for an operation of the shape above, else None."""
    root = only_root_field(operation, OperationType.MUTATION)
    mutation = core_schema(schema).mutation_type
    if root is None or root.name.value != FIELD or root.selection_set is None or mutation is None:
        return None
    field = mutation.fields.get(FIELD)
    union = get_named_type(field.type) if field is not None else None
    if field is None or not isinstance(union, GraphQLUnionType):
        return None
    try:
        convert = ArgumentConversion(schema, "Mutation", FIELD)
    except LookupError:
        return None
    variables = compile_variables(core_schema(schema), operation)
    if variables is None:
        return None
    literal = None
    if not operation.variable_definitions:
        # No variables: the argument is the same every time, coerced once.
        try:
            literal = get_argument_values(field, root)
        except GraphQLError:
            return None
    members = _members(schema, union, root.selection_set, is_non_null_type(field.type))
    if members is None:
        return None
    key = root.alias.value if root.alias else FIELD
    return CompiledPlace(key, field, root, variables, literal, convert, members)
