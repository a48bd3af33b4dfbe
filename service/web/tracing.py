"""OpenTelemetry traces: a span per GraphQL operation, the database statements as its children.

Off by default, and then nothing of OpenTelemetry is imported and no request
pays anything: the app is built without the traced endpoint below, and asyncpg
is not instrumented. On with the standard variables: `OTEL_TRACES_EXPORTER=otlp`
(or `console`, to read spans on stderr), or an OTLP endpoint
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); the
exporter reads the rest of its OTEL_EXPORTER_OTLP_* variables itself, the
resource OTEL_SERVICE_NAME (default llmgw-inventory) and
OTEL_RESOURCE_ATTRIBUTES. OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none
keeps it off. A setting that cannot work (an exporter or protocol this
installation does not have, a malformed endpoint or sampler, the `tracing`
extra not installed) is one warning naming the variable, and the service runs
without traces: a typo in a telemetry variable must not stop the inventory.

What a trace holds:

- one SERVER span per GraphQL request on /graphql, whichever route answers it
  (the fast path's compiled routes, graphql-core, Strawberry's view; the span
  wraps the endpoint, service/web/graphql_endpoint.py, so the token check's
  statements are in it too). Its name is the operation's type and name, e.g.
  `mutation place` (the root fields when the operation has no name);
  attributes: graphql.operation.type, graphql.operation.name,
  llmgw.graphql.root_fields, llmgw.graphql.outcome (ok, errors, refused,
  unavailable, internal_error), llmgw.graphql.error_codes,
  llmgw.graphql.result_types (a union's member: `place` answered Allocated,
  Unplaceable or AllocationRejected), the HTTP status and the request id. Its parent is the caller's span when the request carries a
  W3C `traceparent` header.
- a CLIENT span per statement, from OpenTelemetry's asyncpg instrumentation:
  every statement of both pools (writes run on asyncpg's own pool,
  service/database/connections.py; SQLAlchemy's run on asyncpg too), BEGIN and
  COMMIT included, with db.statement (the SQL, never its parameters).
  Concurrent `place` calls share a transaction (place_batches.py): its
  statements are children of the call that started the batch.

Statements outside any request (the liveness sweep, the event stream's LISTEN)
would each be a trace of one span every few seconds: the sampler keeps root
spans only for requests (RequestsOnly), and OTEL_TRACES_SAMPLER decides among
those.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from service.web.exchange import Exchange
from service.web.http_guards import Message, Receive, Scope

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

    from service.web.graphql_endpoint import GraphQLEndpoint

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "llmgw-inventory"
SAMPLERS = {
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
}
RATIO_SAMPLERS = {"traceidratio", "parentbased_traceidratio"}
PROTOCOLS = {"http/protobuf", "grpc"}


class TracingSetting(ValueError):
    """An OTEL_* setting that cannot work here; the message names the variable and the value."""


@dataclass
class Tracing:
    """The process's tracer, its provider, and what to undo when the app stops."""

    tracer: Tracer
    provider: TracerProvider
    _instrumented: Any = None

    def instrument_database(self) -> None:
        """Every asyncpg statement a span (the library wraps asyncpg's classes, process-wide)."""
        from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

        instrumentor = AsyncPGInstrumentor()  # type: ignore[no-untyped-call]
        instrumentor.instrument(tracer_provider=self.provider)
        self._instrumented = instrumentor

    def close(self) -> None:
        """Unwrap asyncpg and flush what is still queued for the exporter."""
        if self._instrumented is not None:
            self._instrumented.uninstrument()
            self._instrumented = None
        self.provider.shutdown()


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces (the standard variables; off by default)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def from_environment(env: Mapping[str, str] | None = None) -> Tracing | None:
    """The process's Tracing as the OTEL_* variables ask, or None: off, or one warning why not."""
    env = os.environ if env is None else env
    if not wanted(env):
        return None
    try:
        exporter = _exporter(env)
        sampler = _sampler(env)
    except TracingSetting as problem:
        log.warning("OpenTelemetry traces are off: %s", problem)
        return None
    tracing = _tracing(exporter, sampler, env, batch=True)
    log.info(
        "OpenTelemetry traces on: a span per GraphQL operation, its statements as children (%s)",
        type(exporter).__name__,
    )
    return tracing


