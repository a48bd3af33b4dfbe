"""The agents' heartbeat, compiled: answered without graphql-core's executor.

Why: every node beats every few seconds, so a cluster sends more heartbeats
than everything else together. With the document cached (documents.py) and
the write batched (service/fleet/heartbeats.py), what was left of a beat's CPU was
mostly graphql-core's executor and Strawberry's resolver wrapper (an
incremental executor, a serial reduction over one mutation field, a
ResolveInfo and a Strawberry Info, argument conversion, completion of three
leaves), none of which a beat's answer needs.

Which documents: a mutation with one root field, `heartbeat`, whose `nodeId`
is a variable or a string literal, selecting only the leaf fields of Node
that the beat itself returns (types.BEAT_FIELDS: id, state, stateReason,
stateChangedBy, schedulable; aliases and __typename too), without directives
or fragments. The agent's own document (agent/operations/heartbeat.graphql)
is one of them. A heartbeat asking for more (its hostname, its GPUs) is
graphql-core's: the resolver reads the rest of the node after the beat.

How it stays exact: the same domain call as the resolver, behind the same
gate (front_door.py), each field read from the beat as Node.of reads it
(types.NODE_FIELDS), the schema's own serializers for each leaf. Whatever graphql-core would
have to decide, it declines with a reason, and graphql-core then runs the
document as usual. Before the beat: a node id that is not a string (an ID
sent as a number is graphql-core's to coerce), a caller the gate refuses
(the resolver refuses it too, writing nothing). After the beat, the
beat is never run again: when it failed (an unknown node), or a leaf is one
graphql-core would refuse, its outcome is handed to the resolver through the
request's Context (FastRequest.hand_over; mutations.py takes it with
Context.once), and graphql-core words the answer from it.
"""

from __future__ import annotations

from typing import Any

import strawberry
from graphql import OperationDefinitionNode, OperationType, StringValueNode, VariableNode

from service.fleet import heartbeats
from service.graphql.mutations import HEARTBEAT
from service.graphql.types import BEAT_FIELDS

from .documents import only_root_field
from .fast_request import FastRequest
from .node_leaves import NodeLeaves, node_leaves, write_and_answer
from .outcomes import Declined, Outcome

FIELD = "heartbeat"


class CompiledHeartbeat:
    def __init__(
        self, key: str, node_id: str | None, variable: str | None, leaves: NodeLeaves
    ) -> None:
        self._key = key
        self._node_id = node_id
        self._variable = variable
        self._leaves = leaves

    def arguments(self, variables: dict[str, Any] | None) -> dict[str, Any] | Declined:
        node_id = self._node_id
        if self._variable is not None:
            node_id = (variables or {}).get(self._variable)
        # An ID variable may also be sent as an integer, which graphql-core
        # coerces; a string is the only case taken here.
        if type(node_id) is not str:
            return Declined("node_id_not_a_string")
        return {"node_id": node_id}

    async def run(self, arguments: dict[str, Any], request: FastRequest) -> Outcome:
        node_id: str = arguments["node_id"]
        return await write_and_answer(
            request,
            (HEARTBEAT, node_id),
            lambda: heartbeats.beat(request.engine, node_id),
            self._leaves,
            self._key,
            "beat_failed",
        )


def compile_heartbeat(
    schema: strawberry.Schema, operation: OperationDefinitionNode
) -> CompiledHeartbeat | None:
    """A CompiledHeartbeat for an operation of the shape above, else None."""
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
    leaves = node_leaves(schema, root.selection_set, BEAT_FIELDS)
    if leaves is None:
        return None
    key = root.alias.value if root.alias else FIELD
    return CompiledHeartbeat(key, node_id, variable, leaves)
