"""OpenTelemetry traces: a slow `place` followed from the scheduler's span into the service and its statements.

In-process tests read the spans from OpenTelemetry's in-memory exporter; the
end-to-end one runs `serve` with the standard OTEL_* variables pointing at a
collector on 127.0.0.1 and decodes what it receives (OTLP over HTTP, protobuf).
"""

from __future__ import annotations

import http.server
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy.ext.asyncio import AsyncEngine

from service.web.tracing import from_environment, wanted, with_exporter
from tests.support import REPO
from tests.support.live_service import free_port
from tests.support.reports import PLACE, REGISTER, node_input
from tests.support.traces import Traced

# The scheduler's span, as its own OpenTelemetry SDK would send it on (W3C trace context).
CALLER_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-01"

PLACE_INPUT = {"replicaId": "llama-r1", "gpuClass": "H100-80GB", "gpusPerShard": 8}


STATEMENT_KEYS = ("db.statement", "db.query.text")


def sql(span: ReadableSpan) -> str:
    attributes = span.attributes or {}
    return str(next((attributes[k] for k in STATEMENT_KEYS if attributes.get(k)), ""))


async def test_a_traced_place_is_one_span_with_its_statements_under_the_callers_trace(
    traced: Traced,
) -> None:
    response = await traced.client.post(
        "/graphql",
        json={"query": PLACE, "variables": {"input": PLACE_INPUT}},
        headers={"traceparent": TRACEPARENT},
    )
    assert response.json()["data"]["place"]["__typename"] == "Allocated", response.text

    place = traced.operation("mutation Place")
    assert place.context.trace_id == CALLER_TRACE
    assert place.parent is not None and place.parent.span_id == CALLER_SPAN
    assert place.attributes is not None
    assert place.attributes["graphql.operation.type"] == "mutation"
    assert place.attributes["graphql.operation.name"] == "Place"
    assert list(place.attributes["llmgw.graphql.root_fields"]) == ["place"]  # type: ignore[arg-type]
    assert place.attributes["llmgw.graphql.outcome"] == "ok"
    assert list(place.attributes["llmgw.graphql.result_types"]) == ["Allocated"]  # type: ignore[arg-type]
    assert place.attributes["http.response.status_code"] == 200

    statements = traced.statements_under(place)
    texts = [sql(s) for s in statements]
    # The transaction that holds the GPUs, statement by statement, in the caller's trace.
    assert any(t.startswith("BEGIN") for t in texts), texts
    assert any("allocated_gpus" in t for t in texts), texts
    assert all(s.context.trace_id == CALLER_TRACE for s in statements)
    # Nothing of the request escaped its span: every statement of this trace is under it.
    in_trace = [
        s
        for s in traced.finished()
        if s.kind == SpanKind.CLIENT and s.context.trace_id == CALLER_TRACE
    ]
    assert len(in_trace) == len(statements)


async def test_a_query_and_a_refused_request_are_spans_with_their_outcomes(
    traced: Traced,
) -> None:
    await traced.client.post("/graphql", json={"query": "{ nodes { id } }"})
    await traced.client.post("/graphql", json={"query": "query Page { nodes(first: 0) { id } }"})
    await traced.client.post(
        "/graphql",
        json={"query": PLACE, "variables": {"input": {**PLACE_INPUT, "gpusPerShard": 0}}},
    )
    await traced.client.post(
        "/graphql", content=b"{not json", headers={"content-type": "application/json"}
    )

    nodes = traced.operation("query nodes")
    assert nodes.parent is None  # no traceparent: the request starts its own trace
    assert nodes.attributes is not None and nodes.attributes["llmgw.graphql.outcome"] == "ok"
    assert any("FROM nodes" in sql(s) for s in traced.statements_under(nodes))

    page = traced.operation("query Page")
    assert page.attributes is not None
    assert page.attributes["llmgw.graphql.outcome"] == "errors"
    assert list(page.attributes["llmgw.graphql.error_codes"]) == ["BAD_INPUT"]  # type: ignore[arg-type]

    # A refusal place answers as its union's member, not as an error.
    rejected = traced.operation("mutation Place")
    assert rejected.attributes is not None
    assert rejected.attributes["llmgw.graphql.outcome"] == "ok"
    assert list(rejected.attributes["llmgw.graphql.result_types"]) == ["AllocationRejected"]  # type: ignore[arg-type]

    malformed = traced.operation("graphql")
    assert malformed.attributes is not None
    assert malformed.attributes["llmgw.graphql.outcome"] == "refused"
    assert malformed.attributes["http.response.status_code"] == 400


