"""A document's cost is measured from its text, each fragment once; its expansion is bounded.

Issue 44: twenty-one fragments, each spreading the next one twice (876
bytes), stopped the service for everyone: Strawberry's depth and alias
limiters walked every spread again, on the event loop, 2^21 times. Generated
here over 10 to 30 levels, through fragment spreads, aliases and inline
fragments, at the root and beneath the fields the fast path compiles
(heartbeat, place, a nodes page, a node), on both routes: every one is
refused before anything runs, naming the bound, in no more than the time
docs/security/limits.md promises another caller.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from graphql import (
    FragmentDefinitionNode,
    OperationDefinitionNode,
    SelectionSetNode,
    get_introspection_query,
    parse,
)

from service.ctl.nodes import NODE as CTL_NODE
from service.ctl.nodes import NODES as CTL_NODES
from service.graphql.document_cost import MAX_ALIASES, MAX_FIELDS, Measure, Measurer
from tests.support.reports import placement

Both = tuple[httpx.AsyncClient, httpx.AsyncClient]
REPO = Path(__file__).resolve().parents[2]
LEVELS = range(10, 31)
# The work of checking one of these documents, in CPU seconds of the process
# (not the wall clock: a loaded machine slows every step alike). Linear in
# the text, it is milliseconds; 2^16 walks of a fragment chain were seconds.
CHECKED_WITHIN = 1.0
# docs/security/limits.md: another caller never waits for a document check to
# finish, and is answered within a second meanwhile (a few milliseconds here,
# on a machine loaded nine times over its cores).
ANSWERED_WITHIN = 1.0
FIELDS_REFUSED = f"more than the maximum of {MAX_FIELDS:,} fields per operation"
ALIASES_REFUSED = f"aliases found. Allowed: {MAX_ALIASES}"


def doubling(levels: int, on: str, body: Callable[[str], str], leaf: str) -> str:
    """Fragments F0..F<levels>, each F<i> putting F<i+1> in its selection twice (via `body`)."""
    fragments = [f"fragment F{i} on {on} {{ {body(f'...F{i + 1}')} }}" for i in range(levels)]
    fragments.append(f"fragment F{levels} on {on} {{ {leaf} }}")
    return " ".join(fragments)


def twice(spread: str) -> str:
    return f"{spread} {spread}"


def inline_twice(spread: str) -> str:
    return f"... on Query {{ {spread} }} ... {{ {spread} }}"


# (name, query of `levels`, variables, what the refusal names)
SHAPES: list[tuple[str, Callable[[int], str], dict[str, Any], str]] = [
    (
        "fragment spreads",
        lambda n: "query { ...F0 } " + doubling(n, "Query", twice, "nodes(first: 1) { id }"),
        {},
        FIELDS_REFUSED,
    ),
    (
        "aliases",
        lambda n: "query { ...F0 } " + doubling(n, "Query", twice, "a: __typename"),
        {},
        ALIASES_REFUSED,
    ),
    (
        "inline fragments",
        lambda n: "query { ...F0 } " + doubling(n, "Query", inline_twice, "__typename"),
        {},
        FIELDS_REFUSED,
    ),
    (
        "beneath heartbeat (a compiled route)",
        lambda n: (
            "mutation($id: ID!) { heartbeat(nodeId: $id) { ...F0 } } "
            + doubling(n, "Node", twice, "id")
        ),
        {"id": "gpu-01"},
        FIELDS_REFUSED,
    ),
    (
        "beneath place (a compiled route)",
        lambda n: (
            "mutation($input: PlaceInput!) { place(input: $input) { ...F0 } } "
            + doubling(n, "PlaceResult", twice, "__typename")
        ),
        placement("r1"),
        FIELDS_REFUSED,
    ),
    (
        "beneath a nodes page (a compiled route)",
        lambda n: "{ nodes(first: 1) { ...F0 } } " + doubling(n, "Node", twice, "id"),
        {},
        FIELDS_REFUSED,
    ),
    (
        "beneath a node (a compiled route)",
        lambda n: "query($id: ID!) { node(id: $id) { ...F0 } } " + doubling(n, "Node", twice, "id"),
        {"id": "gpu-01"},
        FIELDS_REFUSED,
    ),
]


@pytest.mark.parametrize(
    ("shape", "query", "variables", "refused"), SHAPES, ids=[s[0] for s in SHAPES]
)
async def test_a_document_that_doubles_per_level_is_refused_at_once_naming_the_bound(
    both: Both,
    shape: str,
    query: Callable[[int], str],
    variables: dict[str, Any],
    refused: str,
) -> None:
    for levels in LEVELS:
        answers = []
        for client in both:  # the fast path on, then Strawberry's view alone
            began = time.process_time()
            response = await client.post(
                "/graphql", json={"query": query(levels), "variables": variables}
            )
            took = time.process_time() - began
            assert took <= CHECKED_WITHIN, f"{shape}, {levels} levels: {took:.2f} s of CPU"
            assert response.status_code == 200
            answers.append(response.json())
        assert answers[0] == answers[1], f"{shape}, {levels} levels: the routes differ"
        body = answers[0]
        assert body["data"] is None, body
        messages = [error["message"] for error in body["errors"]]
        assert any(refused in message for message in messages), messages
        assert {e["extensions"]["code"] for e in body["errors"]} == {"GRAPHQL_VALIDATION_FAILED"}


class CountingMeasurer(Measurer):
    def __init__(self, fragments: dict[str, FragmentDefinitionNode]) -> None:
        super().__init__(fragments)
        self.combined = 0

    def _combine(self, selection_set: SelectionSetNode) -> Measure:
        self.combined += 1
        return super()._combine(selection_set)


def measured(text: str) -> tuple[list[Measure], int]:
    """Each operation's measure, and how many selection sets the measurer combined."""
    document = parse(text)
    fragments = {
        d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)
    }
    measurer = CountingMeasurer(fragments)
    measures = [
        measurer.measure(d.selection_set)
        for d in document.definitions
        if isinstance(d, OperationDefinitionNode)
    ]
    return measures, measurer.combined


