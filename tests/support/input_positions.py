"""The positions of the schema a request can put a value in, walked from the schema itself.

Every argument and input field of every root query and mutation (in lists,
in inputs in inputs) whose type a test asks for, with the documents and
variables that put a value there and dummies everywhere else: tests built on
it cover a field added tomorrow without being edited (tests/api/test_text_inputs.py,
tests/api/test_list_bounds.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from graphql import (
    GraphQLArgument,
    GraphQLEnumType,
    GraphQLField,
    GraphQLInputField,
    GraphQLInputObjectType,
    GraphQLInputType,
    GraphQLList,
    GraphQLNonNull,
    get_named_type,
    is_leaf_type,
)
from graphql.pyutils import Undefined

from service.graphql.schema import schema

Both = tuple[httpx.AsyncClient, httpx.AsyncClient]
CORE = schema._schema

# A value of each scalar a required argument or input field may need, as
# written in a document and as a variable's JSON value.
DUMMIES = {
    "String": '"x"',
    "ID": '"x"',
    "Int": "1",
    "Float": "1.0",
    "Boolean": "false",
    "Bytes": "1",
    "DateTime": '"2024-01-01T00:00:00+00:00"',
}


@dataclass(frozen=True)
class Position:
    """One argument or input field of a root field, and how to reach it."""

    root: str  # "Query" or "Mutation"
    field: str
    steps: tuple[str, ...]  # argument, then input fields; "[0]" for a list's first item
    type_: GraphQLInputType  # the position's own type (the list item's, inside a list)

    @property
    def path(self) -> str:
        """The argument path a refusal names: reason, input.nodeId, nodeIds[0]."""
        return self.steps[0] + "".join(s if s.startswith("[") else f".{s}" for s in self.steps[1:])

    def __str__(self) -> str:
        return f"{self.field}.{self.path}"


def _unwrapped(type_: GraphQLInputType) -> GraphQLInputType:
    return type_.of_type if isinstance(type_, GraphQLNonNull) else type_


def _positions_in(
    type_: GraphQLInputType,
    steps: tuple[str, ...],
    seen: frozenset[str],
    wanted: Callable[[GraphQLInputType], bool],
) -> Iterator[tuple[tuple[str, ...], GraphQLInputType]]:
    if wanted(type_):
        yield steps, type_
    inner = _unwrapped(type_)
    if isinstance(inner, GraphQLList):
        yield from _positions_in(inner.of_type, (*steps, "[0]"), seen, wanted)
    elif isinstance(inner, GraphQLInputObjectType) and inner.name not in seen:
        for name, field in inner.fields.items():
            yield from _positions_in(field.type, (*steps, name), seen | {inner.name}, wanted)


def positions(wanted: Callable[[GraphQLInputType], bool]) -> list[Position]:
    """Every position of a root query or mutation whose type is `wanted`."""
    found = []
    for root in ("Query", "Mutation"):
        root_type = CORE.get_type(root)
        assert root_type is not None
        for name, field in root_type.fields.items():  # type: ignore[attr-defined]
            for argument_name, argument in field.args.items():
                for steps, type_ in _positions_in(
                    argument.type, (argument_name,), frozenset(), wanted
                ):
                    found.append(Position(root, name, steps, type_))
    return found


def required(holder: GraphQLArgument | GraphQLInputField) -> bool:
    return isinstance(holder.type, GraphQLNonNull) and holder.default_value is Undefined


def dummy(type_: GraphQLInputType) -> str:
    """A valid literal of the type: its required fields only, lists of one."""
    inner = _unwrapped(type_)
    if isinstance(inner, GraphQLList):
        return f"[{dummy(inner.of_type)}]"
    if isinstance(inner, GraphQLInputObjectType):
        fields = [
            f"{name}: {dummy(field.type)}"
            for name, field in inner.fields.items()
            if required(field)
        ]
        return "{" + ", ".join(fields) + "}"
    if isinstance(inner, GraphQLEnumType):
        return next(iter(inner.values))
    assert is_leaf_type(inner)
    return DUMMIES[inner.name]


def dummy_value(type_: GraphQLInputType) -> Any:
    """The same dummy as a variable's JSON value."""
    inner = _unwrapped(type_)
    if isinstance(inner, GraphQLList):
        return [dummy_value(inner.of_type)]
    if isinstance(inner, GraphQLInputObjectType):
        return {
            name: dummy_value(field.type) for name, field in inner.fields.items() if required(field)
        }
    if isinstance(inner, GraphQLEnumType):
        return next(iter(inner.values))
    return json.loads(DUMMIES[inner.name])


