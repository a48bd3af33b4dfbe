"""Every String and ID a request passes in is held to one rule: text that can be stored.

Issue 44: a lone surrogate in a string variable was an INTERNAL_ERROR (49
argument positions across 26 mutations), a NUL a BAD_INPUT that named no
field, and `freeHeldShards` stored both in its reason. The positions are
walked here from the schema itself, every query and mutation and every
String or ID argument and input field inside them (in lists, in inputs in
inputs), so a field added tomorrow is covered without editing this test.
Each gets a NUL and a lone surrogate, as a literal and in a variable, on
both routes: BAD_INPUT naming the argument path, the value shown escaped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from graphql import (
    GraphQLArgument,
    GraphQLEnumType,
    GraphQLField,
    GraphQLInputField,
    GraphQLInputObjectType,
    GraphQLInputType,
    GraphQLList,
    GraphQLNonNull,
    GraphQLScalarType,
    get_named_type,
    is_leaf_type,
)
from graphql.pyutils import Undefined

from service.bounds import MAX_ID_LENGTH
from service.errors import shown
from service.graphql.schema import schema
from tests.support.one_definition import ROOT, second_definitions

Both = tuple[httpx.AsyncClient, httpx.AsyncClient]
CORE = schema._schema

# A value of each scalar a required argument or input field may need.
DUMMIES = {
    "String": '"x"',
    "ID": '"x"',
    "Int": "1",
    "Float": "1.0",
    "Boolean": "false",
    "Bytes": "1",
    "DateTime": '"2024-01-01T00:00:00+00:00"',
}

# The bad texts: (name, as a variable's JSON value, as written in a GraphQL literal).
BAD_TEXTS = [
    ("NUL", "a\x00", '"a\\u0000"'),
    ("lone surrogate", "a\ud800", '"a\\ud800"'),
]


@dataclass(frozen=True)
class Position:
    """One String or ID argument or input field of a root field, and how to reach it."""

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


def _positions_in(
    type_: GraphQLInputType, steps: tuple[str, ...], seen: frozenset[str]
) -> Iterator[tuple[tuple[str, ...], GraphQLInputType]]:
    inner = type_.of_type if isinstance(type_, GraphQLNonNull) else type_
    if isinstance(inner, GraphQLList):
        yield from _positions_in(inner.of_type, (*steps, "[0]"), seen)
        return
    if isinstance(inner, GraphQLInputObjectType):
        if inner.name in seen:
            return
        for name, field in inner.fields.items():
            yield from _positions_in(field.type, (*steps, name), seen | {inner.name})
        return
    if isinstance(inner, GraphQLScalarType) and inner.name in ("String", "ID"):
        yield steps, type_


def positions() -> list[Position]:
    found = []
    for root in ("Query", "Mutation"):
        root_type = CORE.get_type(root)
        assert root_type is not None
        for name, field in root_type.fields.items():  # type: ignore[attr-defined]
            for argument_name, argument in field.args.items():
                for steps, type_ in _positions_in(argument.type, (argument_name,), frozenset()):
                    found.append(Position(root, name, steps, type_))
    return found


POSITIONS = positions()


def _required(holder: GraphQLArgument | GraphQLInputField) -> bool:
    return isinstance(holder.type, GraphQLNonNull) and holder.default_value is Undefined


def _dummy(type_: GraphQLInputType) -> str:
    """A valid literal of the type: its required fields only, lists of one."""
    inner = type_.of_type if isinstance(type_, GraphQLNonNull) else type_
    if isinstance(inner, GraphQLList):
        return f"[{_dummy(inner.of_type)}]"
    if isinstance(inner, GraphQLInputObjectType):
        fields = [
            f"{name}: {_dummy(field.type)}"
            for name, field in inner.fields.items()
            if _required(field)
        ]
        return "{" + ", ".join(fields) + "}"
    if isinstance(inner, GraphQLEnumType):
        return next(iter(inner.values))
    assert is_leaf_type(inner)
    return DUMMIES[inner.name]


def _with(type_: GraphQLInputType, steps: tuple[str, ...], bad: str) -> str:
    """A literal of the type with `bad` (written GraphQL) at `steps` inside it, the rest dummies."""
    if not steps:
        return bad
    inner = type_.of_type if isinstance(type_, GraphQLNonNull) else type_
    step, rest = steps[0], steps[1:]
    if isinstance(inner, GraphQLList):
        assert step == "[0]"
        return f"[{_with(inner.of_type, rest, bad)}]"
    assert isinstance(inner, GraphQLInputObjectType)
    fields = []
    for name, field in inner.fields.items():
        if name == step:
            fields.append(f"{name}: {_with(field.type, rest, bad)}")
        elif _required(field):
            fields.append(f"{name}: {_dummy(field.type)}")
    return "{" + ", ".join(fields) + "}"


def document(position: Position, bad: str, variable: str | None = None) -> str:
    """The root field called with `bad` (a literal, or `$v`) at the position."""
    root_type = CORE.get_type(position.root)
    field: GraphQLField = root_type.fields[position.field]  # type: ignore[union-attr]
    arguments = []
    for name, argument in field.args.items():
        if name == position.steps[0]:
            arguments.append(f"{name}: {_with(argument.type, position.steps[1:], bad)}")
        elif _required(argument):
            arguments.append(f"{name}: {_dummy(argument.type)}")
    selection = "" if is_leaf_type(get_named_type(field.type)) else " { __typename }"
    operation = "query" if position.root == "Query" else "mutation"
    declared = f"($v: {position.type_})" if variable else ""
    return f"{operation}{declared} {{ {position.field}({', '.join(arguments)}){selection} }}"


async def answers(both: Both, body: dict[str, Any]) -> dict[str, Any]:
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


def test_the_walk_finds_the_positions_the_issue_names() -> None:
    found = {str(p) for p in POSITIONS}
    assert {"cordonNode.reason", "cordonNode.id", "freeHeldShards.reason", "heartbeat.nodeId",
            "registerNode.input.id", "registerNode.input.gpus[0].uuid", "node.id",
            "place.input.replicaId"} <= found  # fmt: skip
    assert len({p.field for p in POSITIONS if p.root == "Mutation"}) >= 26


@pytest.mark.parametrize("position", POSITIONS, ids=str)
async def test_a_nul_or_a_lone_surrogate_is_bad_input_naming_the_field(
    both: Both, position: Position
) -> None:
    for name, value, written in BAD_TEXTS:
        by_literal = {"query": document(position, written)}
        by_variable = {"query": document(position, "$v", "v"), "variables": {"v": value}}
        for how, body in (("literal", by_literal), ("variable", by_variable)):
            answer = await answers(both, body)
            assert answer.get("data") is None, (name, how, answer)
            [error] = answer["errors"]
            assert error["extensions"] == {
                "code": "BAD_INPUT",
                "field": position.path,
                "value": shown(value),
            }, (name, how, body["query"])
            assert error["message"].startswith(f"{position.path}='{shown(value)}': contains a")


@pytest.mark.parametrize(
    "position", [p for p in POSITIONS if get_named_type(p.type_).name == "ID"], ids=str
)
async def test_an_id_longer_than_the_bound_is_refused_naming_the_bound(
    both: Both, position: Position
) -> None:
    long_id = "x" * 1_000_000
    answer = await answers(
        both, {"query": document(position, "$v", "v"), "variables": {"v": long_id}}
    )
    [error] = answer["errors"]
    assert error["extensions"] == {"code": "BAD_INPUT", "field": position.path,
                                   "value": shown(long_id)}  # fmt: skip
    assert f"an id is at most {MAX_ID_LENGTH} characters (MAX_ID_LENGTH)" in error["message"]
    # Never more than a short prefix of the value, anywhere in the answer.
    assert len(json.dumps(answer)) < 1_000


async def test_an_id_at_the_bound_is_taken(both: Both) -> None:
    for client in both:
        response = await client.post(
            "/graphql",
            json={"query": "query($id: ID!) { node(id: $id) { id } }",
                  "variables": {"id": "x" * MAX_ID_LENGTH}},
        )  # fmt: skip
        assert response.json() == {"data": {"node": None}}


# Lines in modules other engineers changed in parallel during issue 44 (remediations in
# service/fleet/health/, the group planner in service/scheduling/groups/): each is to call
# service/stored_text.py once their branches are merged, and leave this list.
NOT_YET_MOVED = {
    ("service/scheduling/groups/requests.py", '"\\x00" in group_id'): "issue 44 items 6-7",
    ("service/scheduling/groups/requests.py", '"\\x00" in name'): "issue 44 items 6-7",
    ("service/scheduling/groups/requests.py", '"\\x00" in locality.label'): "issue 44 items 6-7",
    ("service/fleet/health/validations.py", '"\\x00" in result.test'): "issue 44 item 5",
    ("service/fleet/health/validations.py", '"\\x00" in result.details'): "issue 44 item 5",
    ("service/fleet/health/drift.py", '"\\x00" in value'): "issue 44 item 5",
}


def test_the_rule_of_text_that_can_be_stored_is_written_once() -> None:
    patterns = {"a NUL test of its own": re.compile(r"""["']\\x00["']\s+(not\s+)?in\b""")}
    home = ROOT / "service/stored_text.py"
    assert second_definitions(home, patterns, excused=NOT_YET_MOVED) == []