@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_each_selection_set_is_measured_once_however_often_it_is_spread(
    shape: tuple[str, Callable[[int], str], dict[str, Any], str],
) -> None:
    _, query, _, _ = shape
    for levels in LEVELS:
        text = query(levels)
        selection_sets = text.count("{")  # every `{` opens one selection set here
        [measure], combined = measured(text)
        assert combined == selection_sets, (levels, combined, selection_sets)
        assert measure.fields >= 2**levels  # the expansion itself is counted whole


def test_a_fragment_cycle_or_an_unknown_fragment_counts_nothing_and_ends() -> None:
    [measure], _ = measured(
        "{ ...A ...Missing } fragment A on Query { __typename ...B } "
        "fragment B on Query { ...A nodes { id } }"
    )
    assert measure == Measure(depth=1, aliases=0, fields=3)


def test_a_chain_of_thousands_of_fragments_is_measured_without_recursion() -> None:
    levels = 3000
    text = "{ ...F0 } " + " ".join(
        f"fragment F{i} on Query {{ ...F{i + 1} }}" for i in range(levels)
    )
    [measure], combined = measured(text + f" fragment F{levels} on Query {{ __typename }}")
    assert measure.fields == 1 and combined == levels + 2


async def test_depth_is_measured_through_fragments(both: Both) -> None:
    # The schema nests only a few levels deep: a deeper document names
    # fields that do not exist, and its depth is refused first, by itself.
    deep = (
        "query Deep { ...D0 } "
        + " ".join(f"fragment D{i} on Query {{ f {{ ...D{i + 1} }} }}" for i in range(13))
        + " fragment D13 on Query { g }"
    )
    for client in both:
        body = (await client.post("/graphql", json={"query": deep})).json()
        assert [e["message"] for e in body["errors"]] == [
            "'Deep' is 13 fields deep, more than the maximum operation depth of 12"
        ]


def _dashboard_queries() -> list[str]:
    script = (REPO / "service/static/dashboard.js").read_text()
    return [q for _, q in re.findall(r"const (\w+_QUERY) = `([^`]*)`", script)]


def _client_documents() -> list[str]:
    operations = REPO / "clients/python/operations"
    fragments = (operations / "fragments.graphql").read_text()
    documents = [
        path.read_text() + "\n" + fragments
        for path in sorted(operations.glob("*.graphql"))
        if path.name != "fragments.graphql"
    ]
    agent = REPO / "agent/operations"
    return documents + [path.read_text() for path in sorted(agent.glob("*.graphql"))]


def test_every_document_our_clients_send_is_well_within_the_bounds() -> None:
    introspection = get_introspection_query(
        descriptions=True,
        specified_by_url=True,
        directive_is_repeatable=True,
        schema_description=True,
        input_value_deprecation=True,
    )
    documents = [introspection, CTL_NODE, CTL_NODES, *_dashboard_queries(), *_client_documents()]
    assert len(documents) > 20
    for text in documents:
        measures, _ = measured(text)
        for measure in measures:
            # A quarter of each bound at most: room for clients to grow.
            assert measure.fields <= MAX_FIELDS // 4, (text[:60], measure)
            assert measure.aliases <= MAX_ALIASES // 4, (text[:60], measure)


def long_refused_document(serial: int) -> str:
    """A document whose check is long work (a long comment to read, then a fragment chain to
    measure), refused for its fields once spread."""
    return (
        f"query Long{serial} {{ ...F0 }} "
        + doubling(16, "Query", twice, "nodes(first: 1) { id }")
        + " # "
        + "x" * 600_000
    )


async def test_another_caller_is_answered_while_long_documents_are_checked(both: Both) -> None:
    """Three long documents are being checked; `{ __typename }`, sent after them, is answered
    before any of them, within the bound, and they are refused."""
    loop = asyncio.get_running_loop()
    for route, client in enumerate(both):
        finished: list[float] = []

        async def send_long(
            text: str, client: httpx.AsyncClient = client, finished: list[float] = finished
        ) -> dict[str, Any]:
            response = await client.post("/graphql", json={"query": text})
            finished.append(loop.time())
            body: dict[str, Any] = response.json()
            return body

        long_ones = [
            asyncio.create_task(send_long(long_refused_document(10 * route + serial)))
            for serial in range(3)
        ]
        await asyncio.sleep(0.05)  # they are being read and checked
        sent = loop.time()
        answer = await client.post("/graphql", json={"query": "{ __typename }"})
        answered = loop.time()
        refused = await asyncio.gather(*long_ones)

        assert answer.json() == {"data": {"__typename": "Query"}}
        assert answered - sent <= ANSWERED_WITHIN
        assert answered < min(finished), "the other caller waited for the long documents"
        for body in refused:
            assert FIELDS_REFUSED in body["errors"][0]["message"], body
