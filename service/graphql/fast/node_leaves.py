"""A mutation's answer when it selects only leaves of Node: compiled once, filled from Node.of.

For the compiled agent mutations (compiled_heartbeat.py, compiled_registration.py):
each selected field is a scalar or enum of Node without arguments, directives
or fragments (aliases and __typename too), serialized by the schema's own
leaf type as graphql-core's complete_leaf_value does. A value graphql-core
would refuse (null for a non-null field, or one its serializer rejects) is
not answered here: the route hands the write's outcome over (hand_over.py)
and graphql-core words the error.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar, cast

import strawberry
from graphql import (
    FieldNode,
    GraphQLError,
    GraphQLNonNull,
    GraphQLObjectType,
    SelectionSetNode,
    get_named_type,
    is_leaf_type,
)

from service.fleet.node_reads import BeatRecord, NodeRecord
from service.graphql.context import Context
from service.graphql.private_api import core_schema
from service.graphql.types import Node

from .fields import plain_fields
from .hand_over import HandedOver
from .outcomes import Answered, Declined, Outcome

# What json.dumps does with a str (ensure_ascii, as outcomes.encode writes
# answers), without its encoder's dispatch: a heartbeat writes its node's id.
_json_string: Callable[[str], str] = json.encoder.encode_basestring_ascii

# Values whose written form is kept per leaf: a node's state, flags, null.
# Strings (ids, names, reasons) are not: their values are unbounded.
_KEPT_TYPES = (Enum, bool, type(None))
_MAX_KEPT = 64
_UNSEEN = object()

R = TypeVar("R", NodeRecord, BeatRecord)


@dataclass(frozen=True)
class _Leaf:
    key: str
    prefix: str  # the key as the answer writes it
    # As Node.of reads it (Node.read: a NodeRecord, or a BeatRecord for
    # compiled_heartbeat.BEAT_FIELDS); None: __typename.
    read: Callable[[Any], Any] | None
    serialize: Callable[[Any], Any]
    nullable: bool
    # Written forms of the values in _KEPT_TYPES seen so far (a heartbeat's
    # state is one of five): each is serialized and dumped once, not per
    # beat. None: graphql-core refuses the value.
    written: dict[Any, str | None] = dataclasses.field(default_factory=dict)

    def write(self, value: Any) -> str | None:
        """The value as the answer writes it, None when graphql-core would refuse it."""
        if isinstance(value, _KEPT_TYPES):
            # One lookup: an Enum's hash is a Python-level call.
            kept = self.written.get(value, _UNSEEN)
            if kept is not _UNSEEN:
                return cast("str | None", kept)
        try:
            serialized = None if value is None else self.serialize(value)
        except (GraphQLError, TypeError, ValueError):
            serialized = None
        # A leaf's value is a scalar: json.dumps writes it as it would
        # inside the whole answer (outcomes.encode).
        if serialized is None and (value is not None or not self.nullable):
            written = None
        elif type(serialized) is str:
            written = _json_string(serialized)  # a node's id, name or reason
        else:
            written = json.dumps(serialized)
        if isinstance(value, _KEPT_TYPES) and len(self.written) < _MAX_KEPT:
            self.written[value] = written
        return written


class NodeLeaves:
    """The selected leaves of a Node, in the order selected."""

    def __init__(self, leaves: list[_Leaf]) -> None:
        self._leaves = leaves
        # The answer's opening by answer key: a compiled route answers under
        # one key (its field's alias or name), written once, not per answer.
        self._openings: dict[str, str] = {}

    def answer(self, record: NodeRecord | BeatRecord, answer_key: str) -> bytes | None:
        """The whole answer, {"data": {answer_key: {leaf: value...}}} as outcomes.encode
        writes it; None when graphql-core would refuse a leaf.

        Written from the record field by field (Node.read, as Node.of
        reads it) rather than through a Node and a nested json.dumps: this is
        the heartbeat's hot path (benchmarks/floor.py measures it).
        """
        opening = self._openings.get(answer_key)
        if opening is None:
            opening = self._openings[answer_key] = '{"data":{' + json.dumps(answer_key) + ":{"
        answer = [opening]
        for leaf in self._leaves:
            answer.append(leaf.prefix)
            if leaf.read is None:
                answer.append('"Node"')
                continue
            written = leaf.write(leaf.read(record))
            if written is None:
                return None
            answer.append(written)
        answer.append("}}}")
        return "".join(answer).encode()


def node_leaves(
    schema: strawberry.Schema,
    selection_set: SelectionSetNode,
    only: frozenset[str] | None = None,
) -> NodeLeaves | None:
    """The compiled selection when it selects only leaves of Node (and only
    the fields named in `only`, by their Python names, if given), else None."""
    node_type = core_schema(schema).get_type("Node")
    if not isinstance(node_type, GraphQLObjectType):
        return None
    attributes = plain_fields(schema, "Node")
    leaves: list[_Leaf] = []
    for selection in selection_set.selections:
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
        if only is not None and strawberry_field.python_name not in only:
            return None
        read = Node.read(strawberry_field.python_name)
        if read is None:
            return None
        leaf_type = get_named_type(field.type)
        if not is_leaf_type(leaf_type):
            return None
        # The leaf's output coercion as graphql-core's complete_leaf_value calls it.
        leaves.append(
            _Leaf(
                key,
                prefix,
                read,
                leaf_type.coerce_output_value,
                not isinstance(field.type, GraphQLNonNull),
            )
        )
    return NodeLeaves(leaves)


async def write_and_answer(
    field: str,
    write: Callable[[], Awaitable[R]],
    resolver_answer: Callable[[Context, R], Any],
    leaves: NodeLeaves,
    answer_key: str,
    failed: str,
) -> Outcome:
    """Make the mutation's write, then answer its leaves; after the write, never a second one.

    A failed write (declined as `failed`) or a leaf graphql-core would refuse
    (leaf_not_serializable) declines with the write's outcome handed over
    (hand_over.py): graphql-core words the answer from it, `resolver_answer`
    being what the field's resolver answers after the same write.
    """
    try:
        record = await write()
    except Exception as error:  # graphql-core words it (masked if unexpected)
        return Declined(failed, HandedOver.error(field, error))
    answer = leaves.answer(record, answer_key)
    if answer is None:
        return Declined(
            "leaf_not_serializable",
            HandedOver(field, lambda context: resolver_answer(context, record)),
        )
    return Answered(answer)
