"""The caller's OpenTelemetry trace context, passed on as `traceparent`.

The service starts each operation's span as a child of the caller's
`traceparent` header (docs/operations/monitoring.md), so a slow `place` can be
followed from the scheduler into PostgreSQL. OpenTelemetry is optional here:
without `opentelemetry-api` installed nothing is sent and nothing is imported;
with it, whatever the configured propagator writes (W3C traceparent and
tracestate by default) for the span current when the call is made.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import cache


@cache
def _injector() -> Callable[[dict[str, str]], None] | None:
    # Looked up once, on the first call: importing the client imports nothing of it.
    if importlib.util.find_spec("opentelemetry") is None:
        return None
    try:
        from opentelemetry import propagate
    except ImportError:  # a namespace package without the API (an exporter alone)
        return None
    return propagate.inject


def trace_headers() -> dict[str, str]:
    """The headers that carry the current trace context; empty without OpenTelemetry."""
    inject = _injector()
    if inject is None:
        return {}
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier
