"""GraphQL over HTTP as its spec says, and every malformed request answered as the client's mistake.

Each test runs against both execution routes (the direct executor and
Strawberry's view alone): a client must get the same answer whichever runs its
operation.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.web.app import create_app

GRAPHQL_RESPONSE = "application/graphql-response+json"


@pytest.fixture(params=["direct", "strawberry"])
async def route(
    request: pytest.FixtureRequest, engine: AsyncEngine, settings: Settings
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.replace(fast_path=request.param == "direct"), engine=engine)
    # An exception escaping the app is a 500 here, as a server would answer it.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
        yield client


def post(client: httpx.AsyncClient, body: Any, **headers: str) -> Any:
    return client.post("/graphql", json=body, headers=headers)


def only_error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert "data" not in body, body
    assert len(body["errors"]) == 1, body
    error: dict[str, Any] = body["errors"][0]
    return error


# --- 1. Media types ----------------------------------------------------------------------


async def test_graphql_response_json_is_answered_in_that_media_type(
    route: httpx.AsyncClient,
) -> None:
    response = await post(route, {"query": "{ __typename }"}, accept=GRAPHQL_RESPONSE)
    assert response.status_code == 200
    assert response.headers["content-type"] == f"{GRAPHQL_RESPONSE}; charset=utf-8"
    assert response.json() == {"data": {"__typename": "Query"}}


@pytest.mark.parametrize("accept", [None, "application/json", "*/*"])
async def test_application_json_and_no_preference_keep_application_json(
    route: httpx.AsyncClient, accept: str | None
) -> None:
    headers = {} if accept is None else {"accept": accept}
    response = await post(route, {"query": "{ __typename }"}, **headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")


PRE_EXECUTION_FAILURES = [
    ("parse", {"query": "{"}, "GRAPHQL_PARSE_FAILED"),
    ("validation", {"query": "{ noSuchField }"}, "GRAPHQL_VALIDATION_FAILED"),
    (
        "variables",
        {"query": "query($n: Int) { events(first: $n) { id } }", "variables": {"n": "ten"}},
        "BAD_INPUT",
    ),
    (
        "unknown operation",
        {"query": "query A { __typename }", "operationName": "B"},
        "BAD_REQUEST",
    ),
]


@pytest.mark.parametrize(("case", "body", "code"), PRE_EXECUTION_FAILURES)
async def test_a_failure_before_execution_is_a_400_without_data_in_the_new_media_type(
    route: httpx.AsyncClient, case: str, body: dict[str, Any], code: str
) -> None:
    response = await post(route, body, accept=GRAPHQL_RESPONSE)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith(GRAPHQL_RESPONSE)
    assert only_error(response)["extensions"]["code"] == code


@pytest.mark.parametrize(("case", "body", "code"), PRE_EXECUTION_FAILURES)
async def test_with_application_json_the_same_failures_keep_their_200_or_400(
    route: httpx.AsyncClient, case: str, body: dict[str, Any], code: str
) -> None:
    response = await post(route, body, accept="application/json")
    assert response.headers["content-type"].startswith("application/json")
    answer = response.json()
    assert answer["errors"][0]["extensions"]["code"] == code
    if case == "unknown operation":  # a 400 before this change too (then in plain text)
        assert response.status_code == 400
    else:
        assert response.status_code == 200
        assert answer["data"] is None


async def test_an_error_during_execution_stays_a_200_with_data_in_the_new_media_type(
    route: httpx.AsyncClient,
) -> None:
    response = await post(
        route, {"query": '{ events(after: "not-an-id") { id } }'}, accept=GRAPHQL_RESPONSE
    )
    assert response.status_code == 200
    answer = response.json()
    assert answer["data"] is None
    assert answer["errors"][0]["path"] == ["events"]
    assert answer["errors"][0]["extensions"]["code"] == "BAD_INPUT"


async def test_a_client_that_accepts_nothing_we_serve_gets_406(route: httpx.AsyncClient) -> None:
    response = await post(route, {"query": "{ __typename }"}, accept="text/csv")
    assert response.status_code == 406
    assert only_error(response)["extensions"]["code"] == "NOT_ACCEPTABLE"


async def test_the_graphiql_page_is_still_served_to_a_browser(route: httpx.AsyncClient) -> None:
    response = await route.get("/graphql", headers={"accept": "text/html"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")


# --- 2. Malformed requests ---------------------------------------------------------------

# (what was sent, content type, status, a phrase of the message)
MALFORMED: list[tuple[str, bytes, str | None, int, str]] = [
    ("a JSON string", b'"{ __typename }"', "application/json", 400, "got a JSON string"),
    ("a JSON number", b"42", "application/json", 400, "got a JSON number"),
    ("JSON null", b"null", "application/json", 400, "got a JSON null"),
    ("a JSON array", b'[{"query": "{ __typename }"}]', "application/json", 400, "batching"),
    ("no query", b'{"variables": {}}', "application/json", 400, "no `query`"),
    ("a numeric query", b'{"query": 7}', "application/json", 400, "`query` must be a string"),
    (
        "variables as a string",
        b'{"query": "{ __typename }", "variables": "{}"}',
        "application/json",
        400,
        "`variables` must be a JSON object",
    ),
    (
        "variables as an array",
        b'{"query": "{ __typename }", "variables": [1]}',
        "application/json",
        400,
        "`variables` must be a JSON object",
    ),
    (
        "a numeric operationName",
        b'{"query": "{ __typename }", "operationName": 3}',
        "application/json",
        400,
        "`operationName` must be a string",
    ),
    (
        "extensions as a string",
        b'{"query": "{ __typename }", "extensions": "x"}',
        "application/json",
        400,
        "`extensions` must be a JSON object",
    ),
    ("text/plain", b'{"query": "{ __typename }"}', "text/plain", 415, "Content-Type"),
    ("no content type", b'{"query": "{ __typename }"}', None, 415, "Content-Type"),
    (
        "a latin-1 charset",
        b'{"query": "{ __typename }"}',
        "application/json; charset=latin-1",
        415,
        "UTF-8",
    ),
    ("invalid UTF-8", b'{"query": "{ __typename \xff }"}', "application/json", 400, "not UTF-8"),
    ("a UTF-16 byte order mark", b"\xff\xfe{\x00}\x00", "application/json", 400, "not UTF-8"),
    ("broken JSON", b'{ "not a JSON', "application/json", 400, "not JSON"),
    ("an empty body", b"", "application/json", 400, "empty"),
]


@pytest.mark.parametrize(
    ("case", "body", "content_type", "status", "phrase"), MALFORMED, ids=[m[0] for m in MALFORMED]
)
async def test_a_malformed_request_is_a_4xx_graphql_error_saying_what_was_wrong(
    route: httpx.AsyncClient,
    case: str,
    body: bytes,
    content_type: str | None,
    status: int,
    phrase: str,
) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    response = await route.post("/graphql", content=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = only_error(response)
    assert phrase in error["message"]
    expected = "UNSUPPORTED_MEDIA_TYPE" if status == 415 else "BAD_REQUEST"
    assert error["extensions"]["code"] == expected


async def test_a_get_with_variables_that_are_not_a_json_object_is_a_400(
    route: httpx.AsyncClient,
) -> None:
    for variables, phrase in (("{nope", "not JSON"), ("[1]", "JSON object")):
        response = await route.get(
            "/graphql", params={"query": "{ __typename }", "variables": variables}
        )
        assert response.status_code == 400
        error = only_error(response)
        assert phrase in error["message"]
        assert error["extensions"]["code"] == "BAD_REQUEST"


async def test_a_subscription_posted_without_a_stream_is_a_400_saying_so(
    route: httpx.AsyncClient,
) -> None:
    for accept in ("application/json", GRAPHQL_RESPONSE):
        response = await post(route, {"query": "subscription { events { kind } }"}, accept=accept)
        assert response.status_code == 400, response.text
        error = only_error(response)
        assert "needs a stream" in error["message"]
        assert error["extensions"]["code"] == "BAD_REQUEST"


async def test_a_mutation_sent_with_get_is_a_405_graphql_error(route: httpx.AsyncClient) -> None:
    response = await route.get(
        "/graphql",
        params={"query": 'mutation { cordonNode(id: "x", reason: "y") { id } }'},
        headers={"accept": GRAPHQL_RESPONSE},
    )
    assert response.status_code == 405
    assert response.headers["content-type"].startswith(GRAPHQL_RESPONSE)
    assert only_error(response)["extensions"]["code"] == "METHOD_NOT_ALLOWED"


# --- 1,000 mixed bad requests ------------------------------------------------------------

# Operations that fail whatever route runs them: parse, validation, variables, arguments.
BAD_OPERATIONS: list[dict[str, Any]] = [
    {"query": "{"},
    {"query": "{ noSuchField }"},
    {"query": "query($n: Int) { events(first: $n) { id } }", "variables": {"n": 2**40}},
    {"query": "query($n: Int) { events(first: $n) { id } }", "variables": {"n": "ten"}},
    {"query": "{ events(first: 99999999999) { id } }"},
    {
        "query": "query($b: Bytes) { nodes(filter: {minLocalDiskFree: $b}) { id } }",
        "variables": {"b": -1},
    },
    {"query": "query($d: DateTime) { events(since: $d) { id } }", "variables": {"d": "yesterday"}},
    {"query": '{ events(since: "tomorrow-ish") { id } }'},
    {"query": '{ events(kinds: ["cordonned"]) { id } }'},
    {"query": '{ events(after: "x") { id } }'},
    {"query": 'mutation { cordonNode(id: "nowhere", reason: "r") { id } }'},
    {"query": "query A { nodes { id } }", "operationName": "Missing"},
    {"query": "query($i: NodeInput!) { __typename }", "variables": {}},
]


def bad_request(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """(method, httpx.request keyword arguments) of one bad request."""
    pick = rng.randrange(5)
    if pick == 0:
        case = rng.choice(MALFORMED)
        headers = {} if case[2] is None else {"content-type": case[2]}
        return "POST", {"content": case[1], "headers": headers}
    if pick == 1:
        body = rng.choice([b"", b"\x00", b"\xc3\x28", b"{}" * 3, b"[]", b"true", b"{]"])
        return "POST", {"content": body, "headers": {"content-type": "application/json"}}
    operation = rng.choice(BAD_OPERATIONS)
    accept = rng.choice(["application/json", GRAPHQL_RESPONSE, "*/*"])
    if pick == 2:
        params = {k: json.dumps(v) if k == "variables" else v for k, v in operation.items()}
        return "GET", {"params": params, "headers": {"accept": accept}}
    return "POST", {"json": operation, "headers": {"accept": accept}}


async def test_a_thousand_mixed_bad_requests_get_4xx_or_coded_errors_and_no_traceback(
    route: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(17)
    caplog.set_level(logging.DEBUG)
    statuses: dict[int, int] = {}
    for _ in range(500):  # 500 per route, 1,000 in all
        method, arguments = bad_request(rng)
        response = await route.request(method, "/graphql", **arguments)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (method, arguments, response.text)
        answer = response.json()
        assert answer["errors"], (method, arguments, answer)
        for error in answer["errors"]:
            assert error["extensions"]["code"], (method, arguments, answer)
            assert error["message"] != "internal error", (method, arguments, answer)
    assert set(statuses) <= {200, 400, 405, 415}, statuses
    tracebacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not tracebacks, [r.getMessage() for r in tracebacks[:3]]
    assert not [r for r in caplog.records if r.levelno > logging.INFO], [
        r.getMessage() for r in caplog.records if r.levelno > logging.INFO
    ][:3]
