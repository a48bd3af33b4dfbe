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

import pytest
from graphql import GraphQLInputType, GraphQLNonNull, GraphQLScalarType, get_named_type

from service.bounds import MAX_ID_LENGTH
from service.errors import shown
from tests.support.input_positions import Both, Position, answers, document, positions
from tests.support.one_definition import ROOT, second_definitions

# The bad texts: (name, as a variable's JSON value, as written in a GraphQL literal).
BAD_TEXTS = [
    ("NUL", "a\x00", '"a\\u0000"'),
    ("lone surrogate", "a\ud800", '"a\\ud800"'),
]


def _text(type_: GraphQLInputType) -> bool:
    inner = type_.of_type if isinstance(type_, GraphQLNonNull) else type_
    return isinstance(inner, GraphQLScalarType) and inner.name in ("String", "ID")


POSITIONS = positions(_text)


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


def test_the_rule_of_text_that_can_be_stored_is_written_once() -> None:
    patterns = {"a NUL test of its own": re.compile(r"""["']\\x00["']\s+(not\s+)?in\b""")}
    home = ROOT / "service/stored_text.py"
    assert second_definitions(home, patterns) == []
