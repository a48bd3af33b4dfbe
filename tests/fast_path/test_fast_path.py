"""The fast path's front door: one switch, counted routes, no second write, no quiet fallback.

Each story sends requests to two apps on one database (the `both` fixture):
the fast path on (the default) and INVENTORY_FAST_PATH=false, the
reference (Strawberry's view alone).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import strawberry
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from strawberry.extensions import QueryDepthLimiter, SchemaExtension
from strawberry.types.arguments import InputContext

from service.config import Settings
from service.fleet import heartbeats, node_reads
from service.graphql import types as graphql_types
from service.graphql.context import Context
from service.graphql.fast import execution, front_door, json_pages
from service.graphql.fast.compiled_heartbeat import BEAT_FIELDS
from service.graphql.fast.extensions import read_extensions
from service.graphql.fast.fields import plain_fields, record_attributes
from service.graphql.fast.input_conversion import compiled_input
from service.graphql.schema import LIMIT_RULES, MAX_TOKENS, schema
from service.graphql.types import Node
from service.metrics import COUNTERS
from service.web import app as app_module
from tests.support.direct_execution import AGENT_HEARTBEAT, OPERATIONS, PAGE, same_answer
from tests.support.module_imports import SERVICE, _module_imports
from tests.support.reports import A100, PLACE, REGISTER, gpus, node_input

AGENT_HEARTBEAT_PINS = (OPERATIONS / "heartbeat_pins.graphql").read_text()


Counts = dict[tuple[str, str, str], int]


def fast_path() -> Counts:
    return COUNTERS.snapshot()[2]


def since(before: Counts) -> Counts:
    """The fast path's counts since `before`, without the zeros."""
    now = fast_path()
    return {k: n - before.get(k, 0) for k, n in now.items() if n - before.get(k, 0)}


