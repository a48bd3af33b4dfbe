"""OpenTelemetry spans the service exports, collected in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.web.app import create_app
from service.web.tracing import Tracing, with_exporter
from tests.support.reports import REGISTER, node_input


@dataclass
class Traced:
    client: httpx.AsyncClient
    spans: InMemorySpanExporter
    tracing: Tracing

    def finished(self) -> tuple[ReadableSpan, ...]:
        return tuple(self.spans.get_finished_spans())

    def operation(self, name: str) -> ReadableSpan:
        found = [s for s in self.finished() if s.kind == SpanKind.SERVER and s.name == name]
        assert len(found) == 1, [s.name for s in self.finished() if s.kind == SpanKind.SERVER]
        return found[0]

    def statements_under(self, span: ReadableSpan) -> list[ReadableSpan]:
        """The statements whose parent is `span`, in the order they ended."""
        return [
            s
            for s in self.finished()
            if s.kind == SpanKind.CLIENT
            and s.parent is not None
            and s.parent.span_id == span.context.span_id
        ]


@pytest.fixture(params=[True, False], ids=["fast path", "strawberry view"])
async def traced(
    request: pytest.FixtureRequest, engine: AsyncEngine, settings: Settings
) -> AsyncIterator[Traced]:
    exporter = InMemorySpanExporter()
    tracing = with_exporter(exporter)
    app = create_app(settings.replace(fast_path=request.param), engine=engine, tracing=tracing)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
            response = await client.post(
                "/graphql", json={"query": REGISTER, "variables": {"input": node_input("gpu-01")}}
            )
            assert not response.json().get("errors"), response.text
            exporter.clear()
            yield Traced(client, exporter, tracing)
    finally:
        # asyncpg is instrumented process-wide: later tests run unwrapped.
        tracing.close()
