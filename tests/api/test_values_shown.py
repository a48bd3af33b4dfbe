"""A bad value is repeated as a short, escaped prefix, never whole, whatever refuses it.

Issue 44: an id of 1 MB was echoed back in full in not-found messages
(cordonNode, drainNode, uncordonNode, revokeToken) and accepted as a lookup
key elsewhere. Every id is bounded now (tests/api/test_text_inputs.py); here,
a megabyte sent to each kind of refusal comes back as at most a short prefix
(service/errors.py, shown), on both routes.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from service.bounds import MAX_ID_LENGTH
from service.errors import SHOWN_CHARACTERS, shown
from service.graphql.request_errors import MAX_MESSAGE_CHARACTERS

Both = tuple[httpx.AsyncClient, httpx.AsyncClient]
MEGABYTE = "x" * 1_000_000
# An answer with one short error: its message, a short value, a location or two.
SHORT_ANSWER = 2 * MAX_MESSAGE_CHARACTERS + 500

# (case, query, variables): each refused, with the megabyte in it somewhere.
REFUSED: list[tuple[str, str, dict[str, Any]]] = [
    ("an ID argument", "mutation($id: ID!) { cordonNode(id: $id, reason: \"r\") { id } }",
     {"id": MEGABYTE}),
    ("a literal where an Int goes", f'{{ events(first: "{MEGABYTE}") {{ id }} }}', {}),
    ("a variable where an Int goes", "query($n: Int) { events(first: $n) { id } }",
     {"n": MEGABYTE}),
    ("an enum value", "query($s: RemediationState) { remediations(state: $s) { id } }",
     {"s": MEGABYTE}),
    ("an unknown input field", "query($f: NodeFilter) { nodes(filter: $f) { id } }",
     {"f": {MEGABYTE: 1}}),
    ("a String too long for the domain", "mutation($r: String!) "
     '{ cordonGpu(nodeId: "gpu-07", index: 0, reason: $r) { index } }', {"r": MEGABYTE}),
    ("an event cursor", "query($a: ID) { events(after: $a) { id } }", {"a": "y" * 200}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "query", "variables"), REFUSED, ids=[r[0] for r in REFUSED])
async def test_a_megabyte_sent_comes_back_as_a_short_prefix(
    both: Both, case: str, query: str, variables: dict[str, Any]
) -> None:
    bodies = []
    for client in both:
        response = await client.post("/graphql", json={"query": query, "variables": variables})
        assert len(response.content) < SHORT_ANSWER, response.text[:300]
        bodies.append(response.json())
    assert bodies[0] == bodies[1]
    assert bodies[0]["errors"], bodies[0]


@pytest.mark.parametrize("mutation", ["cordonNode", "drainNode", "uncordonNode", "revokeToken"])
async def test_not_found_repeats_a_short_prefix_of_the_id(both: Both, mutation: str) -> None:
    """The longest id there may be, not registered: named by its prefix only."""
    longest = "n" * MAX_ID_LENGTH
    reason = ', reason: "r"' if mutation in ("cordonNode", "drainNode") else ""
    query = f'mutation {{ {mutation}(id: "{longest}"{reason}) {{ __typename }} }}'
    for client in both:
        body = (await client.post("/graphql", json={"query": query})).json()
        [error] = body["errors"]
        assert shown(longest) in error["message"]
        assert longest not in json.dumps(body)


def test_shown_is_a_short_escaped_prefix() -> None:
    assert shown("gpu-07") == "gpu-07"
    assert shown("a\x00b\ud800\n") == "a\\x00b\\ud800\\n"
    cut = shown(MEGABYTE)
    assert cut.startswith("x" * (SHOWN_CHARACTERS - 3)) and cut.endswith(
        "... (1,000,000 characters)"
    )
    assert len(cut) < SHOWN_CHARACTERS + 30
