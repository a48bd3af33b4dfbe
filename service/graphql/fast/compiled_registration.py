"""The agents' registerNode, compiled: answered without graphql-core's executor.

Why: every agent re-sends its report every few minutes, and with the write
down to one statement (service/fleet/re_registration.py) graphql-core's executor,
Strawberry's resolver wrapper and argument conversion were about a quarter
of a registration's CPU in py-spy (16 agents), more than its SQL.

Which documents: a mutation with one root field, `registerNode`, whose
`input` is a variable, selecting only leaf fields of Node (node_leaves.py),
without directives or fragments. The agent's own document
(agent/operations/register_node.graphql) is one of them.

How it stays exact: the variables are coerced by the same plan the
graphql_core route uses (variables.py: exactly as graphql-core, or not at
all), the input is built by Strawberry's own argument conversion with the
field's own arguments (the compiled input converters, input_conversion.py),
then the same role check, the same write (mutations.store_report) and the
schema's serializers for each leaf. It declines, and graphql-core runs the
document as usual, before the write: variables the plan leaves to
graphql-core (reason variables_for_graphql_core), a caller the role check
refuses (refused). After the write it never writes again: when the write
failed (a bad report, reason register_failed) or a leaf is one graphql-core
would refuse (leaf_not_serializable), the outcome is handed over (hand_over.py: Node.of
the stored record, as the resolver answers) and graphql-core words the
answer from it.
"""

from __future__ import annotations

from typing import Any

import strawberry
from graphql import OperationDefinitionNode, OperationType, VariableNode

from service.fleet.node_reads import NodeRecord
from service.graphql.context import Context
from service.graphql.operations.mutations import store_report
from service.graphql.private_api import core_schema
from service.graphql.types import Node

from .documents import only_root_field
from .fast_request import FastRequest
from .fields import ArgumentConversion
from .node_leaves import NodeLeaves, node_leaves, write_and_answer
from .outcomes import Declined, Outcome
from .variables import Declined as LeftToGraphqlCore
from .variables import VariablePlan, compile_variables

FIELD = "registerNode"
ARGUMENT = "input"


class CompiledRegistration:
    def __init__(
        self,
        key: str,
        variable: str,
        variables: VariablePlan,
        convert: ArgumentConversion,
        leaves: NodeLeaves,
    ) -> None:
        self._key = key
        self._variable = variable
        self._variables = variables
        self._convert = convert
        self._leaves = leaves

    def arguments(self, variables: dict[str, Any] | None) -> dict[str, Any] | Declined:
        try:
            coerced = self._variables.coerce(variables).coerced
        except LeftToGraphqlCore:
            return Declined("variables_for_graphql_core")
        given = coerced.get(self._variable)
        if given is None:  # absent or null: graphql-core's error to word
            return Declined("variables_for_graphql_core")
        # As Strawberry's resolver wrapper converts the field's arguments.
        return self._convert({ARGUMENT: given})

    async def run(self, arguments: dict[str, Any], request: FastRequest) -> Outcome:
        report = arguments[ARGUMENT].to_report(request.settings.clock_skew)
        return await write_and_answer(
            FIELD,
            lambda: store_report(request.context(), report),
            _as_node,
            self._leaves,
            self._key,
            "register_failed",
        )


def _as_node(context: Context, record: NodeRecord) -> Node:
    """registerNode's answer after its write, as its resolver makes it."""
    return Node.of(record)


def _conversion(schema: strawberry.Schema) -> ArgumentConversion | None:
    """registerNode's arguments as Strawberry converts them."""
    try:
        return ArgumentConversion(schema, "Mutation", FIELD)
    except LookupError:
        return None


def compile_registration(
    schema: strawberry.Schema, operation: OperationDefinitionNode
) -> CompiledRegistration | None:
    """A CompiledRegistration for an operation of the shape above, else None."""
    root = only_root_field(operation, OperationType.MUTATION)
    if root is None or root.name.value != FIELD or root.selection_set is None:
        return None
    given = root.arguments or ()
    if len(given) != 1 or given[0].name.value != ARGUMENT:
        return None
    value = given[0].value
    if not isinstance(value, VariableNode):
        return None
    convert = _conversion(schema)
    plan = compile_variables(core_schema(schema), operation)
    leaves = node_leaves(schema, root.selection_set)
    if convert is None or plan is None or leaves is None:
        return None
    key = root.alias.value if root.alias else FIELD
    return CompiledRegistration(key, value.name.value, plan, convert, leaves)
