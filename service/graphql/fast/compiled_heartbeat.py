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
check, each field read from the record as Node.of reads it (types.NODE_FIELDS),
the schema's own serializers for each leaf. Whatever graphql-core would
have to decide, it declines with a reason, and graphql-core then runs the
document as usual. Before the beat: a node id that is not a string (an ID
sent as a number is graphql-core's to coerce), a caller the role check
refuses (the resolver refuses it too, writing nothing). After the beat, the
beat is never run again: when it failed (an unknown node), or a leaf is one
graphql-core would refuse, its outcome is handed to the resolver through the
request's context (Context.hand_over; mutations.py takes it with
Context.once), and graphql-core words the answer from it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import strawberry
from graphql import (
    FieldNode,
    GraphQLError,
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

from service import heartbeats
from service.errors import InventoryError
from service.graphql.context import Context
from service.graphql.mutations import HEARTBEAT
from service.graphql.permissions import check_role, role_of
from service.graphql.types import Node
from service.node_views import NodeRecord

from .documents import only_root_field
from .fields import plain_fields
from .outcomes import Answered, Declined, Outcome
from .private_api import core_schema

FIELD = "heartbeat"


@dataclass(frozen=True)
class _Leaf:
    key: str
    prefix: str  # the key as the answer writes it
    read: Callable[[NodeRecord], Any] | None  # as Node.of reads it; None: __typename
    serialize: Callable[[Any], Any]
    nullable: bool


class CompiledHeartbeat:
    def __init__(
        self, key: str, node_id: str | None, variable: str | None, leaves: list[_Leaf]
    ) -> None:
        # The answer as outcomes.encode writes {"data": {key: {leaf: value...}}}.
        self._head = f'{{"data":{{{json.dumps(key)}:{{'
        self._node_id = node_id
        self._variable = variable
        self._leaves = leaves
        self._role = role_of("Mutation", FIELD)

    async def run(self, variables: dict[str, Any] | None, context: Context) -> Outcome:
        node_id = self._node_id
        if self._variable is not None:
            node_id = (variables or {}).get(self._variable)
        # An ID variable may also be sent as an integer, which graphql-core
        # coerces; a string is the only case taken here.
        if type(node_id) is not str:
            return Declined("node_id_not_a_string")
        try:
            check_role(self._role, FIELD, context.principal, {"node_id": node_id})
        except InventoryError:
            return Declined("refused")
        key = (HEARTBEAT, node_id)
        try:
            record = await heartbeats.beat(context.engine, node_id)
        except Exception as error:  # graphql-core words it (masked if unexpected)
            context.hand_over(key, error=error)
            return Declined("beat_failed")
        answer = [self._head]
        for leaf in self._leaves:
            answer.append(leaf.prefix)
            if leaf.read is None:
                answer.append('"Node"')
                continue
            value = leaf.read(record)
            try:
                serialized = None if value is None else leaf.serialize(value)
            except (GraphQLError, TypeError, ValueError):
                serialized = None
            # graphql-core refuses a leaf that serializes to null or cannot
            # be serialized (an error in the answer): its answer, not ours.
            if serialized is None and (value is not None or not leaf.nullable):
                context.hand_over(key, result=record)
                return Declined("leaf_not_serializable")
            # A leaf's value is a scalar: json.dumps writes it as it would
            # inside the whole answer (outcomes.encode).
            answer.append(json.dumps(serialized))
        answer.append("}}}")
        return Answered("".join(answer).encode())


def compile_heartbeat(
    schema: strawberry.Schema, operation: OperationDefinitionNode
) -> CompiledHeartbeat | None:
    """A CompiledHeartbeat for an operation of the shape above, else None."""
    core: GraphQLSchema = core_schema(schema)
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
    if not isinstance(node_type, GraphQLObjectType):
        return None
    attributes = plain_fields(schema, "Node")
    leaves: list[_Leaf] = []
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
        prefix = f"{',' if leaves else ''}{json.dumps(key)}:"
        if any(leaf.key == key for leaf in leaves):
            continue  # the same field again (validation saw to that): answered once
        if name == "__typename":
            leaves.append(_Leaf(key, prefix, None, str, False))
            continue
        field = node_type.fields.get(name)
        strawberry_field = attributes.get(name)
        if field is None or strawberry_field is None:
            return None
        read = Node.read(strawberry_field.python_name)
        if read is None:
            return None
        leaf_type = get_named_type(field.type)
        if not is_leaf_type(leaf_type):
            return None
        # The leaf's output coercion as graphql-core's complete_leaf_value calls it.
        coerce = leaf_type.coerce_output_value
        leaves.append(
            _Leaf(
                key,
                prefix,
                read,
                coerce,
                not isinstance(field.type, GraphQLNonNull),
            )
        )
    key = root.alias.value if root.alias else FIELD
    return CompiledHeartbeat(key, node_id, variable, leaves)