def with_exporter(exporter: SpanExporter) -> Tracing:
    """Tracing that hands each span to `exporter` as it ends (tests: an in-memory exporter)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    return _tracing(exporter, ALWAYS_ON, {}, batch=False)


def _tracing(exporter: SpanExporter, sampler: Any, env: Mapping[str, str], batch: bool) -> Tracing:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased

    name = env.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    resource = Resource.create({"service.name": name})
    provider = TracerProvider(resource=resource, sampler=ParentBased(root=_requests_only(sampler)))
    provider.add_span_processor(
        BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    )
    return Tracing(provider.get_tracer("llmgw-inventory"), provider)


def _requests_only(base: Any) -> Any:
    """A root sampler that starts traces only at requests (SERVER spans), deciding those by `base`."""
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
    from opentelemetry.trace import SpanKind

    class RequestsOnly(Sampler):
        def should_sample(self, parent_context: Any, trace_id: int, name: str,
                          kind: SpanKind | None = None, attributes: Any = None,
                          links: Any = None, trace_state: Any = None) -> SamplingResult:  # fmt: skip
            if kind != SpanKind.SERVER:
                return SamplingResult(Decision.DROP)
            result: SamplingResult = base.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )
            return result

        def get_description(self) -> str:
            return f"RequestsOnly{{{base.get_description()}}}"

    return RequestsOnly()


def _exporter(env: Mapping[str, str]) -> SpanExporter:
    kind = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if kind not in {"otlp", "console"}:
        raise TracingSetting(f"OTEL_TRACES_EXPORTER={kind!r}: expected otlp, console or none")
    try:
        # The statements' spans too: traces without them would not answer why a place is slow.
        import opentelemetry.instrumentation.asyncpg  # noqa: F401
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
    except ImportError:
        raise TracingSetting(
            "OpenTelemetry is not installed: pip install 'llmgw-inventory[tracing]'"
        ) from None
    if kind == "console":
        return ConsoleSpanExporter()
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        url = env.get(name)
        if url and (urlsplit(url).scheme not in {"http", "https"} or not urlsplit(url).netloc):
            raise TracingSetting(f"{name}={url!r}: expected an http:// or https:// URL")
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol not in PROTOCOLS:
        raise TracingSetting(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: expected http/protobuf or grpc"
        )
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            grpc: SpanExporter = GrpcExporter()
            return grpc
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    except ImportError:
        package = "opentelemetry-exporter-otlp-proto-" + ("grpc" if protocol == "grpc" else "http")
        raise TracingSetting(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} needs {package}, which is not installed"
        ) from None
    except (ValueError, TypeError) as error:
        # The exporter reads its own variables (timeout, headers, compression).
        raise TracingSetting(
            f"the OTLP exporter refused its OTEL_EXPORTER_OTLP_* settings: {error}"
        ) from None


def _sampler(env: Mapping[str, str]) -> Any:
    from opentelemetry.sdk.trace import sampling

    name = (env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
    if name not in SAMPLERS:
        raise TracingSetting(
            f"OTEL_TRACES_SAMPLER={name!r}: expected one of {', '.join(sorted(SAMPLERS))}"
        )
    ratio = 1.0
    if name in RATIO_SAMPLERS and (raw := env.get("OTEL_TRACES_SAMPLER_ARG")) is not None:
        try:
            ratio = float(raw)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TracingSetting(f"OTEL_TRACES_SAMPLER_ARG={raw!r}: expected a number from 0 to 1")
    made: dict[str, Callable[[], Any]] = {
        "always_on": lambda: sampling.ALWAYS_ON,
        "always_off": lambda: sampling.ALWAYS_OFF,
        "traceidratio": lambda: sampling.TraceIdRatioBased(ratio),
        "parentbased_always_on": lambda: sampling.ALWAYS_ON,
        "parentbased_always_off": lambda: sampling.ALWAYS_OFF,
        "parentbased_traceidratio": lambda: sampling.TraceIdRatioBased(ratio),
    }
    # The provider's sampler is ParentBased already: a caller's sampled flag is followed.
    return made[name]()


# ---- the operation span ----


@dataclass(frozen=True)
class Operation:
    """What the span says about a request's GraphQL operation."""

    kind: str  # query, mutation, subscription; "graphql" when the document says nothing
    name: str | None  # the operation's own name, when it has one
    root_fields: tuple[str, ...]

    @property
    def span_name(self) -> str:
        return f"{self.kind} {self.name or ','.join(self.root_fields)}".strip()


UNKNOWN = Operation("graphql", None, ())


# Documents up to this size are described once each (schedulers and agents send
# the same few); a larger one (a report written inline) is parsed every time,
# so the cache holds at most 256 of these.
CACHED_DOCUMENT_CHARS = 16 * 1024


def describe(query: str, operation_name: str | None) -> Operation:
    """The operation a request names, from its document."""
    if len(query) <= CACHED_DOCUMENT_CHARS:
        return _described(query, operation_name)
    return _describe(query, operation_name)


@lru_cache(maxsize=256)
def _described(query: str, operation_name: str | None) -> Operation:
    return _describe(query, operation_name)


def _describe(query: str, operation_name: str | None) -> Operation:
    from graphql import GraphQLError, OperationDefinitionNode, get_operation_ast, parse

    try:
        operation = get_operation_ast(parse(query), operation_name)
    except GraphQLError:
        return UNKNOWN
    if not isinstance(operation, OperationDefinitionNode):
        return UNKNOWN
    fields = tuple(s.name.value for s in operation.selection_set.selections if hasattr(s, "name"))
    name = operation.name.value if operation.name else None
    return Operation(operation.operation.value, name, fields)


