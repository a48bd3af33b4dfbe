"""The agents' heartbeat, compiled: answered without graphql-core's executor.

Why: every node beats every few seconds, so a cluster sends more heartbeats
than everything else together. With the document cached (documents.py) and
the write batched (service/heartbeats.py), what was left of a beat's CPU was
mostly graphql-core's executor and Strawberry's resolver wrapper: about 40%
in py-spy with 32 concurrent beats (an incremental executor, a serial
reduction over one mutation field, a ResolveInfo and a Strawberry Info,
argument conversion, completion of three leaves).

Which documents: a mutation with one root field, `heartbeat`, whose `nodeId`
is a variable or a string literal, selecting only leaf fields of Node
(scalars and enums; aliases and __typename too), without directives or
fragments. The agent's own document (agent/operations/heartbeat.graphql) is
one of them.

How it stays exact: the same domain call as the resolver, the same role
check, the schema's own serializers for each leaf. Whenever it would have to
decide something graphql-core decides (a node id that is not a string, a
refused token, an unknown node, a null in a non-null field, any failure), it
answers nothing and graphql-core runs the document as usual. That re-runs the
beat, which is harmless: a heartbeat only moves last_seen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import strawberry
from graphql import (
    FieldNode,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLSchema,
    OperationDefinitionNode,
    OperationType,
    StringValueNode,
    VariableNode,
    get_named_type,
    is_leaf_type,
)
from strawberry.types.base import StrawberryObjectDefinition

from service import heartbeats

from .context import Context
from .documents import only_root_field
from .permissions import check_role, role_of
from .types import Node

FIELD = "heartbeat"


@dataclass(frozen=True)
class _Leaf:
    key: str
    attribute: str | None  # None: __typename
    serialize: Callable[[Any], Any]
    nullable: bool


class CompiledHeartbeat:
    def __init__(
        self, key: str, node_id: str | None, variable: str | None, leaves: list[_Leaf]
    ) -> None:
        self._key = key
        self._node_id = node_id
        self._variable = variable
        self._leaves = leaves
        self._role = role_of("Mutation", FIELD)

    async def run(
        self, variables: dict[str, Any] | None, context: Context
    ) -> dict[str, Any] | None:
        """The response body, or None: graphql-core must answer this one."""
        node_id = self._node_id
        if self._variable is not None:
            node_id = (variables or {}).get(self._variable)
        # An ID variable may also be sent as an integer, which graphql-core
        # coerces; a string is the only case taken here.
        if type(node_id) is not str:
            return None
        try:
            check_role(self._role, FIELD, context.principal, {"node_id": node_id})
            node = Node.of(await heartbeats.beat(context.engine, node_id))
        except Exception:
            return None
        answer: dict[str, Any] = {}
        for leaf in self._leaves:
            if leaf.attribute is None:
                answer[leaf.key] = "Node"
                continue
            value = getattr(node, leaf.attribute)
            try:
                serialized = None if value is None else leaf.serialize(value)
            except Exception:
                return None
            # graphql-core refuses a leaf that serializes to null (an error
            # in a non-null field): its answer, not ours.
            if serialized is None and (value is not None or not leaf.nullable):
                return None
            answer[leaf.key] = serialized
        return {"data": {self._key: answer}}


def compile_heartbeat(
    schema: strawberry.Schema, operation: OperationDefinitionNode
) -> CompiledHeartbeat | None:
    """A CompiledHeartbeat for an operation of the shape above, else None."""
    core: GraphQLSchema = schema._schema
    root = only_root_field(operation, OperationType.MUTATION)
    if root is None or root.name.value != FIELD or root.selection_set is None:
        return None
    arguments = root.arguments or ()
    if len(arguments) != 1 or arguments[0].name.value != "nodeId":
        return None
    value = arguments[0].value
    node_id = variable = None
    if isinstance(value, VariableNode):
        variable = value.name.value
    elif isinstance(value, StringValueNode):
        node_id = value.value
    else:
        return None
    node_type = core.get_type("Node")
    definition = schema.get_type_by_name("Node")
    if not isinstance(node_type, GraphQLObjectType) or not isinstance(
        definition, StrawberryObjectDefinition
    ):
        return None
    attributes = {
        schema.config.name_converter.get_graphql_name(f): f
        for f in definition.fields
        if f.base_resolver is None and not f.extensions
    }
    leaves = []
    for selection in root.selection_set.selections:
        if (
            not isinstance(selection, FieldNode)
            or selection.directives
            or selection.arguments
            or selection.selection_set is not None
        ):
            return None
        name = selection.name.value
        key = selection.alias.value if selection.alias else name
        if name == "__typename":
            leaves.append(_Leaf(key, None, str, False))
            continue
        field = node_type.fields.get(name)
        strawberry_field = attributes.get(name)
        if field is None or strawberry_field is None:
            return None
        leaf_type = get_named_type(field.type)
        if not is_leaf_type(leaf_type):
            return None
        # The leaf's output coercion as graphql-core's complete_leaf_value
        # calls it (coerce_output_value since 3.3, serialize before).
        coerce = getattr(leaf_type, "coerce_output_value", None) or leaf_type.serialize
        leaves.append(
            _Leaf(
                key,
                strawberry_field.python_name,
                coerce,
                not isinstance(field.type, GraphQLNonNull),
            )
        )
    key = root.alias.value if root.alias else FIELD
    return CompiledHeartbeat(key, node_id, variable, leaves)