@pytest.fixture
def completed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per selection the plain-field completion answered at once (execution.py)."""
    calls: list[int] = []
    plain = execution._complete_fields

    def counting(*args: Any) -> Any:
        calls.append(1)
        return plain(*args)

    monkeypatch.setattr(execution, "_complete_fields", counting)
    return calls


async def test_switched_off_every_request_is_strawberrys_and_the_fast_path_counts_nothing(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient], completed: list[int]
) -> None:
    _fast, reference = both
    before = fast_path()
    for body in (
        {"query": REGISTER, "variables": {"input": node_input("gpu-01", gpus=gpus(A100, 2))}},
        {"query": AGENT_HEARTBEAT, "variables": {"nodeId": "gpu-01"}},
        {"query": PAGE, "variables": {"first": 10, "withGpus": True}},
        {"query": "{ nodes { id labels { key } } }"},
        {"query": "{ nodes { noSuchField } }"},
    ):
        response = await reference.post("/graphql", json=body)
        assert response.status_code == 200
    assert since(before) == {}
    # Not even beneath Strawberry's view: plain fields completed the stock way.
    assert completed == []


async def test_switched_on_plain_fields_are_completed_by_the_fast_path(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient], completed: list[int]
) -> None:
    """The counterpart of the story above: the same spy does see the fast path when it is on."""
    fast, _reference = both
    await fast.post("/graphql", json={"query": REGISTER, "variables": {"input": node_input("n1")}})
    # A fragment: the compiled page declines it, so graphql-core executes it.
    query = "{ nodes { id ... on Node { labels { key } } } }"
    await fast.post("/graphql", json={"query": query})
    assert completed


def test_switched_off_input_objects_are_built_by_strawberrys_own_conversion(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.graphql.context import new_context

    @compiled_input
    @strawberry.input
    class Label:
        key: str
        value: str = "none"

    converted: list[object] = []
    convert = InputContext.convert

    def spy(self: InputContext, value: object, type_: Any, *keys: str | int) -> object:
        converted.append(keys)
        return convert(self, value, type_, *keys)

    monkeypatch.setattr(InputContext, "convert", spy)
    definition = Label.__strawberry_definition__  # type: ignore[attr-defined]
    built = {}
    for on in (True, False):
        context = new_context(engine, Settings(fast_path=on))
        info: Any = type("FakeInfo", (), {"context": context})()
        input_context = InputContext(
            info=info,
            config=schema.config,
            scalar_registry=schema.schema_converter.scalar_registry,
            path=(),
        )
        converted.clear()
        built[on] = definition.from_input(Label, {"key": "zone"}, input_context)
        assert bool(converted) is (not on)
    assert built[True] == built[False] == Label(key="zone", value="none")


async def test_an_unknown_node_beats_once_and_is_told_so_as_graphql_core_words_it(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    beats = _count_beats(monkeypatch, heartbeats.beat)
    before = fast_path()
    unknown = await same_answer(both, {"query": AGENT_HEARTBEAT, "variables": {"nodeId": "nope"}})
    assert unknown["errors"][0]["extensions"]["code"] == "NODE_NOT_FOUND"
    # One beat per app: the compiled heartbeat's, handed to graphql-core's resolver.
    assert beats == ["nope", "nope"]
    assert since(before) == {
        ("heartbeat", "declined", "beat_failed"): 1,
        ("graphql_core", "answered", ""): 1,
    }


async def test_a_heartbeat_its_route_answers_makes_no_graphql_context(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route reads the caller and the engine from its FastRequest; the Context waits.

    Making a Context for every beat was about a tenth of a beat's CPU under
    load (fast_request.py). A beat the route declines after its write makes
    one, once: graphql-core's resolver takes the write's outcome from it.
    """
    fast = both[0]
    await fast.post(
        "/graphql", json={"query": REGISTER, "variables": {"input": node_input("gpu-01")}}
    )
    made: list[str] = []
    real = app_module.new_context

    def counting(*args: Any, **kwargs: Any) -> Context:
        made.append(kwargs["request_id"])
        return real(*args, **kwargs)

    monkeypatch.setattr(app_module, "new_context", counting)
    before = fast_path()
    known = await same_answer(both, {"query": AGENT_HEARTBEAT, "variables": {"nodeId": "gpu-01"}})
    assert known["data"]["heartbeat"]["id"] == "gpu-01"
    assert since(before) == {("heartbeat", "answered", ""): 1}
    assert len(made) == 1  # the reference's, Strawberry's view

    made.clear()
    unknown = await fast.post(
        "/graphql", json={"query": AGENT_HEARTBEAT, "variables": {"nodeId": "nope"}}
    )
    assert unknown.json()["errors"][0]["extensions"]["code"] == "NODE_NOT_FOUND"
    assert made == [unknown.headers["x-request-id"]]