def _with(type_: GraphQLInputType, steps: tuple[str, ...], bad: str) -> str:
    """A literal of the type with `bad` (written GraphQL) at `steps` inside it, the rest dummies."""
    if not steps:
        return bad
    inner = _unwrapped(type_)
    step, rest = steps[0], steps[1:]
    if isinstance(inner, GraphQLList):
        assert step == "[0]"
        return f"[{_with(inner.of_type, rest, bad)}]"
    assert isinstance(inner, GraphQLInputObjectType)
    fields = []
    for name, field in inner.fields.items():
        if name == step:
            fields.append(f"{name}: {_with(field.type, rest, bad)}")
        elif required(field):
            fields.append(f"{name}: {dummy(field.type)}")
    return "{" + ", ".join(fields) + "}"


def value_with(type_: GraphQLInputType, steps: tuple[str, ...], value: Any) -> Any:
    """A JSON value of the type with `value` at `steps` inside it, the rest dummies."""
    if not steps:
        return value
    inner = _unwrapped(type_)
    step, rest = steps[0], steps[1:]
    if isinstance(inner, GraphQLList):
        assert step == "[0]"
        return [value_with(inner.of_type, rest, value)]
    assert isinstance(inner, GraphQLInputObjectType)
    made = dummy_value(inner)
    made[step] = value_with(inner.fields[step].type, rest, value)
    return made


def root_field(position: Position) -> GraphQLField:
    root_type = CORE.get_type(position.root)
    field: GraphQLField = root_type.fields[position.field]  # type: ignore[union-attr]
    return field


def _operation(position: Position, declared: str, arguments: list[str]) -> str:
    field = root_field(position)
    selection = "" if is_leaf_type(get_named_type(field.type)) else " { __typename }"
    operation = "query" if position.root == "Query" else "mutation"
    return f"{operation}{declared} {{ {position.field}({', '.join(arguments)}){selection} }}"


def document(position: Position, bad: str, variable: str | None = None) -> str:
    """The root field called with `bad` (a literal, or `$v`) at the position."""
    arguments = []
    for name, argument in root_field(position).args.items():
        if name == position.steps[0]:
            arguments.append(f"{name}: {_with(argument.type, position.steps[1:], bad)}")
        elif required(argument):
            arguments.append(f"{name}: {dummy(argument.type)}")
    declared = f"($v: {position.type_})" if variable else ""
    return _operation(position, declared, arguments)


def in_argument(position: Position, value: Any) -> dict[str, Any]:
    """A request whose position's argument is the variable `$v`, holding `value` at the position."""
    arguments = []
    held = None
    for name, argument in root_field(position).args.items():
        if name == position.steps[0]:
            arguments.append(f"{name}: $v")
            held = argument
        elif required(argument):
            arguments.append(f"{name}: {dummy(argument.type)}")
    assert held is not None
    query = _operation(position, f"($v: {held.type})", arguments)
    return {"query": query, "variables": {"v": value_with(held.type, position.steps[1:], value)}}


async def answers(both: Both, body: dict[str, Any]) -> dict[str, Any]:
    """The answer to `body`, the same from both routes."""
    bodies = []
    for client in both:  # the fast path on, then Strawberry's view alone
        response = await client.post(
            "/graphql", content=json.dumps(body), headers={"content-type": "application/json"}
        )
        assert response.status_code == 200, response.text
        bodies.append(response.json())
    assert bodies[0] == bodies[1], "the two routes answered differently"
    answer: dict[str, Any] = bodies[0]
    return answer
