"""WebSocket messages of the wrong shape, and subscriptions with a bad filter, on a live service.

A malformed subscribe with a usable id gets that operation's `error` message
(GraphQL-shaped, with a code) and the connection stays usable; any other
malformed message closes the socket with 4400 and says why. The same holds for
the legacy `graphql-ws` protocol (its `start` for `subscribe`; a
`connection_error` with the reason before the close). Never a crash, never a
traceback in the service's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from service.bounds import MAX_EVENT_KINDS
from tests.support import REPO
from tests.support.live_service import free_port

pytestmark = pytest.mark.process

PROTOCOL = "graphql-transport-ws"
LEGACY = "graphql-ws"


@dataclass
class LoggedService:
    url: str
    log: Path

    def log_lines(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture(scope="module")
def service(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedService]:
    """One `serve` process for the module (each start costs seconds), its log in a file."""
    port = free_port()
    log = tmp_path_factory.mktemp("ws") / "service.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
            env={**os.environ, "DATABASE_URL": database_url},
            cwd=REPO,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 60  # a loaded CI machine
        while True:
            assert process.poll() is None, log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.1)
        yield LoggedService(f"http://127.0.0.1:{port}/graphql", log)
    finally:
        process.terminate()
        process.wait(timeout=20)


async def connect(service: LoggedService, protocol: str = PROTOCOL) -> Any:
    socket = await websockets.connect(
        service.url.replace("http://", "ws://", 1),
        subprotocols=[protocol],  # type: ignore[list-item]
    )
    await socket.send(json.dumps({"type": "connection_init", "payload": {}}))
    ack = await receive(socket)
    assert ack["type"] == "connection_ack", ack
    return socket


async def receive(socket: Any) -> Any:
    """The next message; a socket that answers nothing fails the test instead of hanging it."""
    async with asyncio.timeout(10):
        return json.loads(await socket.recv())


async def closed_with(socket: Any) -> tuple[int, str]:
    with pytest.raises(websockets.ConnectionClosed) as closed:
        async with asyncio.timeout(10):
            while True:
                await socket.recv()
    frame = closed.value.rcvd
    assert frame is not None
    return frame.code, frame.reason


async def test_a_subscription_filtering_on_more_kinds_than_its_bound_is_refused_before_it_runs(
    service: LoggedService,
) -> None:
    over = MAX_EVENT_KINDS + 1
    variable = {
        "query": "subscription($k: [String!]) { events(kinds: $k) { id } }",
        "variables": {"k": ["cordoned"] * over},
    }
    written = ", ".join(['"cordoned"'] * over)
    literal = {"query": f"subscription {{ events(kinds: [{written}]) {{ id }} }}"}
    socket = await connect(service)
    try:
        for n, payload in enumerate((variable, literal)):
            await socket.send(json.dumps({"type": "subscribe", "id": f"b{n}", "payload": payload}))
            answer = await receive(socket)
            assert answer["type"] == "error", answer
            [error] = answer["payload"]
            assert error["extensions"] == {"code": "BAD_INPUT", "field": "kinds",
                                           "value": f"{over} entries", "length": over,
                                           "bound": MAX_EVENT_KINDS}  # fmt: skip
            assert "path" not in error, "refused before the subscription ran"
    finally:
        await socket.close()


@pytest.mark.parametrize(
    ("message", "phrase"),
    [
        ([1, 2], "must be a JSON object"),
        ("subscribe", "must be a JSON object"),
        (None, "must be a JSON object"),
        ({"id": "1"}, "unknown message type"),
        ({"type": "subscribe", "id": 5, "payload": {"query": "{ __typename }"}}, "`id`"),
        ({"type": "subscribe", "id": ["1"], "payload": {"query": "{ __typename }"}}, "`id`"),
        ({"type": "complete", "id": {"a": 1}}, "`id`"),
        ({"type": "ping", "payload": "x"}, "ping payload"),
    ],
)
async def test_a_message_of_the_wrong_shape_closes_the_socket_with_4400_and_a_reason(
    service: LoggedService, message: Any, phrase: str
) -> None:
    socket = await connect(service)
    await socket.send(json.dumps(message))
    code, reason = await closed_with(socket)
    assert code == 4400
    assert reason.startswith("BAD_REQUEST: ") and phrase in reason, reason


@pytest.mark.parametrize(
    ("payload", "phrase"),
    [
        ("{ __typename }", "`payload` must be an object"),
        ({}, "no `query`"),
        ({"query": 5}, "`query` must be a string"),
        ({"query": "subscription { events { id } }", "variables": "x"}, "`variables`"),
        ({"query": "subscription { events { id } }", "operationName": 1}, "`operationName`"),
    ],
)
async def test_a_malformed_subscribe_gets_a_coded_error_and_the_connection_stays_open(
    service: LoggedService, payload: Any, phrase: str
) -> None:
    socket = await connect(service)
    try:
        await socket.send(json.dumps({"type": "subscribe", "id": "a", "payload": payload}))
        answer = await receive(socket)
        assert answer["type"] == "error" and answer["id"] == "a", answer
        [error] = answer["payload"]
        assert error["extensions"]["code"] == "BAD_REQUEST"
        assert phrase in error["message"]
        await socket.send(json.dumps({"type": "ping"}))
        assert (await receive(socket))["type"] == "pong"
    finally:
        await socket.close()


async def test_a_subscription_to_an_unknown_event_kind_is_bad_input_naming_the_known_ones(
    service: LoggedService,
) -> None:
    socket = await connect(service)
    try:
        query = 'subscription { events(kinds: ["cordoned", "cordonned"]) { id } }'
        await socket.send(json.dumps({"type": "subscribe", "id": "k", "payload": {"query": query}}))
        answer = await receive(socket)
        assert answer["type"] == "error", answer
        [error] = answer["payload"]
        assert error["extensions"]["code"] == "BAD_INPUT"
        assert error["extensions"]["field"] == "kinds"
        assert error["extensions"]["value"] == "cordonned"
        assert "cordoned" in error["message"] and "registered" in error["message"]
        assert error["path"] == ["events"]
    finally:
        await socket.close()


@pytest.mark.parametrize(
    ("message", "phrase"),
    [
        ([1, 2], "must be a JSON object"),
        ("start", "must be a JSON object"),
        ({"id": "1"}, "unknown message type"),
        ({"type": "subscribe", "id": "1", "payload": {"query": "{ __typename }"}}, "unknown"),
        ({"type": "start", "id": 5, "payload": {"query": "{ __typename }"}}, "`id`"),
        ({"type": "stop", "id": {"a": 1}}, "`id`"),
        ({"type": "connection_init", "payload": "x"}, "connection_init payload"),
    ],
)
async def test_a_legacy_graphql_ws_message_of_the_wrong_shape_gets_a_connection_error_and_4400(
    service: LoggedService, message: Any, phrase: str
) -> None:
    socket = await connect(service, LEGACY)
    await socket.send(json.dumps(message))
    answer = await receive(socket)
    assert answer["type"] == "connection_error", answer
    assert answer["payload"]["extensions"]["code"] == "BAD_REQUEST"
    assert phrase in answer["payload"]["message"], answer
    code, reason = await closed_with(socket)
    assert code == 4400
    assert reason.startswith("BAD_REQUEST: ") and phrase in reason, reason


async def test_a_malformed_legacy_start_gets_its_error_and_the_connection_still_subscribes(
    service: LoggedService,
) -> None:
    socket = await connect(service, LEGACY)
    try:
        await socket.send(json.dumps({"type": "start", "id": "a", "payload": {"query": 5}}))
        answer = await receive(socket)
        assert answer["type"] == "error" and answer["id"] == "a", answer
        assert answer["payload"]["extensions"]["code"] == "BAD_REQUEST"
        assert "`query` must be a string" in answer["payload"]["message"]
        # The same connection still runs a well-formed subscription.
        query = 'subscription { events(kinds: ["cordonned"]) { id } }'
        await socket.send(json.dumps({"type": "start", "id": "b", "payload": {"query": query}}))
        answer = await receive(socket)
        assert answer["id"] == "b", answer
        assert "cordonned" in json.dumps(answer), answer
    finally:
        await socket.close()


async def test_the_service_logs_one_info_line_per_malformed_message_and_no_traceback(
    service: LoggedService,
) -> None:
    before = len(service.log_lines())
    for message in ([1], "x", {"type": "subscribe", "id": 1}, {"type": "nope"}):
        socket = await connect(service)
        await socket.send(json.dumps(message))
        await closed_with(socket)
    socket = await connect(service)
    await socket.send(json.dumps({"type": "subscribe", "id": "z", "payload": {"q": 1}}))
    assert (await receive(socket))["type"] == "error"
    await socket.close()
    # The service writes its log lines after answering: wait for the fifth
    # refusal to reach the file (a fixed pause was too short under load).
    deadline = time.monotonic() + 60
    while True:
        lines = service.log_lines()
        if sum("refused a websocket message" in line for line in lines[before:]) >= 5:
            break
        assert time.monotonic() < deadline, lines[before:]
        await asyncio.sleep(0.05)
    assert not [line for line in lines if "Traceback" in line], service.log.read_text()
    refusals = [line for line in lines[before:] if "refused a websocket message" in line]
    assert len(refusals) == 5, lines[before:]
    assert all(" INFO " in line and "BAD_REQUEST" in line for line in refusals), refusals


@pytest.mark.parametrize(
    ("query", "variables", "code", "phrase"),
    [
        (
            "subscription A { events { id } } subscription B { events { kind } }",
            None,
            "BAD_REQUEST",
            "Must provide operation name if query contains multiple operations.",
        ),
        (
            "subscription($n: ID) { events(nodeId: $n) { id } }",
            {"n": "gpu-01\x00"},
            "BAD_INPUT",
            "nodeId='gpu-01\\x00': contains a NUL character",
        ),
        (
            'subscription { events(nodeId: "gpu-01\\ud800") { id } }',
            None,
            "BAD_INPUT",
            "nodeId='gpu-01\\ud800': contains a lone surrogate",
        ),
    ],
    ids=["several operations, no name", "NUL variable", "surrogate literal"],
)
async def test_a_subscribe_refused_before_it_runs_gets_its_error_and_no_traceback(
    service: LoggedService, query: str, variables: Any, code: str, phrase: str
) -> None:
    """Issue 44: two operations without operationName ran the first one, and a document that
    did not parse ended the operation with a traceback in the log and no word why."""
    before = len(service.log_lines())
    socket = await connect(service)
    try:
        payload: dict[str, Any] = {"query": query}
        if variables is not None:
            payload["variables"] = variables
        await socket.send(json.dumps({"type": "subscribe", "id": "q", "payload": payload}))
        answer = await receive(socket)
        assert answer["type"] == "error" and answer["id"] == "q", answer
        [error] = answer["payload"]
        assert error["extensions"]["code"] == code, error
        assert phrase in error["message"], error
        await socket.send(json.dumps({"type": "ping"}))
        assert (await receive(socket))["type"] == "pong"
    finally:
        await socket.close()
    await asyncio.sleep(0.2)  # the log line of the refusal, if any traceback came with it
    assert not [line for line in service.log_lines()[before:] if "Traceback" in line]


async def test_a_subscribe_that_does_not_parse_closes_the_socket_saying_why_without_a_traceback(
    service: LoggedService,
) -> None:
    """graphql-transport-ws as Strawberry speaks it: a document that does not parse closes the
    socket with 4400 and the parser's words (before issue 44: a traceback and a bare `complete`)."""
    before = len(service.log_lines())
    socket = await connect(service)
    payload = {"query": "subscription { events { id } "}
    await socket.send(json.dumps({"type": "subscribe", "id": "s", "payload": payload}))
    code, reason = await closed_with(socket)
    assert (code, reason) == (4400, "Syntax Error: Expected Name, found <EOF>.")
    await asyncio.sleep(0.2)
    assert not [line for line in service.log_lines()[before:] if "Traceback" in line]