def _request_operation(scope: Scope, body: bytes) -> Operation:
    try:
        if scope.get("method") == "GET":
            params = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            query, name = params.get("query", [""])[0], params.get("operationName", [None])[0]
        else:
            request = json.loads(body)
            query, name = request.get("query"), request.get("operationName")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return UNKNOWN
    if not isinstance(query, str) or not (name is None or isinstance(name, str)):
        return UNKNOWN
    return describe(query, name)


# Answers up to this size are read for their result types (place's Allocated,
# Unplaceable, AllocationRejected); larger ones are pages of nodes, only
# searched for errors.
RESULT_TYPES_WITHIN = 64 * 1024


@dataclass(frozen=True)
class Answer:
    """What the span says about the answer: its GraphQL errors' codes, its root results' types."""

    codes: tuple[str, ...] = ()
    result_types: tuple[str, ...] = ()


def read_answer(body: bytes) -> Answer:
    has_errors = b'"errors"' in body
    if not has_errors and (len(body) > RESULT_TYPES_WITHIN or b'"__typename"' not in body):
        return Answer()  # most answers: no parse
    try:
        answer = json.loads(body)
    except ValueError:
        return Answer()
    if not isinstance(answer, dict):
        return Answer()
    errors = answer.get("errors") if has_errors else None
    codes = tuple(
        str((e.get("extensions") or {}).get("code") or "ERROR")
        for e in (errors if isinstance(errors, list) else ())
        if isinstance(e, dict)
    )
    data = answer.get("data")
    types = tuple(
        str(value["__typename"])
        for value in (data.values() if isinstance(data, dict) else ())
        if isinstance(value, dict) and "__typename" in value
    )
    return Answer(codes, types)


def outcome(status: int, codes: Sequence[str] | None) -> str:
    """ok, errors, refused (a 4xx), unavailable (503) or internal_error."""
    if status == 503 or (codes and "DATABASE_UNAVAILABLE" in codes):
        return "unavailable"
    if status >= 500 or (codes and "INTERNAL_ERROR" in codes):
        return "internal_error"
    if status >= 400:
        return "refused"
    return "errors" if codes else "ok"


class RecordingExchange(Exchange):
    """An Exchange that can keep the answer's body, for the span's outcome (traced apps only).

    It keeps nothing until TracedEndpoint asks (`body = []`): the dashboard's
    scripts and /metrics pass through it too, and are not worth holding.
    """

    __slots__ = ("body",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.body: list[bytes] | None = None

    async def __call__(self, message: Message) -> None:
        if self.body is not None and message["type"] == "http.response.body":
            self.body.append(message.get("body", b""))
        await super().__call__(message)

    async def answer(self, status: int, body: bytes, *args: Any, **kwargs: Any) -> None:
        if self.body is not None:
            self.body.append(body)
        await super().answer(status, body, *args, **kwargs)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}


class TracedEndpoint:
    """The GraphQL endpoint inside an operation span whose parent is the caller's `traceparent`."""

    def __init__(self, endpoint: GraphQLEndpoint, tracing: Tracing) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.endpoint = endpoint
        self.tracer = tracing.tracer
        self.propagator = TraceContextTextMapPropagator()

    async def __call__(self, scope: Scope, receive: Receive, exchange: Exchange) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        body: list[bytes] = []

        async def recording() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.append(message.get("body", b""))
            return message

        if isinstance(exchange, RecordingExchange):
            exchange.body = []
        parent = self.propagator.extract(_headers(scope))
        with self.tracer.start_as_current_span(
            "graphql", context=parent, kind=SpanKind.SERVER, record_exception=True
        ) as span:
            try:
                await self.endpoint(scope, recording, exchange)
            finally:
                operation = _request_operation(scope, b"".join(body))
                answer = read_answer(b"".join(getattr(exchange, "body", None) or ()))
                result = outcome(exchange.status, answer.codes)
                span.update_name(operation.span_name)
                span.set_attributes(_attributes(scope, operation, exchange.status, result, answer))
                if result == "internal_error":
                    span.set_status(Status(StatusCode.ERROR, "internal error"))


def _attributes(
    scope: Scope, operation: Operation, status: int, result: str, answer: Answer
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "graphql.operation.type": operation.kind,
        "llmgw.graphql.root_fields": list(operation.root_fields),
        "llmgw.graphql.outcome": result,
        "http.request.method": scope.get("method", ""),
        "http.response.status_code": status,
        "url.path": scope.get("path", ""),
        "llmgw.request_id": (scope.get("state") or {}).get("request_id", ""),
    }
    if operation.name:
        attributes["graphql.operation.name"] = operation.name
    if answer.codes:
        attributes["llmgw.graphql.error_codes"] = sorted(set(answer.codes))
    if answer.result_types:
        attributes["llmgw.graphql.result_types"] = list(answer.result_types)
    return attributes