async def test_statements_outside_requests_start_no_trace(engine: AsyncEngine) -> None:
    from service.database import connections
    from service.fleet.node_writes import count_nodes

    exporter = InMemorySpanExporter()
    tracing = with_exporter(exporter)
    tracing.instrument_database()
    try:
        # As the liveness sweep reads, every few seconds, outside any request.
        async with connections.autocommit(engine) as conn:
            await count_nodes(conn)
    finally:
        tracing.close()
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin'"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'",
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "sometimes"}, "'sometimes'"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "traceidratio",
             "OTEL_TRACES_SAMPLER_ARG": "2"},
            "OTEL_TRACES_SAMPLER_ARG='2'",
        ),
    ],
)  # fmt: skip
def test_a_wrong_otel_setting_is_one_warning_and_no_traces(
    env: dict[str, str], named: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="service.web.tracing"):
        assert from_environment(env) is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and named in warnings[0], warnings
    assert warnings[0].startswith("OpenTelemetry traces are off:")


def test_without_the_tracing_extra_the_variables_are_one_warning_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # As if `pip install llmgw-inventory` had been run without [tracing].
    monkeypatch.setitem(sys.modules, "opentelemetry.instrumentation.asyncpg", None)
    with caplog.at_level(logging.WARNING, logger="service.web.tracing"):
        assert from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) is None
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "pip install 'llmgw-inventory[tracing]'" in warning


def test_traces_are_off_unless_the_standard_variables_ask() -> None:
    assert not wanted({})
    assert not wanted({"OTEL_SERVICE_NAME": "inventory-eu"})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not wanted({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"})
    assert not wanted({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"})


@pytest.mark.process
def test_with_traces_off_the_app_loads_nothing_of_opentelemetry() -> None:
    # In a fresh process: this one imported OpenTelemetry for the tests above.
    probe = (
        "import sys\n"
        "from service.config import Settings\n"
        "from service.web.app import create_app\n"
        "from service.web.tracing import from_environment\n"
        "app = create_app(Settings(), database_url='postgresql://nowhere/db',"
        " tracing=from_environment())\n"
        "assert type(app.graphql).__name__ == 'GraphQLEndpoint', type(app.graphql)\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---- end to end: serve, the standard variables, an OTLP collector on 127.0.0.1 ----


@dataclass
class Collector:
    url: str
    received: list[tuple[str, bytes]]


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector("", [])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            found.received.append((self.path, self.rfile.read(length)))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    found.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield found
    server.shutdown()
    server.server_close()


def serve(database_url: str, env: dict[str, str], log: Any) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full.update({"DATABASE_URL": database_url, "INVENTORY_SHUTDOWN_DRAIN": "0", **env})
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
        env=full, cwd=REPO, stderr=log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None and time.monotonic() < deadline, "serve did not start"
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)


@pytest.mark.process
def test_serve_exports_a_place_to_the_otlp_endpoint_the_variables_name(
    database_url: str, engine: AsyncEngine, collector: Collector, tmp_path: Any
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_SERVICE_NAME": "inventory-test"}
    with (tmp_path / "serve.log").open("wb") as log:
        process, url = serve(database_url, env, log)
        try:
            registered = httpx.post(
                f"{url}/graphql",
                json={"query": REGISTER, "variables": {"input": node_input("gpu-01")}},
            )
            assert not registered.json().get("errors"), registered.text
            placed = httpx.post(
                f"{url}/graphql",
                json={"query": PLACE, "variables": {"input": PLACE_INPUT}},
                headers={"traceparent": TRACEPARENT},
            )
            assert placed.json()["data"]["place"]["__typename"] == "Allocated"
        finally:
            # The spans are batched; stopping flushes them.
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)

    spans = []
    for path, body in collector.received:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            names = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            assert names["service.name"] == "inventory-test"
            spans.extend(s for scope in resource_spans.scope_spans for s in scope.spans)
    place = [s for s in spans if s.name == "mutation Place"]
    assert len(place) == 1, sorted({s.name for s in spans})
    assert place[0].trace_id == CALLER_TRACE.to_bytes(16, "big")
    assert place[0].parent_span_id == CALLER_SPAN.to_bytes(8, "big")
    children = [s for s in spans if s.parent_span_id == place[0].span_id]
    # One transaction, its statements in between. COMMIT travels in one message
    # with what must precede it (connections.py), so it is found by its SQL.
    texts = [
        next((a.value.string_value for a in s.attributes if a.key in STATEMENT_KEYS), "")
        for s in children
    ]
    assert any(t.startswith("BEGIN") for t in texts), texts
    assert any(t.rstrip().endswith("COMMIT") for t in texts), texts
    assert len(children) >= 3


@pytest.mark.process
def test_serve_with_a_wrong_otel_setting_warns_once_and_serves(
    database_url: str, engine: AsyncEngine, tmp_path: Any
) -> None:
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process, url = serve(database_url, {"OTEL_TRACES_EXPORTER": "zipkin"}, log)
        try:
            answer = httpx.post(f"{url}/graphql", json={"query": "{ nodes { id } }"})
            assert answer.json() == {"data": {"nodes": []}}
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    said = [line for line in log_path.read_text().splitlines() if "OpenTelemetry" in line]
    assert len(said) == 1 and "WARNING" in said[0], said
    assert "OTEL_TRACES_EXPORTER='zipkin': expected otlp, console or none" in said[0]