async def test_a_beat_that_wrote_then_failed_is_not_beaten_again(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    engine: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await same_answer(both, {"query": REGISTER, "variables": {"input": node_input("gpu-01")}})
    real = heartbeats.beat

    async def beat_then_fail(engine: AsyncEngine, node_id: str) -> Any:
        await real(engine, node_id)
        raise RuntimeError("failed after the write")

    beats = _count_beats(monkeypatch, beat_then_fail)
    failed = await same_answer(both, {"query": AGENT_HEARTBEAT, "variables": {"nodeId": "gpu-01"}})
    assert failed["errors"][0]["extensions"]["code"] == "INTERNAL_ERROR"
    assert beats == ["gpu-01", "gpu-01"]  # one write per app, none repeated


async def test_a_beat_whose_answer_graphql_core_must_word_is_not_beaten_again(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    await same_answer(both, {"query": REGISTER, "variables": {"input": node_input("gpu-01")}})
    # A value Boolean cannot represent: graphql-core's error to word, after the
    # beat. As Node.of and the compiled route read the field (Node.read).
    monkeypatch.setitem(graphql_types._NODE_FIELDS, "schedulable", lambda record: "yes")
    beats = _count_beats(monkeypatch, heartbeats.beat)
    before = fast_path()
    answer = await same_answer(
        both,
        {
            "query": "mutation B($id: ID!) { heartbeat(nodeId: $id) { id schedulable } }",
            "variables": {"id": "gpu-01"},
        },
    )
    assert "Boolean cannot represent" in answer["errors"][0]["message"]
    assert beats == ["gpu-01", "gpu-01"]  # one beat per app
    assert since(before) == {
        ("heartbeat", "declined", "leaf_not_serializable"): 1,
        ("graphql_core", "answered", ""): 1,
    }


def _count_beats(
    monkeypatch: pytest.MonkeyPatch, beat: Callable[[AsyncEngine, str], Awaitable[Any]]
) -> list[str]:
    beats: list[str] = []

    async def counted(engine: AsyncEngine, node_id: str) -> Any:
        beats.append(node_id)
        return await beat(engine, node_id)

    monkeypatch.setattr(heartbeats, "beat", counted)
    return beats


async def test_what_the_front_door_declines_is_counted_with_its_reason(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    fast, _reference = both
    before = fast_path()
    await fast.post("/graphql", json={"query": "{ nodes { noSuchField } }"})
    # (A batch is refused before the front door now: service/web/graphql_http.py.)
    await fast.post("/graphql", json={"query": "{ nodes { id } }", "extensions": {}})
    await fast.get("/graphql", params={"query": "{ nodes { id } }"})
    await fast.post(
        "/graphql", json={"query": "subscription { events { kind } }"}
    )  # refused by Strawberry's view
    assert since(before) == {
        ("front_door", "declined", "document_not_valid"): 1,
        ("front_door", "declined", "body_not_ordinary"): 1,
        ("front_door", "declined", "not_a_json_post"): 1,
        ("front_door", "declined", "subscription"): 1,
    }
    metrics = (await fast.get("/metrics")).text
    assert (
        'inventory_fast_path_requests_total{route="front_door",outcome="declined",'
        'reason="document_not_valid"}'
    ) in metrics


async def test_a_bug_in_a_route_is_logged_counted_and_answered_as_an_internal_error(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fast, _reference = both
    await fast.post("/graphql", json={"query": REGISTER, "variables": {"input": node_input("n1")}})

    async def broken(*args: Any, **kwargs: Any) -> str:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(json_pages.NodePage, "fetch", broken)
    before = fast_path()
    with caplog.at_level(logging.ERROR, logger=front_door.__name__):
        body = (await fast.post("/graphql", json={"query": "{ nodes { id } }"})).json()
    assert body["data"] is None
    assert body["errors"][0]["extensions"]["code"] == "INTERNAL_ERROR"
    # Not quietly answered by graphql-core instead: counted as a bug, with its traceback.
    assert since(before) == {("page", "declined", "bug"): 1}
    (record,) = [r for r in caplog.records if r.name == front_door.__name__]
    assert record.exc_info is not None and record.exc_info[0] is ZeroDivisionError
    assert body["errors"][0]["extensions"]["requestId"] in record.getMessage()


def test_the_fast_path_honours_the_schemas_own_extensions() -> None:
    extensions = read_extensions(schema)
    assert extensions.rules == LIMIT_RULES
    assert extensions.max_tokens == MAX_TOKENS
    assert extensions.not_honoured == ()


class Tracing(SchemaExtension):
    def on_execute(self) -> Any:
        yield


async def test_an_extension_the_fast_path_cannot_honour_sends_every_request_to_strawberry() -> None:
    traced = strawberry.Schema(
        query=schema.query,  # type: ignore[arg-type]
        mutation=schema.mutation,  # type: ignore[arg-type]
        config=schema.config,
        extensions=[*schema.extensions, lambda: QueryDepthLimiter(max_depth=3), Tracing],
    )
    extensions = read_extensions(traced)
    assert extensions.not_honoured == ("Tracing",)
    assert len(extensions.rules) == len(LIMIT_RULES) + 1

    door = front_door.FrontDoor(traced, lambda: None, Settings())  # type: ignore[arg-type,return-value]
    before = fast_path()
    answer = await door.answer({"query": "{ nodes { id } }"}, True, None, lambda: None)  # type: ignore[arg-type,return-value]
    assert answer is None  # Strawberry's view answers
    assert since(before) == {("front_door", "declined", "extension_not_honoured"): 1}


@pytest.mark.parametrize("state", ["cordon", "unreachable", "ready"])
async def test_the_fields_a_beat_answers_read_the_same_from_the_beat_as_from_the_node(
    api: Any, engine: AsyncEngine, state: str
) -> None:
    """compiled_heartbeat.BEAT_FIELDS: the compiled heartbeat answers them from a BeatRecord.

    Each of their readers (Node.read, as Node.of reads them) gives the
    same value from what the beat returned as from the node read after it:
    a reader that starts to need a column the beat does not return fails here.
    """
    await api(REGISTER, {"input": node_input("gpu-01")})
    if state == "cordon":
        await api('mutation { cordonNode(id: "gpu-01", reason: "burn-in") { id } }')
    elif state == "unreachable":
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE nodes SET liveness = 'unreachable', liveness_reason = 'no heartbeat'"
                    " WHERE id = 'gpu-01'"
                )
            )
    # An unreachable node's beat brings it back (node_writes.heartbeat_many's statement).
    beat = await heartbeats.beat(engine, "gpu-01")
    async with engine.connect() as conn:
        record = await node_reads.get_node(conn, "gpu-01")
    assert record is not None
    for name in BEAT_FIELDS:
        read = Node.read(name)
        assert read is not None, name
        assert read(beat) == read(record), name
    assert (beat.state, beat.state_reason) == {
        "cordon": ("cordoned", "burn-in"),
        "unreachable": ("ready", None),
        "ready": ("ready", None),
    }[state]


async def test_a_pages_fields_are_the_records_attributes_named_by_the_strawberry_types(
    api: Any, engine: AsyncEngine
) -> None:
    await api(
        REGISTER,
        {"input": node_input("gpu-01", labels=[{"key": "zone", "value": "a"}], gpus=gpus(A100, 1))},
    )
    await api('mutation { cordonNode(id: "gpu-01", reason: "burn-in") { id } }')
    async with engine.connect() as conn:
        record = await node_reads.get_node(conn, "gpu-01")
    assert record is not None
    node = Node.of(record)
    attributes = record_attributes(schema, "Node")
    plain = plain_fields(schema, "Node")
    assert attributes["stateChangedBy"] == "state_actor"
    for name, field in plain.items():
        # Node.of copies the record attribute the type names for the field.
        value = getattr(node, field.python_name)
        raw = getattr(record, attributes[name])
        assert _comparable(value) == _comparable(raw), name
    # The detail lists a page reads, named by the fast path's RECORD_ATTRIBUTES.
    assert {attributes[f] for f in ("gpus", "storage", "allocations", "fabrics", "weights")} <= {
        *json_pages._LISTS
    }
    assert set(record_attributes(schema, "NodeFreeGpus").values()) == {"gpu_indices", "node"}


def _comparable(value: Any) -> Any:
    if isinstance(value, list):  # KeyValue pairs
        return {kv.key: kv.value for kv in value}
    if hasattr(value, "free_bytes"):
        return (int(value.free_bytes), int(value.total_bytes))
    return getattr(value, "value", value)  # enums


def test_no_module_of_the_graphql_layer_imports_itself_in_a_circle() -> None:
    modules = {
        ".".join(p.relative_to(SERVICE.parent).with_suffix("").parts): p
        for p in (SERVICE / "graphql").rglob("*.py")
        if p.name != "__init__.py"
    }
    graph = {name: _module_imports(path) & modules.keys() for name, path in modules.items()}

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            current, trail = stack.pop()
            for nxt in graph[current]:
                if nxt == start:
                    return [*trail, nxt]
                if nxt not in trail:
                    stack.append((nxt, [*trail, nxt]))
        return None

    circles = [c for c in map(cycle_from, sorted(graph)) if c is not None]
    assert circles == []


async def test_one_compiled_heartbeat_answers_each_state_a_node_passes_through(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    # The compiled route keeps the written form of each state it has answered
    # (node_leaves._Leaf.written): a node cordoned, drained and uncordoned
    # between its beats must read each time as Strawberry alone says.
    await same_answer(both, {"query": REGISTER, "variables": {"input": node_input("gpu-01")}})
    beat = {
        "query": "mutation B($id: ID!) { heartbeat(nodeId: $id) { state stateReason schedulable } }",
        "variables": {"id": "gpu-01"},
    }
    seen = []
    for change in (
        None,
        # A reason the answer must escape: quotes, a backslash, non-ASCII.
        'mutation { cordonNode(id: "gpu-01", reason: "burn-in \\"r7\\" \\\\ ü") { id } }',
        'mutation { drainNode(id: "gpu-01", reason: "kernel update") { id } }',
        'mutation { uncordonNode(id: "gpu-01") { id } }',
    ):
        if change is not None:
            await same_answer(both, {"query": change})
        seen.append((await same_answer(both, beat))["data"]["heartbeat"])
    assert seen == [
        {"state": "READY", "stateReason": None, "schedulable": True},
        {"state": "CORDONED", "stateReason": 'burn-in "r7" \\ ü', "schedulable": False},
        {"state": "DRAINING", "stateReason": "kernel update", "schedulable": False},
        {"state": "READY", "stateReason": None, "schedulable": True},
    ]


async def test_a_heartbeat_asking_for_its_weights_pins_is_answered_by_the_compiled_route(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    """An agent with model_dirs asks for the pins in every beat (heartbeat_pins.graphql).

    Those beats stay on the compiled route, and read exactly what Strawberry's
    resolver reads: a replica placed after the node's last report pins its
    weights in the very next beat's answer, and its release unpins them.
    """
    fast = both[0]
    weights = [
        {"path": "/models/llama", "sizeBytes": 10, "state": "READY"},
        {"path": "/models/mistral", "sizeBytes": 10, "state": "DOWNLOADING", "totalBytes": 20},
    ]
    report = {"input": node_input("gpu-01", weights=weights)}
    await same_answer(both, {"query": REGISTER, "variables": report})
    beat = {"query": AGENT_HEARTBEAT_PINS, "variables": {"nodeId": "gpu-01"}}

    def pins(answer: Any) -> dict[str, list[str]]:
        return {w["path"]: w["pinnedBy"] for w in answer["data"]["heartbeat"]["weights"]}

    before = fast_path()
    assert pins(await same_answer(both, beat)) == {"/models/llama": [], "/models/mistral": []}
    placed = {
        "input": {
            "replicaId": "chat",
            "gpuClass": "H100-80GB",
            "gpusPerShard": 2,
            "weights": "/models/llama",
        }
    }
    answer = (await fast.post("/graphql", json={"query": PLACE, "variables": placed})).json()
    assert (answer["data"] or {}).get("place", {}).get("__typename") == "Allocated", answer
    assert pins(await same_answer(both, beat)) == {"/models/llama": ["chat"], "/models/mistral": []}
    release = 'mutation { releaseReplica(replicaId: "chat") }'
    assert (await fast.post("/graphql", json={"query": release})).json() == {
        "data": {"releaseReplica": 2}
    }
    assert pins(await same_answer(both, beat)) == {"/models/llama": [], "/models/mistral": []}
    assert since(before)[("heartbeat", "answered", "")] == 3

    # The leaves after the weights, or the weights under an alias: graphql-core's.
    for query in (
        'mutation { heartbeat(nodeId: "gpu-01") { weights { path pinnedBy } id } }',
        'mutation { heartbeat(nodeId: "gpu-01") { id w: weights { pinnedBy } } }',
        'mutation { heartbeat(nodeId: "gpu-01") { id weights { path sizeBytes } } }',
    ):
        before = fast_path()
        await same_answer(both, {"query": query})
        assert ("heartbeat", "answered", "") not in since(before)
