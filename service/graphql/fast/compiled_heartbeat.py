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
that the beat itself returns (BEAT_FIELDS: id, state, stateReason,
stateChangedBy, schedulable; aliases and __typename too), without directives
or fragments; and, last, optionally `weights { path pinnedBy }` (issue 31:
an agent that watches weights learns their pins from every beat's answer, so
a replica placed between two reports is known to the node within a beat).
The agent's own documents (agent/operations/heartbeat.graphql and
heartbeat_pins.graphql) are of this shape. A heartbeat asking for more (its
hostname, its GPUs) is graphql-core's: the resolver reads the rest of the
node after the beat.

How it stays exact: the same domain call as the resolver, behind the same
gate (front_door.py), each field read from the beat as Node.of reads it
(Node.read), the schema's own serializers for each leaf. Whatever graphql-core would
have to decide, it declines with a reason, and graphql-core then runs the
document as usual. Before the beat: a node id that is not a string (an ID
sent as a number is graphql-core's to coerce), a caller the gate refuses
(the resolver refuses it too, writing nothing). After the beat, the
beat is never run again: when it failed (an unknown node), or a leaf is one
graphql-core would refuse, its outcome is handed over (hand_over.py: the
resolver's answer step, mutations.beat_answer, from the beat) and
graphql-core words the answer from it.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import strawberry
from graphql import (
    FieldNode,
    OperationDefinitionNode,
    OperationType,
    SelectionNode,
    SelectionSetNode,
    StringValueNode,
    VariableNode,
)

from service.database import connections
from service.fleet import heartbeats, node_details
from service.fleet.node_details import WeightsRecord
from service.graphql.operations.mutations import beat_answer

from .documents import only_root_field
from .fast_request import FastRequest
from .node_leaves import NodeLeaves, node_leaves, write_and_answer
from .outcomes import Answered, Declined, Outcome, encode

FIELD = "heartbeat"

# The fields of Node (by Python name) whose readers (Node.read) need only what
# a beat returns (node_reads.BeatRecord: id, state, state_reason,
# state_actor): the fields this route answers.
BEAT_FIELDS: Final = frozenset({"id", "state", "state_reason", "state_changed_by", "schedulable"})


class CompiledHeartbeat:
    def __init__(
        self,
        key: str,
        node_id: str | None,
        variable: str | None,
        leaves: NodeLeaves,
        pins: _Pins | None = None,
    ) -> None:
        self._key = key
        self._node_id = node_id
        self._variable = variable
        self._leaves = leaves
        self._pins = pins

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
        outcome = await write_and_answer(
            FIELD,
            lambda: heartbeats.beat(request.engine, node_id),
            beat_answer,
            self._leaves,
            self._key,
            "beat_failed",
        )
        if self._pins is None or not isinstance(outcome, Answered):
            return outcome
        # After the beat, as the resolver reads Node.weights after it: the
        # same statement (node_details.weights_of), so the same pins.
        async with connections.autocommit(request.engine) as conn:
            weights = (await node_details.weights_of(conn, [node_id])).get(node_id, [])
        return Answered(self._pins.close(outcome.body, weights), outcome.reason)


class _Pins:
    """`weights { path pinnedBy }` (aliases none, each field at most once), last in a beat's answer."""

    def __init__(self, fields: tuple[str, ...], after_leaves: bool) -> None:
        self._fields = fields
        self._opening = ("," if after_leaves else "") + '"weights":['

    def close(self, answer: bytes, weights: list[WeightsRecord]) -> bytes:
        """The leaves' answer ({"data":{key:{...}}}) with the weights written before its end."""
        entries = []
        for w in weights:
            values = {"path": w.path, "pinnedBy": list(w.pinned_by)}
            entries.append(encode({name: values[name] for name in self._fields}).decode())
        return answer[:-3] + (self._opening + ",".join(entries) + "]}}}").encode()


def _pin_fields(selection: SelectionNode) -> tuple[str, ...] | Literal[False] | None:
    """The fields selected when `selection` is `weights { path pinnedBy }` as above; None when
    it is not `weights` at all; False when it is `weights` of another shape (graphql-core's)."""
    if not isinstance(selection, FieldNode) or selection.name.value != "weights":
        return None
    if selection.alias or selection.arguments or selection.directives:
        return False
    inner = selection.selection_set
    fields: list[str] = []
    for field in inner.selections if inner is not None else ():
        if (
            not isinstance(field, FieldNode)
            or field.alias
            or field.arguments
            or field.directives
            or field.selection_set is not None
            or field.name.value not in _PIN_FIELDS
            or field.name.value in fields
        ):
            return False
        fields.append(field.name.value)
    return tuple(fields) if fields else False


_PIN_FIELDS = frozenset({"path", "pinnedBy"})


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
    selections = list(root.selection_set.selections)
    pin_fields = _pin_fields(selections[-1]) if selections else None
    if pin_fields is False:
        return None
    pins = None
    if pin_fields is not None:
        selections.pop()
        if any(_pin_fields(s) is not None for s in selections):
            return None  # weights selected twice: graphql-core merges them
        pins = _Pins(pin_fields, after_leaves=bool(selections))
    leaves = node_leaves(schema, SelectionSetNode(selections=tuple(selections)), BEAT_FIELDS)
    if leaves is None:
        return None
    key = root.alias.value if root.alias else FIELD
    return CompiledHeartbeat(key, node_id, variable, leaves, pins)
