"""A write a compiled route made before it declined, handed to graphql-core's run of the same document.

A compiled mutation route (heartbeat, registration, place) writes first and
then writes its answer. When it cannot write the answer (the write failed,
or a value of the answer is one graphql-core would refuse: leaf_not_serializable),
graphql-core must word the answer, and must not write again: a beat or a
place made twice is a second write, a second event, a second hold. So the
route declines with the write's outcome (Declined.handed_over), and the front
door runs the document through graphql-core with a HandedOver as its root
value.

The resolvers know nothing of it. install.py wraps, once, the graphql-core
resolver of each root field a compiled route declares (front_door.ROUTES):
given a HandedOver for its field as the root value, the wrapper answers from
it (the resolver's own answer step from the write's outcome, or the write's
error raised where the resolver would have raised it); given anything else
(every other request, and every request with the fast path off), it calls the
resolver as before. A root value is one execution's, so the outcome cannot
reach another request, nor a second field of the same one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import strawberry
from graphql import GraphQLObjectType, GraphQLResolveInfo

from service.graphql.context import Context
from service.graphql.private_api import core_schema

# Marks a resolver wrapped here, so that installing twice wraps once.
_WRAPPED = "_answers_handed_over"


@dataclass(frozen=True, slots=True)
class HandedOver:
    """The outcome of a root field's write, for graphql-core's run of the same document.

    `answer` is what the field's resolver returns after that write (an
    awaitable, as an async resolver returns), made from the request's
    Context; for a write that raised, it raises the same error.
    """

    field: str  # the root field's GraphQL name
    answer: Callable[[Context], Any]

    @classmethod
    def error(cls, field: str, error: Exception) -> HandedOver:
        """The hand-over of a write that raised: the resolver would have raised it."""

        async def fail(context: Context) -> Any:
            raise error

        return cls(field, fail)


def answer_handed_over(schema: strawberry.Schema, fields: Iterable[str]) -> None:
    """Wrap the resolvers of these root fields ("Type.field") to answer a HandedOver root value."""
    core = core_schema(schema)
    for declared in fields:
        type_name, _, name = declared.partition(".")
        root = core.get_type(type_name)
        if not isinstance(root, GraphQLObjectType) or name not in root.fields:
            raise LookupError(f"{declared} is not a root field of the schema")
        field = root.fields[name]
        if field.resolve is None or getattr(field.resolve, _WRAPPED, False):
            continue
        field.resolve = _answering(field.resolve)


def _answering(resolve: Callable[..., Any]) -> Callable[..., Any]:
    def resolve_or_answer(source: Any, info: GraphQLResolveInfo[Any], **arguments: Any) -> Any:
        if type(source) is HandedOver and source.field == info.field_name:
            return source.answer(info.context)
        return resolve(source, info, **arguments)

    setattr(resolve_or_answer, _WRAPPED, True)
    return resolve_or_answer
